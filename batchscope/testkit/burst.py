"""Simultaneous streaming requests for admission tests: released at once, each answer read up to its first event.

    with Burst(url) as burst:
        answers = burst.send([body] * 8)     # all released together; answers fill in, streams stay open
        wait_until(lambda: sum(1 for a in answers if a and a.reason) == 5)

Closing the burst closes every stream still open: vLLM (and the simulator) abort those requests.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import requests

from batchscope.vllm import admission

READ_LIMIT_BYTES = 64 * 1024  # an error body or a first event is far smaller
TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Answer:
    """One request's answer: its status, Content-Type and text (a whole error body, or a stream's first event)."""

    status: int
    content_type: str
    text: str

    @property
    def error_text(self) -> str | None:
        """The error's JSON text: a non-200's body, or a 200 stream's error event (the engine refused it after the
        stream began)."""
        if self.status != 200:
            return self.text
        event = self.text.removeprefix("data: ")
        return event if event.startswith('{"error"') else None

    @property
    def reason(self) -> str | None:
        """The queue limit that refused it (the 503 body's message, either form), or None."""
        text = self.error_text
        if text is None:
            return None
        try:
            code = json.loads(text)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            return None
        return admission.reason_of(code, text)


class Burst:
    """Streams opened against ``url`` (/v1/completions), kept open until ``close``."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/") + "/v1/completions"
        self._open: list[requests.Response] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def __enter__(self) -> Burst:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def send(self, bodies: Sequence[dict]) -> list[Answer | None]:
        """Send every body at once (one thread each, released by a barrier) and return at once: the answers, in
        ``bodies``' order, fill in as they come (a request waiting in the server has none until its first token)."""
        barrier = threading.Barrier(len(bodies))
        answers: list[Answer | None] = [None] * len(bodies)

        def one(index: int) -> None:
            barrier.wait(TIMEOUT_S)
            # closed by close() before its first event (http.client then reads from None): the test is done with it
            with contextlib.suppress(requests.RequestException, OSError, ValueError, AttributeError):
                answers[index] = self.open(bodies[index])

        for index in range(len(bodies)):
            thread = threading.Thread(target=one, args=(index,), daemon=True)
            self._threads.append(thread)
            thread.start()
        return answers

    def open(self, body: dict) -> Answer:
        """Send one streaming request and read its answer up to its first event; a stream stays open."""
        # kept until close: a response no longer referenced is collected, and its connection closed with it
        response = requests.post(self.url, json={**body, "stream": True}, stream=True, timeout=TIMEOUT_S)
        with self._lock:
            self._open.append(response)
        content_type = response.headers.get("Content-Type", "")
        if response.status_code != 200:
            text = response.raw.read(READ_LIMIT_BYTES, decode_content=True).decode("utf-8", "replace")
            return Answer(response.status_code, content_type, text)
        return Answer(200, content_type, _first_event(response))

    def close(self) -> None:
        with self._lock:
            for response in self._open:
                response.close()
            self._open.clear()
        for thread in self._threads:
            thread.join(TIMEOUT_S)
        self._threads.clear()


def _first_event(response: requests.Response) -> str:
    """The first SSE event's line (bounded). Read from the raw stream: a closed iter_lines generator would
    release, and so close, the connection."""
    data = b""
    while not data.endswith(b"\n\n") and len(data) < READ_LIMIT_BYTES:
        byte = response.raw.read(1)
        if not byte:
            break
        data += byte
    return data.decode("utf-8", "replace").strip()
