"""The answers a comparison gives: the one recommendation, the best setting per objective, the SLOs met, the front.

Pure: the settings' summaries and the variations' deltas in, Verdicts out. The recommendation ranks the settings
that met the SLOs by the plan's objective (default goodput: completed requests per second whose own TTFT and TPOT
met the SLOs, a rejected one never among them); the runner-up is the next. What a setting pays against the
baseline (arrivals rejected, preemptions, lost throughput) is a caveat in the recommendation and in every latency
verdict, so it is never picked for its latency silently. When no setting met the SLOs, nothing is recommended and
the closest one is named. Whether a delta counts is asked of one helper (`evidence`), the explanations' too.
"""

from __future__ import annotations

from typing import Literal, get_args

from batchscope.tuner.compare.metrics import METRIC_BY_KEY
from batchscope.tuner.compare.model import (
    MetricDelta,
    Recommendation,
    SettingSummary,
    VariationComparison,
    Verdict,
    Verdicts,
)
from batchscope.tuner.plan import BASELINE, Objective, Slos

Evidence = Literal["significant", "indicative", "not significant", "no spread", "n/a"]
EVIDENCE: dict[str, Evidence] = {word: word for word in get_args(Evidence)}

# The plan's objective -> the metric it ranks by and the words for it
OBJECTIVES: dict[str, tuple[str, str]] = {
    "goodput": ("goodput_rps", "highest goodput"),
    "throughput": ("completion_throughput_rps", "highest completion throughput"),
    "ttft_p99": ("ttft_p99", "lowest TTFT p99"),
    "ttft_mean": ("ttft_mean", "lowest mean TTFT"),
    "tpot_p99": ("tpot_p99", "lowest TPOT p99"),
    "tpot_mean": ("tpot_mean", "lowest mean TPOT"),
}


def evidence(m: MetricDelta | None) -> Evidence:
    """What a delta's interval says: significant (across repeats), indicative (it excludes 0, but from too few
    runs: across requests or Poisson counts), not significant, no spread (a zero-width interval), or n/a (no
    interval). A MetricDelta that carries its own `evidence` (tuner.compare.bootstrap's) is taken at its word."""
    if m is None:
        return "n/a"
    own = getattr(m, "evidence", None)
    if isinstance(own, str) and own in EVIDENCE:
        return EVIDENCE[own]
    if m.significant is None:
        return "n/a"
    if not m.significant:
        return "not significant"
    return "significant" if m.method == "repeats" else "indicative"


def counts(m: MetricDelta | None) -> bool:
    """The delta's interval excludes 0 (significant or indicative): an effect worth naming."""
    return evidence(m) in ("significant", "indicative") and m is not None and m.delta is not None


def meets_slos(values: dict[str, float | None], slos: Slos) -> bool:
    """p99 TTFT and p99 TPOT within their bounds (a None bound is no bound; a missing value fails a bound)."""
    for key, bound in (("ttft_p99", slos.ttft_p99_s), ("tpot_p99", slos.tpot_p99_s)):
        value = values.get(key)
        if bound is not None and (value is None or value > bound):
            return False
    return True


def verdicts(settings: list[SettingSummary], variations: list[VariationComparison], slos: Slos | None = None,
             objective: Objective = "goodput") -> Verdicts:
    """Best per objective (overall, then within the SLOs), SLOs met, Pareto front, and the recommendation."""
    deltas = {v.setting: v for v in variations}
    within = [s for s in settings if s.meets_slos]

    def best(words: str, key: str, pool: list[SettingSummary]) -> Verdict:
        ranked = _ranked(pool, key)
        if not ranked:
            return Verdict(objective=words, metric=key, setting=None, value=None, significant_vs_baseline=None)
        winner = ranked[0]
        delta = deltas[winner.setting].metric(key) if winner.setting in deltas else None
        latency = METRIC_BY_KEY[key].better == "lower"
        return Verdict(objective=words, metric=key, setting=winner.setting, value=winner.values.get(key),
                       significant_vs_baseline=None if delta is None else delta.significant,
                       evidence=None if delta is None else evidence(delta),
                       caveat=("; ".join(costs(deltas.get(winner.setting))) or None) if latency else None)

    overall = [("TTFT p99 (lowest)", "ttft_p99"), ("TPOT p99 (lowest)", "tpot_p99"),
               ("completion throughput (highest)", "completion_throughput_rps")]
    inside = [("goodput within the SLOs (highest)", "goodput_rps"), ("TTFT p99 within the SLOs (lowest)", "ttft_p99"),
              ("TPOT p99 within the SLOs (lowest)", "tpot_p99"),
              ("completion throughput within the SLOs (highest)", "completion_throughput_rps")]
    return Verdicts(
        best=[*(best(words, key, settings) for words, key in overall),
              *(best(words, key, within) for words, key in inside)],
        met_slos=[s.setting for s in within],
        pareto_ttft_tpot=pareto_front(settings),
        recommendation=recommend(settings, deltas, slos or Slos(), objective))


