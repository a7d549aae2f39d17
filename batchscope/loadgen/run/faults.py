"""Failed requests in the sender's log, rate-limited: the first of each kind at once, then a count of the others
every LOG_EVERY_S.

A broken or hostile server fails every request the same way, thousands a second: a line (let alone a traceback)
per request floods the console and costs the sender the CPU it times streams with. A kind is an outcome with its
status (an HTTP status, or an error event's code), so a run logs a few lines however many requests fail; the
records and the summary count every one.
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

Kind = tuple[str, int | None]  # (outcome, status)


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
        kind, now = (record.outcome, record.status), self.clock()
        tally = self._tallies.get(kind)
        if tally is None:
            self._tallies[kind] = _Tally(logged_s=now)
            log.warning("request failed, %s: %s (more of this kind are counted every %g s)", describe(kind),
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
        log.warning("requests failed, %s: %d more in the last %.0f s", describe(kind), tally.unlogged,
                    now - tally.logged_s)
        tally.logged_s, tally.unlogged = now, 0


def describe(kind: Kind) -> str:
    outcome, status = kind
    return outcome if status in (None, 200) else f"{outcome} {status}"
