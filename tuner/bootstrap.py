"""Confidence intervals of a comparison's deltas: seeded percentile bootstrap, one method per kind of metric.

95% intervals of the delta variation − baseline, RESAMPLES resamples, seeded:
- every setting has >= 2 ok repeats: resample the repeats' values of each setting (method "repeats");
- otherwise, latencies: resample the completed requests of each setting (RequestSamples) and recompute the
  percentile (method "requests"); the interval is centred on the reported delta (ITL's figure pools every gap,
  while the samples hold each request's mean ITL, so only their spread is used);
- otherwise, completion throughput, output tokens/s, preemptions and errors: the counts behind them are drawn
  as Poisson counts around the observed ones (method "poisson"). A closed loop completes requests more regularly
  than a Poisson process, so this interval is, if anything, too wide: it errs towards "not significant";
- otherwise, max waiting and KV peak (the maximum of sampled gauges; one value per run): no interval ("n/a").
A delta is significant when its interval excludes 0.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from tuner.metric_defs import Measured, MetricDef, mean_present
from tuner.plan import BASELINE

RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 0
# Resamples per numpy batch: bounds memory at CHUNK x requests floats whatever the window's size.
CHUNK = 200

Method = Literal["repeats", "requests", "poisson", "n/a"]
Interval = tuple[float, float]


def interval(metric: MetricDef, base: list[Measured], runs: list[Measured], basis: str, delta: float,
             boot: Bootstrap, setting: str) -> tuple[Interval | None, Method]:
    """The interval of one metric's delta and the method that drew it (see the module docstring)."""
    if basis == "repeats":
        a = np.array([v for v in (metric.read(r) for r in base) if v is not None])
        b = np.array([v for v in (metric.read(r) for r in runs) if v is not None])
        if a.size < 2 or b.size < 2:
            return None, "n/a"
        rng = boot.rng(setting, metric.key)
        draws = _resample_means(b, rng, boot.resamples) - _resample_means(a, rng, boot.resamples)
        return _quantiles(draws), "repeats"
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


def _resample_means(values: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    return values[rng.integers(0, values.size, (resamples, values.size))].mean(axis=1)


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
