"""A comparison of a plan's settings, as saved in comparison.json: per-metric deltas, settings, verdicts.

The models only; compute.py fills them, verdicts.py and explain.py read them, tuner.report shows them.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, Field

from batchscope.loadgen import WorkloadSpec
from batchscope.runs.provenance import Provenance
from batchscope.tuner.compare.bootstrap import CONFIDENCE, MIN_REPEATS, RESAMPLES, SEED, Evidence, Method
from batchscope.tuner.compare.suggest import QueuedTokensSuggestion
from batchscope.tuner.plan import Objective, ServingParams, Slos
from batchscope.tuner.results import ServerReport
from batchscope.vllm import knobs as vllm_knobs

# 2: a knob in a setting's params or a ParamChange may be None (not passed, vLLM's default); settings say what
# the server reported choosing (SettingSummary.reported)
# 3: significance is run-level (MetricDelta.evidence, p_value; method "runs" replaces "repeats"; ci_basis "runs")
# 4: admission rejections compared (metrics rejected, rejected_share); max_num_queued_tokens suggestions
SCHEMA_VERSION: Final = 4


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
    ci_low: float | None = Field(description="Lower end of the 95% CI of delta, in unit (None: no interval).")
    ci_high: float | None = Field(description="Upper end of the 95% CI of delta, in unit (None: no interval).")
    evidence: Evidence = Field(description="significant: >= MIN_REPEATS ok runs per side and Holm-adjusted "
                               "p < 0.05 over the variation's metrics; not significant; indicative: fewer runs, "
                               "the within-run interval excludes 0 (never significant); no spread: every run of "
                               "both sides gave the same value (zero variance is no certainty); n/a: no interval.")
    p_value: float | None = Field(None, description="Welch's two-sided p-value over the runs, before Holm's "
                                  "adjustment (method 'runs' only).")
    significant: bool | None = Field(description="evidence is 'significant'; None when evidence is 'n/a'.")
    method: Method = Field(description="What drew the interval: runs (Welch t over the runs' values), requests "
                           "(within-run bootstrap), poisson counts, or n/a (no interval).")

    @property
    def improved(self) -> bool | None:
        """A significant change in the better direction (None when undecidable)."""
        if not self.significant or self.better is None or self.delta is None:
            return None
        return (self.delta < 0) == (self.better == "lower")


class ParamChange(BaseModel):
    """A serving parameter that differs from the baseline."""

    name: str = Field(description="Parameter (one of tuner.plan.TUNABLE, or 'extra_flags').")
    # bool first: a switch's true stays true (pydantic would make it 1 as an int)
    baseline: bool | int | float | str | None = Field(description="Its baseline value (None: not passed, vLLM's "
                                                      "default).")
    value: bool | int | float | str | None = Field(description="Its value in this setting (None as above).")

    def arrow(self) -> str:
        """'2048 → 8192', or 'vLLM default → 32' for a knob the baseline leaves unset."""
        return f"{vllm_knobs.shown(self.baseline)} → {vllm_knobs.shown(self.value)}"


class SettingSummary(BaseModel):
    """One setting across its repeats."""

    setting: str = Field(description="'baseline' or the variation's name.")
    params: ServingParams = Field(description="Serving parameters of the setting.")
    runs_ok: int = Field(description="Repeats that finished.")
    runs_failed: int = Field(description="Repeats that failed (listed in Comparison.failed).")
    kv_capacity_tokens: int | None = Field(description="KV cache capacity reported by the server, tokens.")
    reported: ServerReport | None = Field(None, description="What the server reported choosing (its first ok run "
                                          "that read it back): the values of the knobs left to vLLM.")
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
    evidence: str | None = Field(None, description="What its delta to the baseline shows "
                                 "(tuner.compare.verdicts.evidence: significant, indicative, not significant, "
                                 "no spread, n/a); None for the baseline itself.")
    caveat: str | None = Field(None, description="For a latency objective: what the setting costs that its latency "
                               "hides (it preempts, it loses throughput), so it is never picked silently.")


class Recommendation(BaseModel):
    """The report's one pick: the plan's objective among the settings that met the SLOs."""

    objective: Objective = Field(description="The plan's objective (Plan.objective).")
    metric: str = Field(description="Metric key the objective ranks by, e.g. goodput_rps.")
    setting: str | None = Field(description="The recommended setting; None when no setting met the SLOs.")
    runner_up: str | None = Field(description="The next setting by the objective among those that met the SLOs.")
    closest: str | None = Field(description="When no setting met the SLOs: the nearest to them (the largest "
                                "p99 / bound ratio smallest), not recommended; else None.")
    evidence: str = Field(description="How far the pick beats the runner-up on the metric: significant, "
                          "indicative (one repeat), not significant, or n/a (no runner-up or no interval).")
    caveats: list[str] = Field(default_factory=list, description="What the pick costs against the baseline: "
                               "preemptions that appeared, throughput lost.")


class Verdicts(BaseModel):
    """Answers per objective."""

    best: list[Verdict] = Field(description="Best setting for TTFT p99, TPOT p99 and throughput, then for goodput, "
                                "TTFT p99, TPOT p99 and throughput among the settings within the SLOs.")
    met_slos: list[str] = Field(description="Settings whose p99 TTFT and TPOT meet the SLOs.")
    pareto_ttft_tpot: list[str] = Field(description="Settings on the TTFT p99 / TPOT p99 Pareto front.")
    recommendation: Recommendation | None = Field(None, description="The one pick by the plan's objective (None "
                                                  "in a comparison saved before there was one).")


class FailedRun(BaseModel):
    """A run that failed: listed, not compared."""

    setting: str = Field(description="Setting name.")
    repeat: int = Field(description="Repeat index.")
    failure: str = Field(description="One line saying why.")


class Comparison(Provenance):
    """Every variation of a plan against its baseline, with the conditions and SLOs that framed it."""

    schema_version: Literal[4] = Field(SCHEMA_VERSION, description="Bumped when a field changes meaning.")
    plan: str = Field(description="Plan name.")
    mode: Literal["real-time", "what-if"] = Field(description="How every compared run was measured.")
    conditions: WorkloadSpec = Field(description="The locked workload shared by every run.")
    slos: Slos = Field(description="Bounds used for met_slos.")
    confidence: float = Field(CONFIDENCE, description="Confidence level of the intervals.")
    min_repeats: int = Field(MIN_REPEATS, description="Ok runs per side a delta needs to be significant.")
    resamples: int = Field(RESAMPLES, description="Bootstrap resamples per within-run interval.")
    seed: int = Field(SEED, description="Base seed of the bootstrap (one stream per setting and quantity).")
    ci_basis: Literal["runs", "requests"] = Field(description="'runs' when every setting has >= min_repeats ok "
                                                  "runs (Welch t over runs), else 'requests' (within-run "
                                                  "intervals: indicative only).")
    settings: list[SettingSummary] = Field(description="Baseline first, then the variations in plan order.")
    variations: list[VariationComparison] = Field(description="Each variation against the baseline.")
    verdicts: Verdicts = Field(description="Best per objective; SLOs met; Pareto front.")
    failed: list[FailedRun] = Field(description="Runs that failed, with their one-line failure.")
    queued_tokens: list[QueuedTokensSuggestion] = Field(default_factory=list, description="A max_num_queued_tokens "
                                                        "per setting with a measured prefill throughput (vLLM's "
                                                        "guidance: the plan's p99 TTFT bound x that throughput).")

    def queued_tokens_for(self) -> QueuedTokensSuggestion | None:
        """The suggestion for the setting one would deploy: the recommended one, else the closest to the SLOs,
        else the baseline (None when that one has no suggestion)."""
        r = self.verdicts.recommendation
        pick = (r.setting or r.closest) if r is not None else None
        by_setting = {s.setting: s for s in self.queued_tokens}
        return by_setting.get(pick or "", by_setting.get("baseline"))

    def setting(self, name: str) -> SettingSummary:
        return next(s for s in self.settings if s.setting == name)

    def variation(self, name: str) -> VariationComparison:
        return next(v for v in self.variations if v.setting == name)
