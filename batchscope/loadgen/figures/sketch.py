"""A mergeable quantile sketch for the per-token gaps (ITL): log-spaced buckets in a fixed numpy array.

DDSketch's scheme: relative error at most ALPHA = 0.5% for every gap from MIN_S (1 µs) to MAX_S (1,000 s),
gaps of 0 exact, quantiles interpolated as numpy's linear percentile; merging two sketches adds their arrays.
Memory is fixed (~30 KB) and adding a request's gaps is one vectorised pass. ``ExactGaps`` answers the same
questions exactly, keeping every gap (for records that are all in memory anyway, a what-if run's). The buckets
and the measurements: docs/loadgen.md, "The ITL sketch".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np

ALPHA = 0.005
GAMMA = (1 + ALPHA) / (1 - ALPHA)
MIN_S = 1e-6
MAX_S = 1e3
_LOG_GAMMA = math.log(GAMMA)
_SCALE = 1 / _LOG_GAMMA
_OFFSET = math.ceil(math.log(MIN_S) / _LOG_GAMMA)  # the index of MIN_S's bucket is slot 0
_SLOTS = math.ceil(math.log(MAX_S) / _LOG_GAMMA) - _OFFSET + 1


class GapSketch:
    """Counts of gaps per log bucket, plus exact zeros, sum, min and max."""

    def __init__(self) -> None:
        self.counts = np.zeros(_SLOTS, dtype=np.int64)
        self.zeros = 0
        self.count = 0
        self.sum = 0.0

    def add(self, gaps: Sequence[float] | np.ndarray) -> None:
        values = np.asarray(gaps, dtype=float)
        if values.size == 0:
            return
        self.count += values.size
        self.sum += float(values.sum())
        positive = values[values > 0]
        self.zeros += values.size - positive.size
        if positive.size:
            slots = np.ceil(np.log(np.clip(positive, MIN_S, MAX_S)) * _SCALE).astype(np.int64)
            slots -= _OFFSET
            low = int(slots.min())
            added = np.bincount(slots - low)  # only the span this request's gaps cover
            self.counts[low:low + added.size] += added

    def merge(self, other: GapSketch) -> None:
        self.counts += other.counts
        self.zeros += other.zeros
        self.count += other.count
        self.sum += other.sum

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None

    def quantiles(self, fractions: Sequence[float]) -> list[float]:
        """Estimates of numpy's linear percentiles (fractions in [0, 1]); needs at least one gap."""
        cumulative = np.cumsum(self.counts) + self.zeros
        answers = []
        for fraction in fractions:
            rank = fraction * (self.count - 1)
            low, high = math.floor(rank), math.ceil(rank)
            below, above = self._order_statistic(low, cumulative), self._order_statistic(high, cumulative)
            answers.append(below + (above - below) * (rank - low))
        return answers

    def _order_statistic(self, k: int, cumulative: np.ndarray) -> float:
        """The k-th smallest gap (0-based), as its bucket's midpoint."""
        if k < self.zeros:
            return 0.0
        slot = int(np.searchsorted(cumulative, k, side="right"))
        return 2 * GAMMA ** (slot + _OFFSET) / (GAMMA + 1)


class GapPool(Protocol):
    """What the figures need of the pooled gaps: ``GapSketch`` (bounded memory) or ``ExactGaps``."""

    count: int

    def add(self, gaps: Sequence[float] | np.ndarray) -> None: ...

    @property
    def mean(self) -> float | None: ...

    def quantiles(self, fractions: Sequence[float]) -> list[float]: ...


class ExactGaps:
    """Every gap kept, in the order added: exact count, mean and numpy's linear percentiles."""

    def __init__(self) -> None:
        self._parts: list[np.ndarray] = []
        self.count = 0

    def add(self, gaps: Sequence[float] | np.ndarray) -> None:
        values = np.asarray(gaps, dtype=float)
        self._parts.append(values)
        self.count += values.size

    def _values(self) -> np.ndarray:
        return np.concatenate([*self._parts, np.zeros(0)])

    @property
    def mean(self) -> float | None:
        return float(self._values().mean()) if self.count else None

    def quantiles(self, fractions: Sequence[float]) -> list[float]:
        """Needs at least one gap."""
        return [float(q) for q in np.quantile(self._values(), fractions)]
