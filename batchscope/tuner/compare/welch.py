"""Welch's t interval and p-value of a difference of means, for a comparison's run-level statistics.

Each run is one observation (its p50, its throughput...): requests within a run share its queue and its batches,
so they are not independent; runs are. Welch's t does not assume equal variances on both sides and is right for
a handful of values per side, where a bootstrap of 3 values draws only 10 distinct means and is far too narrow.
Student's t distribution is computed here (the regularized incomplete beta by its continued fraction), so the
tuner needs no scipy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# continued fraction: converges in a few dozen terms for the df and |t| a comparison meets; bounded regardless
MAX_TERMS = 300
EPSILON = 1e-13
TINY = 1e-300
QUANTILE_BISECTIONS = 100


@dataclass(frozen=True)
class WelchResult:
    low: float
    high: float
    p_value: float  # two-sided, of "the means are equal"


def welch(baseline: np.ndarray, setting: np.ndarray, confidence: float) -> WelchResult | None:
    """The interval of mean(setting) - mean(baseline) and its p-value; None when neither side varies (no spread:
    no estimate of the noise, so no interval). Each side needs >= 2 values."""
    if np.ptp(baseline) == 0 and np.ptp(setting) == 0:  # exact: the variance of equal floats may not be 0.0
        return None
    var_a, var_b = float(baseline.var(ddof=1)) / baseline.size, float(setting.var(ddof=1)) / setting.size
    se2 = var_a + var_b
    # Welch-Satterthwaite degrees of freedom: a side without spread contributes none
    df = se2 ** 2 / (var_a ** 2 / (baseline.size - 1) + var_b ** 2 / (setting.size - 1))
    delta, se = float(setting.mean() - baseline.mean()), math.sqrt(se2)
    half = t_quantile(1 - (1 - confidence) / 2, df) * se
    return WelchResult(low=delta - half, high=delta + half, p_value=2 * t_upper_tail(abs(delta) / se, df))


def t_upper_tail(t: float, df: float) -> float:
    """P(T > t) for t >= 0, T Student's t with df degrees of freedom."""
    return 0.5 * _beta_regularized(df / 2, 0.5, df / (df + t * t))


def t_quantile(probability: float, df: float) -> float:
    """The t with P(T <= t) = probability, for probability in [0.5, 1) (bisection on the tail)."""
    tail = 1 - probability
    low, high = 0.0, 1.0
    while t_upper_tail(high, df) > tail and high < 1e12:  # bounded: the tail falls below any tail > 0
        high *= 2
    for _ in range(QUANTILE_BISECTIONS):
        middle = (low + high) / 2
        low, high = (middle, high) if t_upper_tail(middle, df) > tail else (low, middle)
    return (low + high) / 2


def _beta_regularized(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function (Numerical Recipes' betai)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    # the continued fraction converges fast below the mean of the beta distribution; above it, use the symmetry
    if x < (a + 1) / (a + b + 2):
        return front * _continued_fraction(a, b, x) / a
    return 1 - front * _continued_fraction(b, a, 1 - x) / b


def _continued_fraction(a: float, b: float, x: float) -> float:
    """The incomplete beta's continued fraction by the modified Lentz method."""
    c, d = 1.0, _nonzero(1 - (a + b) * x / (a + 1))
    d = 1 / d
    h = d
    for m in range(1, MAX_TERMS + 1):
        even = m * (b - m) * x / ((a - 1 + 2 * m) * (a + 2 * m))
        d, c = 1 / _nonzero(1 + even * d), _nonzero(1 + even / c)
        h *= d * c
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 1 + 2 * m))
        d, c = 1 / _nonzero(1 + odd * d), _nonzero(1 + odd / c)
        h *= d * c
        if abs(d * c - 1) < EPSILON:
            break
    return h


def _nonzero(value: float) -> float:
    return value if abs(value) >= TINY else TINY
