"""Compare each variation of a plan with its baseline: values, deltas, bootstrap confidence intervals, verdicts.

Pure: RunResults and the SLOs in, a Comparison out (no I/O, no clock), so the report, the CLI and the tests
share one set of numbers. The seed's rule is enforced here: runs whose locked conditions differ, or that were
measured in different modes (real time, what-if), are not compared (ConditionsDiffer, one line naming the
field).

Confidence intervals (95%, percentile bootstrap, seeded, RESAMPLES resamples) of the delta variation − baseline:
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
from typing import Final, Literal

import numpy as np
from pydantic import BaseModel, Field

import batchscope
from batchscope.secrets import mask_argv
from loadgen.spec import WorkloadSpec
from tuner.plan import TUNABLE, ServingParams, Slos
from tuner.results import RunResult

SCHEMA_VERSION: Final = 1
BASELINE = "baseline"
RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 0
# Fields of the workload that do not change what is measured (a credential), so runs may differ in them.
UNLOCKED_CONDITIONS = frozenset({"api_key"})
# Resamples per numpy batch: bounds memory at CHUNK x requests floats whatever the window's size.
CHUNK = 200

Method = Literal["repeats", "requests", "poisson", "n/a"]


class ConditionsDiffer(ValueError):
    """Runs that must not be compared (locked conditions or mode differ); the message is one line."""


@dataclass(frozen=True)
class MetricDef:
    """One compared metric: how to read it from a run, and how to bootstrap it from one run's data."""

    key: str
    label: str
    unit: str  # base unit of the value: s, req/s, tok/s, count, requests, ratio
    better: Literal["lower", "higher"] | None
    read: Callable[[RunResult], float | None]
    samples: str | None = None  # RequestSamples field to resample (latency percentiles)
    percentile: float | None = None  # one of _Bootstrap.PERCENTILES
    count: Callable[[RunResult], float] | None = None  # the Poisson count behind a rate or total


def _latency(name: str, q: int) -> MetricDef:
    label = name.upper() if name != "e2e" else "E2E"
    return MetricDef(f"{name}_p{q}", f"{label} p{q}", "s", "lower",
                     lambda r: getattr(getattr(r.client, name), f"p{q}"), f"{name}_s", float(q))


METRICS: tuple[MetricDef, ...] = (
    *(_latency(name, q) for name in ("ttft", "tpot", "itl", "e2e") for q in (50, 99)),
    MetricDef("completion_throughput_rps", "completion throughput", "req/s", "higher",
              lambda r: r.client.completion_throughput_rps, count=lambda r: r.client.completed),
    # tokens per completed request scale the count: the tokens arrive with the requests that carry them
    MetricDef("output_tokens_per_s", "output tokens/s", "tok/s", "higher",
              lambda r: r.client.output_tokens_per_s, count=lambda r: r.client.completed),
    MetricDef("preemptions", "preemptions", "count", "lower", lambda r: r.server.preemptions,
              count=lambda r: r.server.preemptions),
    MetricDef("max_waiting", "max waiting", "requests", "lower", lambda r: r.server.max_waiting),
    MetricDef("kv_usage_peak", "KV usage peak", "ratio", None, lambda r: r.server.kv_usage_peak),
    MetricDef("errors", "errors", "count", "lower", lambda r: r.client.errors, count=lambda r: r.client.errors),
)
METRIC_BY_KEY = {m.key: m for m in METRICS}


class MetricDelta(BaseModel):
    """One metric of one variation against the baseline."""

    metric: str = Field(description="Metric key, e.g. ttft_p99.")
    label: str = Field(description="Human name, e.g. 'TTFT p99'.")
    unit: str = Field(description="Unit of baseline, value, delta and CI: s, req/s, tok/s, count, requests, ratio.")
    better: Literal["lower", "higher"] | None = Field(description="Which direction is an improvement, if any.")
    baseline: float | None = Field(description="Baseline value (mean over its ok repeats).")
    value: float | None = Field(description="This setting's value (mean over its ok repeats).")
    delta: float | None = Field(description="value − baseline, in unit.")
    relative: float | None = Field(description="delta / baseline (0.1 = +10%); None when the baseline is 0.")
    ci_low: float | None = Field(description="Lower end of the 95% bootstrap CI of delta, in unit.")
    ci_high: float | None = Field(description="Upper end of the 95% bootstrap CI of delta, in unit.")
    significant: bool | None = Field(description="The CI excludes 0; None when there is no CI.")
    method: Method = Field(description="What was resampled: repeats, requests, poisson counts, or n/a (no CI).")

    @property
    def improved(self) -> bool | None:
        """A significant change in the better direction (None when undecidable)."""
        if not self.significant or self.better is None or self.delta is None:
            return None
        return (self.delta < 0) == (self.better == "lower")


