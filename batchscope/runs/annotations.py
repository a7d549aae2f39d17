"""Grafana annotations (POST /api/annotations), posted from one background thread with exponential backoff.

The one annotator of the project: the exporter marks each configuration change with a point, the tuner each run's
window with a region. An unreachable or refusing Grafana is logged and retried, never blocks a scrape or a run,
and of a Grafana's answer only the status and its first words are read, however long it is.
`close` gives the queue a bounded time to drain, so a command that ends (the tuner) does not drop its last one.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import NotRequired, TypedDict

import requests

POST_TIMEOUT_S = 5.0  # each socket operation; the answer is never read beyond its first SAID_BYTES
SAID_BYTES = 200


class Annotation(TypedDict):
    """The body of Grafana's POST /api/annotations (an organization annotation; a region when it has timeEnd)."""

    time: int  # Unix milliseconds
    timeEnd: NotRequired[int]  # noqa: N815 - Grafana's field name
    tags: list[str]
    text: str


class GrafanaAnnotator:
    """Posts annotations to Grafana's HTTP API on a background thread, retrying with exponential backoff."""

    def __init__(self, url: str, token: str | None = None, basic_auth: tuple[str, str] | None = None,
                 max_attempts: int = 8, first_backoff_s: float = 1.0, max_backoff_s: float = 60.0,
                 log: logging.Logger | None = None) -> None:
        self._url = url.rstrip("/") + "/api/annotations"
        self._session = requests.Session()
        if token:
            self._session.headers["Authorization"] = f"Bearer {token}"
        elif basic_auth:
            self._session.auth = basic_auth
        self._max_attempts = max_attempts
        self._first_backoff_s = first_backoff_s
        self._max_backoff_s = max_backoff_s
        self._log = log or logging.getLogger("batchscope.grafana")
        self._queue: queue.Queue[Annotation] = queue.Queue()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="grafana-annotations", daemon=True)
        self._thread.start()

    def post(self, text: str, when_s: float, tags: list[str], end_s: float | None = None) -> None:
        """Queue one annotation, a region up to ``end_s`` when given (returns at once)."""
        body = Annotation(time=int(when_s * 1000), tags=tags, text=text)
        if end_s is not None:
            body["timeEnd"] = int(end_s * 1000)
        self._queue.put(body)

    def close(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the queued annotations to be delivered (or dropped); False if some were
        still pending. Retries stop waiting at once: what is left after the deadline is lost, and logged."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)  # polling the queue's count: Queue.join has no timeout
        self._closing.set()
        left = self._queue.unfinished_tasks
        if left:
            self._log.error("grafana: %d annotation(s) not delivered within %g s", left, timeout_s)
        return not left

    def _run(self) -> None:
        while True:
            body = self._queue.get()
            try:
                self._deliver(body)
            finally:
                self._queue.task_done()

    def _deliver(self, body: Annotation) -> None:
        delay = self._first_backoff_s
        for attempt in range(1, self._max_attempts + 1):
            problem = self._attempt(body)
            if problem is None:
                return
            self._log.warning("grafana annotation attempt %d/%d failed: %s", attempt, self._max_attempts, problem)
            if self._closing.wait(delay):  # the backoff, cut short when the owner stops waiting
                break
            delay = min(delay * 2, self._max_backoff_s)
        self._log.error("grafana annotation dropped after %d attempts: %s", attempt, body["text"])

    def _attempt(self, body: Annotation) -> str | None:
        """One POST; None when Grafana took it, else why not (its answer read within a deadline and a cap)."""
        try:
            with self._session.post(self._url, json=body, timeout=POST_TIMEOUT_S, stream=True,
                                    allow_redirects=False) as reply:
                if reply.status_code < 300:
                    return None
                # its first words say why; the rest, however long, is left unread
                said = reply.raw.read1(SAID_BYTES, decode_content=True)[:SAID_BYTES]
                return f"HTTP {reply.status_code}: {said.decode(errors='replace')}"
        except requests.RequestException as exc:
            return str(exc)[:200]
