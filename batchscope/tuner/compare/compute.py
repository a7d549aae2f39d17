"""Compare each variation of a plan with its baseline: values, deltas, confidence intervals, verdicts.

Pure: RunResults and the SLOs in, a Comparison out (no I/O, no clock), so the report, the CLI and the tests
share one set of numbers. The seed's rule is enforced here: runs whose locked conditions differ, or that were
measured in different modes (real time, what-if), are not compared (ConditionsDiffer, one line naming the
field). Intervals: tuner.compare.bootstrap; verdicts: tuner.compare.verdicts; explanations: tuner.compare.explain.
"""

from __future__ import annotations

from batchscope.inputs.secrets import mask_argv
from batchscope.tuner.compare.bootstrap import (
    MIN_REPEATS,
    NO_ESTIMATE,
    RESAMPLES,
    SEED,
    Bootstrap,
    Estimate,
    estimate,
    holm,
)
from batchscope.tuner.compare.explain import explain
from batchscope.tuner.compare.metrics import METRICS, Measured, MetricDef, mean_present, measured
from batchscope.tuner.compare.model import (
    Comparison,
    FailedRun,
    MetricDelta,
    ParamChange,
    SettingSummary,
    VariationComparison,
)
from batchscope.tuner.compare.nested import flatten
from batchscope.tuner.compare.suggest import suggest_queued_tokens
from batchscope.tuner.compare.verdicts import meets_slos, verdicts
from batchscope.tuner.plan import BASELINE, TUNABLE, Objective, ServingParams, Slos
from batchscope.tuner.results import RunResult

# Fields of the workload that do not change what is measured (a credential), so runs may differ in them.
UNLOCKED_CONDITIONS = frozenset({"api_key"})


class ConditionsDiffer(ValueError):
    """Runs that must not be compared (locked conditions or mode differ); the message is one line."""


def compare(results: list[RunResult], slos: Slos, *, order: list[str] | None = None, resamples: int = RESAMPLES,
            seed: int = SEED, objective: Objective = "goodput") -> Comparison:
    """Compare every variation with the baseline; raise ConditionsDiffer for runs that must not be compared.

    `order` lists setting names in plan order (the baseline first whatever it says; unlisted ones follow);
    `objective` is the plan's, which the recommendation ranks by.
    """
    if not results:
        raise ValueError("no runs to compare")
    check_comparable(results)
    groups = _group(results, order or [])
    ok = {name: [m for m in map(measured, runs) if m is not None] for name, runs in groups.items()}
    basis = "runs" if all(len(runs) >= MIN_REPEATS for runs in ok.values()) else "requests"
    params = {name: runs[0].params for name, runs in groups.items()}
    settings = [_summarise(name, params[name], groups[name], ok[name], slos) for name in groups]
    base = ok.get(BASELINE, [])
    boot = Bootstrap(resamples, seed)
    variations = []
    for name in groups:
        if name == BASELINE:
            continue
        deltas = _deltas(base, ok[name], boot, name)
        variation = VariationComparison(setting=name, changed=changed_params(params.get(BASELINE), params[name]),
                                        metrics=deltas, explanation="")
        variations.append(variation)
    by_name = {s.setting: s for s in settings}
    for variation in variations:
        variation.explanation = explain(variation, by_name.get(BASELINE), by_name[variation.setting])
    failed = [FailedRun(setting=r.setting, repeat=r.repeat, failure=r.failure or "failed (no reason recorded)")
              for r in results if measured(r) is None]
    suggestions = [suggestion for name in groups if (suggestion := suggest_queued_tokens(name, ok[name], slos))]
    return Comparison(plan=results[0].plan, mode=results[0].mode, conditions=results[0].conditions, slos=slos,
                      resamples=resamples, seed=seed, ci_basis=basis, settings=settings, variations=variations,
                      verdicts=verdicts(settings, variations, slos, objective), failed=failed,
                      queued_tokens=suggestions)