class ParamChange(BaseModel):
    """A serving parameter that differs from the baseline."""

    name: str = Field(description="Parameter (one of tuner.plan.TUNABLE, or 'extra_flags').")
    baseline: int | float | str | None = Field(description="Its baseline value.")
    value: int | float | str | None = Field(description="Its value in this setting.")


class SettingSummary(BaseModel):
    """One setting across its repeats."""

    setting: str = Field(description="'baseline' or the variation's name.")
    params: ServingParams = Field(description="Serving parameters of the setting.")
    runs_ok: int = Field(description="Repeats that finished.")
    runs_failed: int = Field(description="Repeats that failed (listed in Comparison.failed).")
    kv_capacity_tokens: int | None = Field(description="KV cache capacity reported by the server, tokens.")
    values: dict[str, float | None] = Field(description="Metric key -> mean over ok repeats, in the metric's unit.")
    signals: dict[str, float | None] = Field(description="Server signals (ServerSignals fields), mean over ok "
                                             "repeats: the evidence the explanations cite.")
    meets_slos: bool | None = Field(description="p99 TTFT and TPOT within the SLOs; None without an ok run.")


class VariationComparison(BaseModel):
    """A variation against the baseline."""

    setting: str = Field(description="Variation name.")
    changed: list[ParamChange] = Field(description="Parameters that differ from the baseline.")
    metrics: list[MetricDelta] = Field(description="One entry per compared metric, in METRICS order.")
    explanation: str = Field(description="What changed and why, from the server signals, in vLLM terms.")

    def metric(self, key: str) -> MetricDelta:
        return next(m for m in self.metrics if m.metric == key)


class Verdict(BaseModel):
    """The best setting for one objective."""

    objective: str = Field(description="e.g. 'TTFT p99 (lowest)'.")
    metric: str = Field(description="Metric key judged.")
    setting: str | None = Field(description="Best setting; None when no setting has a value.")
    value: float | None = Field(description="Its value, in the metric's unit.")
    significant_vs_baseline: bool | None = Field(description="Its delta to the baseline is significant (None for "
                                                 "the baseline itself or without a CI).")


class Verdicts(BaseModel):
    """Answers per objective."""

    best: list[Verdict] = Field(description="Best setting for TTFT p99, TPOT p99, throughput, and throughput "
                                "within the SLOs.")
    met_slos: list[str] = Field(description="Settings whose p99 TTFT and TPOT meet the SLOs.")
    pareto_ttft_tpot: list[str] = Field(description="Settings on the TTFT p99 / TPOT p99 Pareto front.")


class FailedRun(BaseModel):
    """A run that failed: listed, not compared."""

    setting: str = Field(description="Setting name.")
    repeat: int = Field(description="Repeat index.")
    failure: str = Field(description="One line saying why.")


class Comparison(BaseModel):
    """Every variation of a plan against its baseline, with the conditions and SLOs that framed it."""

    schema_version: Literal[1] = Field(SCHEMA_VERSION, description="Bumped on any breaking change.")
    tool_version: str = Field(batchscope.__version__, description="batchscope version that compared.")
    plan: str = Field(description="Plan name.")
    mode: Literal["real-time", "what-if"] = Field(description="How every compared run was measured.")
    conditions: WorkloadSpec = Field(description="The locked workload shared by every run.")
    slos: Slos = Field(description="Bounds used for met_slos.")
    confidence: float = Field(CONFIDENCE, description="Confidence level of the intervals.")
    resamples: int = Field(RESAMPLES, description="Bootstrap resamples per interval.")
    seed: int = Field(SEED, description="Base seed of the bootstrap (one stream per setting and quantity).")
    ci_basis: Literal["repeats", "requests"] = Field(description="'repeats' when every setting has >= 2 ok "
                                                     "repeats, else 'requests' (one repeat: across requests).")
    settings: list[SettingSummary] = Field(description="Baseline first, then the variations in plan order.")
    variations: list[VariationComparison] = Field(description="Each variation against the baseline.")
    verdicts: Verdicts = Field(description="Best per objective; SLOs met; Pareto front.")
    failed: list[FailedRun] = Field(description="Runs that failed, with their one-line failure.")

    def setting(self, name: str) -> SettingSummary:
        return next(s for s in self.settings if s.setting == name)

    def variation(self, name: str) -> VariationComparison:
        return next(v for v in self.variations if v.setting == name)


