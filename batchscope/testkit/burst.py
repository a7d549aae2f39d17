"""Simultaneous streaming requests for admission tests: released at once, each answer read up to its first event.

    with Burst(url) as burst:
        answers = burst.send([body] * 8)     # all released together; answers fill in, streams stay open
        wait_until(lambda: sum(1 for a in answers if a and a.reason) == 5)
        decode = burst.tally(body)           # one stream read to its end: decode.count token events so far

Closing the burst closes every stream still open: vLLM (and the simulator) abort those requests.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import requests

from batchscope.vllm import admission

READ_LIMIT_BYTES = 64 * 1024  # an error body or a first event is far smaller
TALLY_LIMIT_BYTES = 4 << 20  # a whole stream of max_model_len token events is far smaller
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

    def open(self, body: dict, on_start: Callable[[], object] | None = None) -> Answer:
        """Send one streaming request and read its answer up to its first event; a stream stays open.
        ``on_start`` is called once the response's headers are in, before its first event is read."""
        response = self._post(body)
        if on_start is not None:
            on_start()
        content_type = response.headers.get("Content-Type", "")
        if response.status_code != 200:
            text = response.raw.read(READ_LIMIT_BYTES, decode_content=True).decode("utf-8", "replace")
            return Answer(response.status_code, content_type, text)
        return Answer(200, content_type, _first_event(response))

    def tally(self, body: dict) -> Tally:
        """Send one streaming request and count its token events as they come, in a thread of its own."""
        tally = Tally(self._post(body))
        self._threads.append(tally.thread)
        return tally

    def _post(self, body: dict) -> requests.Response:
        # kept until close: a response no longer referenced is collected, and its connection closed with it
        response = requests.post(self.url, json={**body, "stream": True}, stream=True, timeout=TIMEOUT_S)
        with self._lock:
            self._open.append(response)
        return response

    def close(self) -> None:
        with self._lock:
            for response in self._open:
                response.close()
            self._open.clear()
        for thread in self._threads:
            thread.join(TIMEOUT_S)
        self._threads.clear()


class Tally:
    """A stream read to its end (or its close) by a thread: ``count`` is its token events received so far."""

    def __init__(self, response: requests.Response) -> None:
        self.count = 0
        self._response = response
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        pending, total = b"", 0
        with contextlib.suppress(requests.RequestException, OSError, ValueError, AttributeError):
            for chunk in self._response.iter_content(chunk_size=None):
                total += len(chunk)
                if total > TALLY_LIMIT_BYTES:
                    return
                *events, pending = (pending + chunk).split(b"\n\n")
                self.count += sum(1 for event in events if event.startswith(b'data: {"id"'))


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
