"""The ground-truth log: one JSON line per request with the server's own timestamps (``--ground-truth-log``).

Benches join it with the load generator's records (by the client's X-Request-Id) to measure the client's error.
"""

from __future__ import annotations

import json

from batchscope.simulator.protocol import GenerationRequest


class RequestTiming:
    """Wall-clock truth of one request as the server wrote it."""

    __slots__ = ("arrival", "request_id", "first", "last", "outcome")

    def __init__(self, arrival: float, request_id: str | None) -> None:
        self.arrival = arrival
        self.request_id = request_id  # the client's X-Request-Id, to match records
        self.first: float | None = None
        self.last: float | None = None
        self.outcome = "ok"  # ok, injected_error, cut, aborted or rejected (refused once its input path was done)

    def token_written(self, now: float) -> None:
        if self.first is None:
            self.first = now
        self.last = now


class GroundTruthLog:
    """Appends one record per request to a JSONL file, or does nothing without a path."""

    def __init__(self, path: str | None) -> None:
        # line-buffered and kept open for the server's life: closed by close()
        self._file = open(path, "a", buffering=1) if path else None  # noqa: SIM115

    def write(self, gen: GenerationRequest, timing: RequestTiming, output_tokens: int = 0,
              finish_reason: str | None = None) -> None:
        if self._file is None:
            return
        record = {
            "request_id": timing.request_id,
            "arrival_s": timing.arrival,
            "first_token_s": timing.first,
            "last_token_s": timing.last,
            "endpoint": "chat" if gen.chat else "completions",
            "stream": gen.stream,
            "prompt_tokens": len(gen.prompt_ids),
            "output_tokens": output_tokens,
            "finish_reason": finish_reason,
            "outcome": timing.outcome,
        }
        self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
