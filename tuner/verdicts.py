"""The answers a comparison gives per objective: the best setting, the settings within the SLOs, the Pareto front.

Pure: the settings' summaries and the variations' deltas in, Verdicts out.
"""

from __future__ import annotations

from tuner.comparison import SettingSummary, VariationComparison, Verdict, Verdicts
from tuner.plan import Slos


def meets_slos(values: dict[str, float | None], slos: Slos) -> bool:
    """p99 TTFT and p99 TPOT within their bounds (a None bound is no bound; a missing value fails a bound)."""
    for key, bound in (("ttft_p99", slos.ttft_p99_s), ("tpot_p99", slos.tpot_p99_s)):
        value = values.get(key)
        if bound is not None and (value is None or value > bound):
            return False
    return True


def verdicts(settings: list[SettingSummary], variations: list[VariationComparison]) -> Verdicts:
    """Best setting per objective (TTFT p99, TPOT p99, throughput, throughput within the SLOs), SLOs met, front."""
    deltas = {v.setting: v for v in variations}
    within = [s for s in settings if s.meets_slos]

    def best(objective: str, key: str, pool: list[SettingSummary], highest: bool) -> Verdict:
        candidates = [(value, s) for s in pool if (value := s.values.get(key)) is not None]
        if not candidates:
            return Verdict(objective=objective, metric=key, setting=None, value=None, significant_vs_baseline=None)
        value, winner = (max if highest else min)(candidates, key=lambda candidate: candidate[0])
        significant = deltas[winner.setting].metric(key).significant if winner.setting in deltas else None
        return Verdict(objective=objective, metric=key, setting=winner.setting, value=value,
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
    points = {s.setting: (ttft, tpot) for s in settings
              if (ttft := s.values.get("ttft_p99")) is not None and (tpot := s.values.get("tpot_p99")) is not None}

    def dominated(p: tuple[float, float]) -> bool:
        return any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in points.values())

    return [name for name, p in points.items() if not dominated(p)]
