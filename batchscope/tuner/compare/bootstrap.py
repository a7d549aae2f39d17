"""The evidence behind a comparison's deltas, seeded and pure: run-level intervals (Welch's t over the runs, Holm's
correction over a variation's metrics) with MIN_REPEATS or more ok runs a side, else indicative within-run ones
(requests resampled for latency percentiles, counts drawn as Poisson for rates). Runs are the independent unit;
what each evidence means: docs/tuner.md (Statistics).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from batchscope.tuner.compare.metrics import Measured, MetricDef, mean_present
from batchscope.tuner.compare.welch import welch
from batchscope.tuner.plan import BASELINE

RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 0
# Resamples per numpy batch: bounds memory at CHUNK x requests floats whatever the window's size.
CHUNK = 200

MIN_REPEATS = 3  # ok runs per side before a delta may be called significant

Method = Literal["runs", "requests", "poisson", "n/a"]
Evidence = Literal["significant", "not significant", "indicative", "no spread", "n/a"]
Interval = tuple[float, float]


@dataclass(frozen=True)
class Estimate:
    """A delta's interval, what drew it, and what it shows (docs/tuner.md, Statistics)."""

    bounds: Interval | None
    method: Method
    evidence: Evidence
    p_value: float | None = None  # Welch's, before Holm's adjustment (method "runs" only)


NO_ESTIMATE = Estimate(None, "n/a", "n/a")


def estimate(metric: MetricDef, base: list[Measured], runs: list[Measured], delta: float, boot: Bootstrap,
             setting: str) -> Estimate:
    """One metric's delta, judged alone; `holm` then decides which of a variation's are significant."""
    a, b = _values(metric, base), _values(metric, runs)
    if min(a.size, b.size) >= MIN_REPEATS:
        result = welch(a, b, CONFIDENCE)
        if result is None:
            return Estimate(None, "runs", "no spread")
        return Estimate((result.low, result.high), "runs", "not significant", result.p_value)
    bounds, method = _within_runs(metric, base, runs, delta, boot, setting)
    if bounds is None:
        return Estimate(None, method, "n/a")
    if bounds[0] == bounds[1]:
        return Estimate(None, method, "no spread")
    return Estimate(bounds, method, "indicative" if bounds[0] > 0 or bounds[1] < 0 else "not significant")


def holm(estimates: list[Estimate]) -> list[Estimate]:
    """Holm's step-down over the estimates with a p-value: the k-th smallest is significant while every smaller
    one was and it is below alpha / (m - k + 1); the family is one variation's metrics."""
    alpha = 1 - CONFIDENCE
    tested = sorted((e.p_value, i) for i, e in enumerate(estimates) if e.p_value is not None)
    out = list(estimates)
    for rank, (p_value, i) in enumerate(tested):
        if p_value >= alpha / (len(tested) - rank):
            break
        out[i] = replace(estimates[i], evidence="significant")
    return out


def _values(metric: MetricDef, runs: list[Measured]) -> np.ndarray:
    return np.array([v for v in (metric.read(r) for r in runs) if v is not None], dtype=float)


def _within_runs(metric: MetricDef, base: list[Measured], runs: list[Measured], delta: float, boot: Bootstrap,
                 setting: str) -> tuple[Interval | None, Method]:
    """The interval across the pooled requests or counts of each side's runs (indicative only)."""
    if metric.samples is not None and metric.percentile is not None:
        base_draws = boot.percentiles(BASELINE, metric.samples, base)
        draws = boot.percentiles(setting, metric.samples, runs)
        if base_draws is None or draws is None:
            return None, "n/a"
        q = metric.percentile
        # centre on the reported delta: the same as the samples' for TTFT/TPOT/E2E, ITL's pools gaps instead
        shift = delta - (draws.point[q] - base_draws.point[q])
        return _quantiles(draws.draws[q] - base_draws.draws[q] + shift), "requests"
    if metric.count is not None:
        rng = boot.rng(setting, metric.key)
        draws = _poisson_rate(metric.read, metric.count, runs, rng, boot.resamples) \
            - _poisson_rate(metric.read, metric.count, base, rng, boot.resamples)
        return _quantiles(draws), "poisson"
    return None, "n/a"


@dataclass
class Resampled:
    point: dict[float, float]  # percentile -> value of the pooled samples
    draws: dict[float, np.ndarray]  # percentile -> its bootstrap draws


class Bootstrap:
    """Seeded resampling shared by one comparison: each setting's requests are resampled once, for every
    percentile at a time, and the baseline's draws serve every variation (the costly part, done once)."""

    PERCENTILES = (50.0, 99.0)

    def __init__(self, resamples: int, seed: int):
        self.resamples, self.seed = resamples, seed
        self._cache: dict[tuple[str, str], Resampled | None] = {}

    def rng(self, setting: str, name: str) -> np.random.Generator:
        # one stream per (setting, quantity): a result does not depend on which other settings were compared
        return np.random.default_rng([self.seed, zlib.crc32(f"{setting}/{name}".encode())])

    def percentiles(self, setting: str, field: str, runs: list[Measured]) -> Resampled | None:
        key = (setting, field)
        if key not in self._cache:
            values = np.concatenate([getattr(r.samples, field) for r in runs] or [[]]).astype(float)
            self._cache[key] = self._resample(values, self.rng(setting, field)) if values.size >= 2 else None
        return self._cache[key]

    def _resample(self, values: np.ndarray, rng: np.random.Generator) -> Resampled:
        qs = np.array(self.PERCENTILES)
        draws = np.empty((self.resamples, qs.size))
        # sorting a chunk of resamples and reading the ranks is numpy's 'linear' percentile, computed once for
        # every percentile; chunks bound memory at CHUNK x requests floats whatever the window's size
        ranks = qs / 100 * (values.size - 1)
        lower = np.floor(ranks).astype(int)
        upper = np.minimum(lower + 1, values.size - 1)
        weight = ranks - lower
        for start in range(0, self.resamples, CHUNK):
            n = min(CHUNK, self.resamples - start)
            chunk = np.sort(values[rng.integers(0, values.size, (n, values.size))], axis=1)
            draws[start:start + n] = chunk[:, lower] * (1 - weight) + chunk[:, upper] * weight
        point = dict(zip(self.PERCENTILES, np.percentile(values, qs), strict=True))
        return Resampled(point={q: float(v) for q, v in point.items()},
                         draws={q: draws[:, i] for i, q in enumerate(self.PERCENTILES)})


def _poisson_rate(read: Callable[[Measured], float | None], count_of: Callable[[Measured], float],
                  runs: list[Measured], rng: np.random.Generator, resamples: int) -> np.ndarray:
    """The metric's value with its underlying count redrawn as Poisson, the rest (window, tokens/request) kept."""
    count = sum(count_of(r) for r in runs)
    value = mean_present([read(r) for r in runs]) or 0.0
    if count <= 0:
        # zero observed events: a Poisson mean of 0 draws only zeros, so the other side decides the interval
        return np.full(resamples, value)
    return value * rng.poisson(count, resamples) / count


def _quantiles(draws: np.ndarray) -> Interval:
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return float(low), float(high)