def recommend(settings: list[SettingSummary], deltas: dict[str, VariationComparison], slos: Slos,
              objective: Objective) -> Recommendation:
    """The plan's objective among the settings that met the SLOs; without any, no pick and the closest one."""
    metric = OBJECTIVES[objective][0]
    ranked = _ranked([s for s in settings if s.meets_slos], metric)
    if not ranked:
        closest = min((s for s in settings if _excess(s, slos) is not None), key=lambda s: _excess(s, slos) or 0.0,
                      default=None)
        return Recommendation(objective=objective, metric=metric, setting=None, runner_up=None,
                              closest=closest.setting if closest else None, evidence="n/a",
                              caveats=costs(deltas.get(closest.setting)) if closest else [])
    winner = ranked[0].setting
    runner_up = ranked[1].setting if len(ranked) > 1 else None
    return Recommendation(objective=objective, metric=metric, setting=winner, runner_up=runner_up, closest=None,
                          evidence=_lead(winner, runner_up, deltas, metric), caveats=costs(deltas.get(winner)))


def _ranked(pool: list[SettingSummary], key: str) -> list[SettingSummary]:
    """The settings with a value of the metric, best first (ties keep plan order: the baseline wins a tie)."""
    highest = METRIC_BY_KEY[key].better == "higher"
    present = [s for s in pool if s.values.get(key) is not None]
    return sorted(present, key=lambda s: -(s.values[key] or 0.0) if highest else (s.values[key] or 0.0))


def _lead(winner: str, runner_up: str | None, deltas: dict[str, VariationComparison], metric: str) -> Evidence:
    """The evidence of the pick's lead: the interval of the delta between the two when one is the baseline, else
    of the pick against the baseline (two variations are each compared with the baseline only)."""
    if runner_up is None:
        return "n/a"
    if winner == BASELINE:
        return evidence(deltas[runner_up].metric(metric))
    return evidence(deltas[winner].metric(metric)) if winner in deltas else "n/a"


def _excess(s: SettingSummary, slos: Slos) -> float | None:
    """How far a setting is from the SLOs: its largest p99 / bound (1 = on the bound); None without figures."""
    ratios = [value / bound for key, bound in (("ttft_p99", slos.ttft_p99_s), ("tpot_p99", slos.tpot_p99_s))
              if bound is not None and (value := s.values.get(key)) is not None]
    return max(ratios) if ratios else None


def costs(variation: VariationComparison | None) -> list[str]:
    """What a setting pays against the baseline that a latency figure hides: arrivals rejected, preemptions, lost
    throughput."""
    if variation is None:
        return []
    out = []
    rejected, share = variation.metric("rejected"), variation.metric("rejected_share")
    if counts(rejected) and (rejected.delta or 0) > 0 and share.value is not None:
        # the latency and the goodput of the rest: a rejected request is never completed, never good
        out.append(f"it rejects {share.value:.0%} of arrivals at admission ({rejected.value:,.0f} in the window, "
                   f"baseline {share.baseline or 0:.0%}): its figures are those of the requests it let in")
    preempt = variation.metric("preemptions")
    if counts(preempt) and (preempt.delta or 0) > 0:
        out.append(f"it preempts ({preempt.value:,.0f} preemptions, baseline {preempt.baseline or 0:,.0f})")
    throughput = variation.metric("completion_throughput_rps")
    if counts(throughput) and (throughput.delta or 0) < 0 and throughput.relative is not None:
        out.append(f"it loses {abs(throughput.relative) * 100:.0f}% of throughput "
                   f"({throughput.baseline or 0:.2f} → {throughput.value or 0:.2f} req/s)")
    return out


def pareto_front(settings: list[SettingSummary]) -> list[str]:
    """Settings no other setting beats on both TTFT p99 and TPOT p99 (lower is better for both)."""
    points = {s.setting: (ttft, tpot) for s in settings
              if (ttft := s.values.get("ttft_p99")) is not None and (tpot := s.values.get("tpot_p99")) is not None}

    def dominated(p: tuple[float, float]) -> bool:
        return any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in points.values())

    return [name for name, p in points.items() if not dominated(p)]
