"""The measurement window: the one rule by which every reader of a run counts its requests.

The summary (batchscope/loadgen/summary.py), the web UI's LLM tab (batchscope/loadgen/llm_tab.py) and the live client
metrics (batchscope/loadgen/metrics.py, fed by batchscope/loadgen/control.py) all take the same population:

* the window starts at the end of warm-up (run start + ``warmup_s``) and lasts ``duration_s``, cut short by an
  earlier stop (Ctrl-C, SIGTERM, fail-fast); offline's has no planned end: it closes at the stop, and the summary
  ends it at the last request's end;
* a request belongs to the window when it *ended* in it (both bounds included), whatever its start. Latencies
  (TTFT, TPOT, E2E, ITL) take the requests that ended ok in it.

Why "ended in": a steady system's window then holds each kind of request at its true rate, long ones included,
so a closed loop obeys Little's law; counting only requests that both started and ended in the window would
leave out those spanning an edge, the long ones most.

Why one rule can serve live readers: a record reaches the controller after its end, so a request that ended
before a stop is judged before or after that stop alike (the stop only cuts later ends). The live verdict on a
record is therefore final, and live figures converge to the summary's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from batchscope.loadgen.spec import OfflineLoad, WorkloadSpec


class Ended(Protocol):
    """Anything with an end time (a RequestRecord)."""

    end_s: float | None


@dataclass(frozen=True)
class MeasurementWindow:
    """[start_s, end_s] in Unix seconds; ``end_s`` may be infinite while an offline run goes on."""

    start_s: float
    end_s: float

    def holds(self, record: Ended) -> bool:
        return in_window(record, self.start_s, self.end_s)

    def covers(self, moment: float) -> bool:
        return self.start_s <= moment <= self.end_s

    @property
    def duration_s(self) -> float:
        """The window's length, never zero (it divides throughputs)."""
        return max(self.end_s - self.start_s, 1e-9)


def in_window(record: Ended, start: float, end: float) -> bool:
    """The population of every request figure: the request ended within [start, end]."""
    return record.end_s is not None and start <= record.end_s <= end


def live_window(spec: WorkloadSpec, start_s: float, stop_s: float | None) -> MeasurementWindow:
    """The window as known while the run goes on (and after it, for the records still arriving)."""
    start = start_s + spec.warmup_s
    end = math.inf if isinstance(spec.load, OfflineLoad) else start + spec.duration_s
    return MeasurementWindow(start, min(end, stop_s if stop_s is not None else math.inf))


def final_window(spec: WorkloadSpec, start_s: float, stop_s: float, ends: Iterable[float]) -> MeasurementWindow:
    """The summary's window: the live one at the stop; offline's closes at the last request's end instead."""
    window = live_window(spec, start_s, stop_s)
    if isinstance(spec.load, OfflineLoad):
        return MeasurementWindow(window.start_s, max(ends, default=window.start_s))
    return window
