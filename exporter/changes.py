"""Marking configuration changes: a counter and timestamp for Prometheus, and Grafana annotations.

A change is a new serving configuration or a new server start time, seen between two scrapes. The Grafana
annotation is posted from a background thread with exponential backoff, so an unreachable Grafana is logged
and retried but never blocks a scrape or stops the exporter.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TypedDict

import requests

from exporter.config import ServingConfig

log = logging.getLogger("batchscope.exporter")
RESTART_TOLERANCE_S = 1.0


class Annotation(TypedDict):
    """The body of Grafana's POST /api/annotations (an organization annotation)."""

    time: int  # Unix milliseconds
    tags: list[str]
    text: str


class GrafanaAnnotator:
    """Posts annotations to Grafana's HTTP API (POST /api/annotations), one background thread, retries."""

    def __init__(self, url: str, token: str | None = None, basic_auth: tuple[str, str] | None = None,
                 max_attempts: int = 8, first_backoff_s: float = 1.0, max_backoff_s: float = 60.0) -> None:
        self._url = url.rstrip("/") + "/api/annotations"
        self._session = requests.Session()
        if token:
            self._session.headers["Authorization"] = f"Bearer {token}"
        elif basic_auth:
            self._session.auth = basic_auth
        self._max_attempts = max_attempts
        self._first_backoff_s = first_backoff_s
        self._max_backoff_s = max_backoff_s
        self._queue: queue.Queue[Annotation] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="grafana-annotations", daemon=True)
        self._thread.start()

    def post(self, text: str, when_s: float, tags: list[str]) -> None:
        """Queue one annotation (returns at once)."""
        self._queue.put(Annotation(time=int(when_s * 1000), tags=tags, text=text))

    def _run(self) -> None:
        while True:
            body = self._queue.get()
            self._deliver(body)

    def _deliver(self, body: Annotation) -> None:
        delay = self._first_backoff_s
        for attempt in range(1, self._max_attempts + 1):
            try:
                reply = self._session.post(self._url, json=body, timeout=5)
                if reply.status_code < 300:
                    return
                problem = f"HTTP {reply.status_code}: {reply.text[:200]}"
            except requests.RequestException as exc:
                problem = str(exc)
            log.warning("grafana annotation attempt %d/%d failed: %s", attempt, self._max_attempts, problem)
            time.sleep(delay)  # this thread only delivers annotations: waiting here delays nothing else
            delay = min(delay * 2, self._max_backoff_s)
        log.error("grafana annotation dropped after %d attempts: %s", self._max_attempts, body["text"])


class ChangeTracker:
    """Compares each scrape's configuration and start time with the previous one."""

    def __init__(self, annotator: GrafanaAnnotator | None = None, clock: Callable[[], float] = time.time) -> None:
        self._annotator = annotator
        self._clock = clock
        self._last: tuple[ServingConfig, float | None] | None = None
        self.changes = 0
        self.last_change_s = 0.0

    def observe(self, config: ServingConfig, started_at: float | None) -> None:
        if self._last is None:
            self._last = (config, started_at)
            return
        before, started_before = self._last
        self._last = (config, started_at)
        lines = config.diff(before)
        restarted = (started_at is not None and started_before is not None
                     and abs(started_at - started_before) > RESTART_TOLERANCE_S)
        if not lines and not restarted:
            return
        self.changes += 1
        self.last_change_s = self._clock()
        text = "; ".join(lines) if lines else "vLLM restarted, configuration unchanged"
        log.info("configuration change: %s", text)
        if self._annotator is not None:
            self._annotator.post(text, self.last_change_s, ["batchscope", "config-change"])