def compare(results: list[RunResult], slos: Slos, *, order: list[str] | None = None, resamples: int = RESAMPLES,
            seed: int = SEED) -> Comparison:
    """Compare every variation with the baseline; raise ConditionsDiffer for runs that must not be compared.

    `order` lists setting names in plan order (the baseline first whatever it says; unlisted ones follow).
    """
    if not results:
        raise ValueError("no runs to compare")
    check_comparable(results)
    groups = _group(results, order or [])
    ok = {name: [r for r in runs if r.status == "ok" and r.client and r.server] for name, runs in groups.items()}
    basis = "repeats" if all(len(runs) >= 2 for runs in ok.values()) else "requests"
    params = {name: runs[0].params for name, runs in groups.items()}
    settings = [_summarise(name, params[name], groups[name], ok[name], slos) for name in groups]
    base = ok.get(BASELINE, [])
    boot = _Bootstrap(resamples, seed)
    variations = []
    for name in groups:
        if name == BASELINE:
            continue
        deltas = [_delta(metric, base, ok[name], basis, boot, name) for metric in METRICS]
        variation = VariationComparison(setting=name, changed=changed_params(params.get(BASELINE), params[name]),
                                        metrics=deltas, explanation="")
        variations.append(variation)
    by_name = {s.setting: s for s in settings}
    from tuner.explain import explain  # explain reads this module's models; imported here to avoid a cycle

    for variation in variations:
        variation.explanation = explain(variation, by_name.get(BASELINE), by_name[variation.setting])
    failed = [FailedRun(setting=r.setting, repeat=r.repeat, failure=r.failure or "failed (no reason recorded)")
              for r in results if r.status != "ok" or not (r.client and r.server)]
    return Comparison(plan=results[0].plan, mode=results[0].mode, conditions=results[0].conditions, slos=slos,
                      resamples=resamples, seed=seed, ci_basis=basis, settings=settings, variations=variations,
                      verdicts=_verdicts(settings, variations), failed=failed)


def check_comparable(results: list[RunResult]) -> None:
    """Raise ConditionsDiffer naming the first mode or locked-condition field on which two runs differ."""
    reference = next((r for r in results if r.setting == BASELINE), results[0])
    locked = _flatten(reference.conditions.model_dump(mode="json"))
    for run in results:
        if run.mode != reference.mode:
            raise ConditionsDiffer(f"mode differs: {reference.run_name} is {reference.mode} but {run.run_name} is "
                                   f"{run.mode}; compare real-time and what-if runs separately")
        other = _flatten(run.conditions.model_dump(mode="json"))
        # the model's field order: a changed load mode is named before the fields that come with it
        for field in [*locked, *(f for f in other if f not in locked)]:
            if field.split(".")[0] in UNLOCKED_CONDITIONS:
                continue
            if locked.get(field) != other.get(field):
                raise ConditionsDiffer(f"conditions differ: {field} is {locked.get(field)!r} in "
                                       f"{reference.run_name} but {other.get(field)!r} in {run.run_name}; "
                                       "only runs of one locked workload can be compared")


def changed_params(baseline: ServingParams | None, params: ServingParams) -> list[ParamChange]:
    """Parameters of `params` that differ from the baseline's (TUNABLE first, then extra flags)."""
    if baseline is None:
        return []
    changes = [ParamChange(name=name, baseline=getattr(baseline, name), value=getattr(params, name))
               for name in ("model", *TUNABLE) if getattr(baseline, name) != getattr(params, name)]
    if baseline.extra_flags != params.extra_flags:
        changes.append(ParamChange(name="extra_flags", baseline=" ".join(mask_argv(baseline.extra_flags)),
                                   value=" ".join(mask_argv(params.extra_flags))))
    return changes


