"""Failed and refused requests in the sender's log, rate-limited: the first of each kind at once, then a count of
the others every LOG_EVERY_S.

A broken or hostile server fails every request the same way, thousands a second, and a load far above vLLM's
admission limit is refused as often: a line (let alone a traceback) per request floods the console and costs the
sender the CPU it times streams with. A kind is an outcome with its status (an HTTP status, or an error event's
code) and a refusal's reason, so a run logs a few lines however many requests fail; the records and the summary
count every one. A refusal by vLLM's admission limit (rejected_busy) is worded as one, not as a failure.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from batchscope.loadgen.stream import RequestRecord

LOG_EVERY_S = 10.0
NOT_FAULTS = ("ok", "aborted")  # aborted: the run's end cut them
log = logging.getLogger("batchscope.loadgen")

Kind = tuple[str, int | None, str | None]  # (outcome, status, a refusal's reason)


@dataclass
class _Tally:
    logged_s: float  # when this kind was last logged
    unlogged: int = 0  # requests of this kind since


class FaultLog:
    """One sender's failed requests, logged by kind; ``clock`` is monotonic seconds."""

    def __init__(self, every_s: float = LOG_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self._tallies: dict[Kind, _Tally] = {}

    def note(self, record: RequestRecord) -> None:
        if record.outcome in NOT_FAULTS:
            return
        kind, now = (record.outcome, record.status, record.reject_reason), self.clock()
        tally = self._tallies.get(kind)
        if tally is None:
            self._tallies[kind] = _Tally(logged_s=now)
            log.log(level(kind), "%s: %s (more of this kind are counted every %g s)", describe(kind, 1),
                    record.error or "no detail", self.every_s)
            return
        tally.unlogged += 1
        if now - tally.logged_s >= self.every_s:
            self._log_count(kind, tally, now)

    def flush(self) -> None:
        """Log the counts not logged yet (the run is ending)."""
        now = self.clock()
        for kind, tally in self._tallies.items():
            if tally.unlogged:
                self._log_count(kind, tally, now)

    @staticmethod
    def _log_count(kind: Kind, tally: _Tally, now: float) -> None:
        log.log(level(kind), "%s: %d more in the last %.0f s", describe(kind, tally.unlogged), tally.unlogged,
                now - tally.logged_s)
        tally.logged_s, tally.unlogged = now, 0


def level(kind: Kind) -> int:
    """A failure is a warning; a refusal by the admission limit is information (the run goes on as planned)."""
    return logging.INFO if kind[0] == "rejected_busy" else logging.WARNING


def describe(kind: Kind, count: int) -> str:
    """What ``count`` requests of ``kind`` met, e.g. 'request failed, http_error 500'."""
    outcome, status, reason = kind
    noun = "request" if count == 1 else "requests"
    if outcome == "rejected_busy":  # the queue limit at work: a refusal, not a failure
        return f"{noun} refused by vLLM's admission limit ({reason}), {status}"
    return f"{noun} failed, " + (outcome if status in (None, 200) else f"{outcome} {status}")
