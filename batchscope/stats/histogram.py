"""Classic cumulative-bucket histograms kept as count arrays: cheap to fill in bulk and to expose."""

from __future__ import annotations

from bisect import bisect_left

import numpy as np


class Histogram:
    """A classic cumulative-bucket histogram with fixed upper bounds (``le``), fed scalars or arrays."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self._bounds = np.asarray(self.bounds)
        self.counts = np.zeros(len(self.bounds) + 1, dtype=np.int64)  # last slot is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def observe_many(self, values: np.ndarray) -> None:
        if values.size == 0:
            return
        index = np.searchsorted(self._bounds, values, side="left")
        self.counts += np.bincount(index, minlength=self.counts.size)
        self.sum += float(values.sum())

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else 0.0

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, cumulative count) pairs ending with +Inf, as prometheus_client's HistogramMetricFamily wants."""
        running = np.cumsum(self.counts)
        pairs = [(repr(b), float(c)) for b, c in zip(self.bounds, running[:-1], strict=True)]
        pairs.append(("+Inf", float(running[-1])))
        return pairs


def merged_bounds(*bucket_lists: tuple[float, ...]) -> tuple[float, ...]:
    """Sorted union of bucket boundaries: vLLM's boundaries plus finer ones keep vLLM-comparable quantiles."""
    return tuple(sorted({float(b) for bounds in bucket_lists for b in bounds}))