def _flatten(data: dict, prefix: str = "") -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _group(results: list[RunResult], order: list[str]) -> dict[str, list[RunResult]]:
    """Runs by setting: the baseline, then `order`, then others as they come; repeats in order."""
    rank = {name: i for i, name in enumerate([BASELINE, *order])}
    groups: dict[str, list[RunResult]] = {}
    for run in sorted(results, key=lambda r: rank.get(r.setting, len(rank))):  # stable: keeps the rest's order
        groups.setdefault(run.setting, []).append(run)
    return {name: sorted(runs, key=lambda r: r.repeat) for name, runs in groups.items()}


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def _summarise(name: str, params: ServingParams, runs: list[RunResult], ok: list[RunResult],
               slos: Slos) -> SettingSummary:
    values = {m.key: _mean([m.read(r) for r in ok]) for m in METRICS}
    signal_names = ("preemptions", "queue_time_mean_s", "prefill_time_mean_s", "decode_time_mean_s",
                    "tokens_per_step_mean", "max_waiting", "max_running", "kv_usage_peak", "kv_usage_mean")
    signals = {field: _mean([getattr(r.server, field) for r in ok]) for field in signal_names}
    capacity = next((r.server.kv_capacity_tokens for r in ok if r.server.kv_capacity_tokens is not None), None)
    return SettingSummary(setting=name, params=params, runs_ok=len(ok), runs_failed=len(runs) - len(ok),
                          kv_capacity_tokens=capacity, values=values, signals=signals,
                          meets_slos=meets_slos(values, slos) if ok else None)


def meets_slos(values: dict[str, float | None], slos: Slos) -> bool:
    """p99 TTFT and p99 TPOT within their bounds (a None bound is no bound; a missing value fails a bound)."""
    for key, bound in (("ttft_p99", slos.ttft_p99_s), ("tpot_p99", slos.tpot_p99_s)):
        if bound is not None and (values.get(key) is None or values[key] > bound):
            return False
    return True


def _delta(metric: MetricDef, base: list[RunResult], runs: list[RunResult], basis: str, boot: _Bootstrap,
           setting: str) -> MetricDelta:
    baseline = _mean([metric.read(r) for r in base])
    value = _mean([metric.read(r) for r in runs])
    delta = None if baseline is None or value is None else value - baseline
    relative = delta / baseline if delta is not None and baseline else None
    interval, method = None, "n/a"
    if delta is not None:
        interval, method = _interval(metric, base, runs, basis, delta, boot, setting)
    low, high = interval if interval is not None else (None, None)
    return MetricDelta(metric=metric.key, label=metric.label, unit=metric.unit, better=metric.better,
                       baseline=baseline, value=value, delta=delta, relative=relative, ci_low=low, ci_high=high,
                       significant=None if interval is None else bool(low > 0 or high < 0), method=method)


def _interval(metric: MetricDef, base: list[RunResult], runs: list[RunResult], basis: str, delta: float,
              boot: _Bootstrap, setting: str) -> tuple[tuple[float, float] | None, Method]:
    if basis == "repeats":
        a = np.array([v for v in (metric.read(r) for r in base) if v is not None])
        b = np.array([v for v in (metric.read(r) for r in runs) if v is not None])
        if a.size < 2 or b.size < 2:
            return None, "n/a"
        rng = boot.rng(setting, metric.key)
        draws = _resample_means(b, rng, boot.resamples) - _resample_means(a, rng, boot.resamples)
        return _quantiles(draws), "repeats"
    if metric.samples is not None:
        a = boot.percentiles(BASELINE, metric.samples, base)
        b = boot.percentiles(setting, metric.samples, runs)
        if a is None or b is None:
            return None, "n/a"
        q = metric.percentile
        # centre on the reported delta: the same as the samples' for TTFT/TPOT/E2E, ITL's pools gaps instead
        return _quantiles(b.draws[q] - a.draws[q] + (delta - (b.point[q] - a.point[q]))), "requests"
    if metric.count is not None:
        rng = boot.rng(setting, metric.key)
        draws = _poisson_rate(metric, runs, rng, boot.resamples) - _poisson_rate(metric, base, rng, boot.resamples)
        return _quantiles(draws), "poisson"
    return None, "n/a"


