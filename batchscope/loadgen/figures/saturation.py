"""Is the load generator itself the bottleneck? Its CPU and its lags, live and over the measurement window.

Saturated: the busiest sender's CPU reaches SATURATED_CPU of a core, or the median dispatch or read lag passes
MAX_LAG_S; the advice is more sender processes (`--workers N`). Live (the ``batchscope_client_saturated`` gauge
and the LLM tab): CPU over the latest interval of at least MIN_INTERVAL_S, lags of the last RECENT_S. End of
run (the summary): CPU over the window, lags over the run. Why these signs: docs/loadgen.md, "Saturation".
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, Field

SATURATED_CPU = 0.90  # share of one core
# median of dispatch lag or of read lag. Not lower: a server emits a token for every stream at each step, so at
# 256 streams a healthy client reads a burst of 256 chunks every step, ~25 µs each, and its chunks wait ~1 ms on
# average (median over requests at ~27k tokens/s; the kernel stamp keeps the timing exact as long as a chunk is
# read before the next one comes)
MAX_LAG_S = 0.005
MIN_INTERVAL_S = 1.0
RECENT_S = 10.0


class GeneratorLoad(BaseModel):
    """Whether the load generator kept up, and the measures behind the verdict."""

    cpu_share: float | None = Field(description="CPU of the busiest sender process as a share of one core "
                                    "(summary: over the measurement window), or null before it is known.")
    dispatch_lag_p50_s: float | None = Field(description="Median of actual - scheduled send, seconds.")
    read_lag_p50_s: float | None = Field(description="Median over requests of their mean read lag: a read minus "
                                               "its kernel receive time, seconds.")
    saturated: bool = Field(description=f"The generator was the bottleneck: cpu_share >= {SATURATED_CPU:g}, or a "
                            f"lag median above {MAX_LAG_S * 1e3:g} ms; its latencies then include its own delay.")
    advice: str | None = Field(description="What was exceeded and what to do (e.g. --workers N); null when not "
                               "saturated.")


def judge(cpu_share: float | None, dispatch_lag_p50_s: float | None, read_lag_p50_s: float | None,
          senders: int) -> GeneratorLoad:
    reasons = []
    if cpu_share is not None and cpu_share >= SATURATED_CPU:
        reasons.append(f"sender CPU {cpu_share:.0%} of a core")
    for name, lag in (("dispatch lag", dispatch_lag_p50_s), ("read lag", read_lag_p50_s)):
        if lag is not None and lag > MAX_LAG_S:
            reasons.append(f"{name} median {lag * 1e3:.1f} ms > {MAX_LAG_S * 1e3:g} ms")
    advice = None
    if reasons:
        advice = (f"load generator saturated ({'; '.join(reasons)}): its latencies include its own delay; "
                  f"run more sender processes, e.g. --workers {max(2, 2 * senders)}")
    return GeneratorLoad(cpu_share=cpu_share, dispatch_lag_p50_s=dispatch_lag_p50_s,
                         read_lag_p50_s=read_lag_p50_s, saturated=bool(reasons), advice=advice)


@dataclass
class CpuMeter:
    """One sender's CPU from the (wall time, cumulative CPU seconds) pairs its reports carry."""

    first: tuple[float, float] | None = None  # the first pair at or after the window start
    mark: tuple[float, float] | None = None  # start of the current live interval
    latest: tuple[float, float] | None = None
    share: float | None = None  # over the last complete live interval

    def note(self, at_s: float, cpu_s: float, window_start_s: float) -> None:
        if self.first is None and at_s >= window_start_s:
            self.first = (at_s, cpu_s)
        if self.mark is None:
            self.mark = (at_s, cpu_s)
        elif at_s - self.mark[0] >= MIN_INTERVAL_S:
            self.share = (cpu_s - self.mark[1]) / (at_s - self.mark[0])
            self.mark = (at_s, cpu_s)
        self.latest = (at_s, cpu_s)

    def window_share(self) -> float | None:
        if self.first is None or self.latest is None or self.latest[0] - self.first[0] < MIN_INTERVAL_S:
            return self.share
        return (self.latest[1] - self.first[1]) / (self.latest[0] - self.first[0])


@dataclass
class SaturationMonitor:
    """Fed with each sender report's CPU and each record's lags by the controller."""

    cpu: dict[str, CpuMeter] = field(default_factory=dict)
    # (received at, dispatch lag, read lag) of the requests received in the last RECENT_S
    recent: deque[tuple[float, float, float]] = field(default_factory=deque)

    def note_cpu(self, sender: str, at_s: float, cpu_s: float, window_start_s: float) -> None:
        self.cpu.setdefault(sender, CpuMeter()).note(at_s, cpu_s, window_start_s)

    def note_lags(self, dispatch_lag_s: float | None, read_lag_s: float | None) -> None:
        now = time.time()
        self.recent.append((now, math.nan if dispatch_lag_s is None else dispatch_lag_s,
                            math.nan if read_lag_s is None else read_lag_s))
        while self.recent and self.recent[0][0] < now - RECENT_S:
            self.recent.popleft()

    def live(self) -> GeneratorLoad:
        shares = [meter.share for meter in self.cpu.values() if meter.share is not None]
        now = time.time()
        recent = np.array([(d, f) for at, d, f in self.recent if at >= now - RECENT_S]).reshape(-1, 2)
        return judge(max(shares, default=None), _p50(recent[:, 0]), _p50(recent[:, 1]), len(self.cpu) or 1)

    def over_run(self, dispatch_lags: np.ndarray, read_lags: np.ndarray) -> GeneratorLoad:
        shares = [s for s in (meter.window_share() for meter in self.cpu.values()) if s is not None]
        return judge(max(shares, default=None), _p50(dispatch_lags), _p50(read_lags), len(self.cpu) or 1)


def _p50(values: np.ndarray) -> float | None:
    known = values[~np.isnan(values)]
    return float(np.median(known)) if known.size else None
