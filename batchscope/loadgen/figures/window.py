"""The measurement window: the one rule by which every reader of a run counts its requests.

The summary (summary.py), the LLM tab (adapter/llm_tab.py) and the live client metrics (metrics.py, fed by
run/control.py) take the same population: the window starts at the end of warm-up and lasts ``duration_s``
(cut short by an earlier stop; offline's closes at the stop, the summary ends it at the last request's end),
and a request belongs to it when it *ended* in it (both bounds included). A record reaches the controller after
its end, so the live verdict is final. Why: docs/loadgen.md, "One window rule".
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