def _resample_means(values: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    return values[rng.integers(0, values.size, (resamples, values.size))].mean(axis=1)


@dataclass
class _Resampled:
    point: dict[float, float]  # percentile -> value of the pooled samples
    draws: dict[float, np.ndarray]  # percentile -> its bootstrap draws


class _Bootstrap:
    """Seeded resampling shared by one comparison: each setting's requests are resampled once, for every
    percentile at a time, and the baseline's draws serve every variation (the costly part, done once)."""

    PERCENTILES = (50.0, 99.0)

    def __init__(self, resamples: int, seed: int):
        self.resamples, self.seed = resamples, seed
        self._cache: dict[tuple[str, str], _Resampled | None] = {}

    def rng(self, setting: str, name: str) -> np.random.Generator:
        # one stream per (setting, quantity): a result does not depend on which other settings were compared
        return np.random.default_rng([self.seed, zlib.crc32(f"{setting}/{name}".encode())])

    def percentiles(self, setting: str, field: str, runs: list[RunResult]) -> _Resampled | None:
        key = (setting, field)
        if key not in self._cache:
            values = np.concatenate([getattr(r.samples, field) for r in runs] or [[]]).astype(float)
            self._cache[key] = self._resample(values, self.rng(setting, field)) if values.size >= 2 else None
        return self._cache[key]

    def _resample(self, values: np.ndarray, rng: np.random.Generator) -> _Resampled:
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
        return _Resampled(point={q: float(v) for q, v in point.items()},
                          draws={q: draws[:, i] for i, q in enumerate(self.PERCENTILES)})


def _poisson_rate(metric: MetricDef, runs: list[RunResult], rng: np.random.Generator,
                  resamples: int) -> np.ndarray:
    """The metric's value with its underlying count redrawn as Poisson, the rest (window, tokens/request) kept."""
    count = sum(metric.count(r) for r in runs)
    value = _mean([metric.read(r) for r in runs]) or 0.0
    if count <= 0:
        # zero observed events: a Poisson mean of 0 draws only zeros, so the other side decides the interval
        return np.full(resamples, value)
    return value * rng.poisson(count, resamples) / count


def _quantiles(draws: np.ndarray) -> tuple[float, float]:
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return float(low), float(high)


def _verdicts(settings: list[SettingSummary], variations: list[VariationComparison]) -> Verdicts:
    deltas = {v.setting: v for v in variations}
    within = [s for s in settings if s.meets_slos]

    def best(objective: str, key: str, pool: list[SettingSummary], highest: bool) -> Verdict:
        candidates = [s for s in pool if s.values.get(key) is not None]
        if not candidates:
            return Verdict(objective=objective, metric=key, setting=None, value=None, significant_vs_baseline=None)
        winner = (max if highest else min)(candidates, key=lambda s: s.values[key])
        significant = deltas[winner.setting].metric(key).significant if winner.setting in deltas else None
        return Verdict(objective=objective, metric=key, setting=winner.setting, value=winner.values[key],
                       significant_vs_baseline=significant)

    return Verdicts(
        best=[best("TTFT p99 (lowest)", "ttft_p99", settings, False),
              best("TPOT p99 (lowest)", "tpot_p99", settings, False),
              best("completion throughput (highest)", "completion_throughput_rps", settings, True),
              best("completion throughput within the SLOs (highest)", "completion_throughput_rps", within, True)],
        met_slos=[s.setting for s in within],
        pareto_ttft_tpot=pareto_front(settings))


def pareto_front(settings: list[SettingSummary]) -> list[str]:
    """Settings no other setting beats on both TTFT p99 and TPOT p99 (lower is better for both)."""
    points = {s.setting: (s.values.get("ttft_p99"), s.values.get("tpot_p99")) for s in settings}
    points = {name: p for name, p in points.items() if None not in p}

    def dominated(p: tuple[float, float]) -> bool:
        return any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in points.values())

    return [name for name, p in points.items() if not dominated(p)]