def check_comparable(results: list[RunResult]) -> None:
    """Raise ConditionsDiffer naming the first mode or locked-condition field on which two runs differ."""
    reference = next((r for r in results if r.setting == BASELINE), results[0])
    locked = flatten(reference.conditions.model_dump(mode="json"))
    for run in results:
        if run.mode != reference.mode:
            raise ConditionsDiffer(f"mode differs: {reference.run_name} is {reference.mode} but {run.run_name} is "
                                   f"{run.mode}; compare real-time and what-if runs separately")
        other = flatten(run.conditions.model_dump(mode="json"))
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


def _group(results: list[RunResult], order: list[str]) -> dict[str, list[RunResult]]:
    """Runs by setting: the baseline, then `order`, then others as they come; repeats in order."""
    rank = {name: i for i, name in enumerate([BASELINE, *order])}
    groups: dict[str, list[RunResult]] = {}
    for run in sorted(results, key=lambda r: rank.get(r.setting, len(rank))):  # stable: keeps the rest's order
        groups.setdefault(run.setting, []).append(run)
    return {name: sorted(runs, key=lambda r: r.repeat) for name, runs in groups.items()}


def _summarise(name: str, params: ServingParams, runs: list[RunResult], ok: list[Measured],
               slos: Slos) -> SettingSummary:
    values = {m.key: mean_present([m.read(r) for r in ok]) for m in METRICS}
    signal_names = ("preemptions", "queue_time_mean_s", "prefill_time_mean_s", "decode_time_mean_s",
                    "tokens_per_step_mean", "max_waiting", "max_running", "kv_usage_peak", "kv_usage_mean",
                    "admission_rejections")
    signals = {field: mean_present([getattr(r.server, field) for r in ok]) for field in signal_names}
    capacity = next((r.server.kv_capacity_tokens for r in ok if r.server.kv_capacity_tokens is not None), None)
    reported = next((r.reported for r in runs if r.status == "ok" and r.reported is not None), None)
    return SettingSummary(setting=name, params=params, runs_ok=len(ok), runs_failed=len(runs) - len(ok),
                          kv_capacity_tokens=capacity, reported=reported, values=values, signals=signals,
                          meets_slos=meets_slos(values, slos) if ok else None)


def _deltas(base: list[Measured], runs: list[Measured], boot: Bootstrap, setting: str) -> list[MetricDelta]:
    """Every metric's delta, its interval and its evidence (Holm's adjustment over the variation's metrics)."""
    points = [_point(metric, base, runs) for metric in METRICS]
    estimates = holm([NO_ESTIMATE if delta is None else estimate(metric, base, runs, delta, boot, setting)
                      for metric, (_, _, delta) in zip(METRICS, points, strict=True)])
    return [_delta(metric, *point, e) for metric, point, e in zip(METRICS, points, estimates, strict=True)]


def _point(metric: MetricDef, base: list[Measured], runs: list[Measured]
           ) -> tuple[float | None, float | None, float | None]:
    """(baseline, value, delta): means over each side's ok runs."""
    baseline = mean_present([metric.read(r) for r in base])
    value = mean_present([metric.read(r) for r in runs])
    return baseline, value, None if baseline is None or value is None else value - baseline


def _delta(metric: MetricDef, baseline: float | None, value: float | None, delta: float | None,
           e: Estimate) -> MetricDelta:
    relative = delta / baseline if delta is not None and baseline else None
    low, high = e.bounds if e.bounds is not None else (None, None)
    return MetricDelta(metric=metric.key, label=metric.label, unit=metric.unit, better=metric.better,
                       baseline=baseline, value=value, delta=delta, relative=relative, ci_low=low, ci_high=high,
                       significant=None if e.evidence == "n/a" else e.evidence == "significant",
                       evidence=e.evidence, p_value=e.p_value, method=e.method)
