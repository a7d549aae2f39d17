"""When the server was away: the gaps between a refused or reset connection and the server's next answer.

A gap starts at a `connection_error`'s end and ends at the send of the first request after it that the server
answered (any HTTP status); every connection error before that end is in it. A gap shorter than AWAY_MIN_S is a
flaky connection, not a server away: its errors stay failures. A gap still open when the run ends is the server
that did not come back. Records arrive out of order (by end, per sender report), so each error keeps the earliest
answered send after it seen so far, and answered sends are kept for REORDER_S of records' ends (docs/loadgen.md).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from batchscope.loadgen.stream import RequestRecord

AWAY_MIN_S = 1.0  # shorter: a connection failed among answered ones, not the server gone
REORDER_S = 60.0  # how much earlier than the latest end an answered send may still arrive (reports, stop's wait)


@dataclass(frozen=True)
class Gap:
    """One time the server was away: from its first connection error to its return (None: not back by the end)."""

    start_s: float
    end_s: float | None
    connection_errors: int  # connection errors in it, whole run
    in_window: int  # of those, the ones that ended in the measurement window


class AwayTracker:
    """The run's connection errors and the answered sends that end their gaps, folded as records arrive."""

    def __init__(self) -> None:
        self._errors: list[tuple[float, bool]] = []  # (end, ended in the window), sorted by end
        self._returns: list[float] = []  # per error: the earliest answered send after it seen so far (inf: none)
        self._recent: list[float] = []  # answered sends (sorted) of records ending within REORDER_S of the latest
        self._latest_end = -math.inf

    def add(self, record: RequestRecord, in_window: bool) -> None:
        if record.outcome == "connection_error" and record.end_s is not None:
            self._add_error(record.end_s, in_window)
        elif record.status is not None and record.sent_s is not None:
            self._add_answer(record.sent_s, record.end_s or record.sent_s)

    def _add_error(self, moment: float, in_window: bool) -> None:
        after = bisect.bisect_right(self._recent, moment)
        back = self._recent[after] if after < len(self._recent) else math.inf
        index = bisect.bisect(self._errors, (moment, in_window))
        self._errors.insert(index, (moment, in_window))
        self._returns.insert(index, back)

    def _add_answer(self, sent: float, end: float) -> None:
        # the errors before this send that it ends sooner: the last ones before it (an error's return, the first
        # answered send after it, grows with the error's moment)
        index = bisect.bisect_left(self._errors, (sent, False)) - 1
        while index >= 0 and self._returns[index] > sent:
            self._returns[index] = sent
            index -= 1
        self._latest_end = max(self._latest_end, end)
        bisect.insort(self._recent, sent)
        stale = bisect.bisect_left(self._recent, self._latest_end - REORDER_S)
        if stale > len(self._recent) // 2:  # in batches: deleting the head moves the rest
            del self._recent[:stale]

    def gaps(self, until_s: float) -> list[Gap]:
        """The gaps of at least AWAY_MIN_S (an open one measured to ``until_s``), in order."""
        found: list[Gap] = []
        index = 0
        while index < len(self._errors):
            start, back = self._errors[index][0], self._returns[index]
            members = [window for moment, window in self._errors[index:] if moment < back]
            if min(back, until_s) - start >= AWAY_MIN_S:
                found.append(Gap(start, None if math.isinf(back) else back, len(members), sum(members)))
            index += len(members)
        return found

    def away_now(self) -> bool:
        """The latest news is a connection error no answered send has followed."""
        return bool(self._returns) and math.isinf(self._returns[-1])


def away_s(gaps: list[Gap], until_s: float) -> float:
    """Seconds the server was away in ``gaps`` (an open one up to ``until_s``)."""
    return sum((until_s if gap.end_s is None else gap.end_s) - gap.start_s for gap in gaps)
