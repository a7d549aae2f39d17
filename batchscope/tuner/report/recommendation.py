"""The report's opening block: the one recommendation (tuner.compare.verdicts.recommend) in words and figures.

One headline naming the pick, the objective and how strong the evidence is, then why (its figures against the
SLOs, its delta to the baseline with the interval), the runner-up, what the pick trades against it, and its
latencies as mean / p50 / p99. Markdown lines (**bold** only); tuner.report renders them in report.md and
report.html.
"""

from __future__ import annotations

from batchscope.tuner.compare import (
    METRIC_BY_KEY,
    OBJECTIVES,
    Comparison,
    MetricDelta,
    Recommendation,
    SettingSummary,
    evidence,
)
from batchscope.tuner.plan import BASELINE
from batchscope.tuner.report.text import ci_text, display_unit, shown, slo_text

TRADE_KEYS = ("ttft_mean", "ttft_p50", "ttft_p99", "tpot_p99", "itl_p99", "completion_throughput_rps")
TRADE_MIN = 0.05  # a difference from the runner-up is named when >= 5%
LEAD_WORDS = {"significant": "its lead over the runner-up is significant",
              "indicative": "its lead over the runner-up is indicative (the interval excludes 0, from one repeat)",
              "not significant": "its lead over the runner-up is not significant: on this objective either would do",
              "no spread": "its lead over the runner-up shows no spread across runs, so no estimate of the noise",
              "n/a": "no interval for its lead"}


def recommendation_lines(c: Comparison) -> list[str]:
    """The headline, then the lines of detail (empty for a comparison without a recommendation)."""
    r = c.verdicts.recommendation
    if r is None:
        return []
    one_repeat = (f" With fewer than {c.min_repeats} runs per setting no difference is called significant (the "
                  f"intervals within a run ignore run-to-run variance): repeats: {c.min_repeats} for that."
                  if c.ci_basis == "requests" else "")
    if r.setting is None:
        return _none_met(c, r, one_repeat)
    pick = c.setting(r.setting)
    words = OBJECTIVES[r.objective][1]
    lead = _lead(r)
    caveat = f" Note: {'; '.join(r.caveats)}." if r.caveats else ""
    lines = [f"**Recommended: {r.setting}** — {words} among the settings that met the SLOs "
             f"({_figure(pick, r.metric)}); {lead}.{caveat}{one_repeat}",
             f"Why: {_why(c, r, pick)}"]
    if r.runner_up:
        runner = c.setting(r.runner_up)
        figures = f"{_figure(runner, r.metric)}{_vs_baseline(c, r.runner_up, r.metric)}"
        lines.append(f"Runner-up: **{r.runner_up}** ({figures}); {_trades(pick, runner)}")
    lines.append(f"Latency of {r.setting} (mean / p50 / p99): {_latencies(pick)}")
    return lines


def _lead(r: Recommendation) -> str:
    """How strong the pick's lead is; between two variations only their deltas to the baseline have intervals."""
    if r.runner_up is None:
        return "the only setting that met them"
    if BASELINE not in (r.setting, r.runner_up):
        return f"its own delta to the baseline is {r.evidence} (the two variations were each compared with the " \
               "baseline only)"
    return LEAD_WORDS[r.evidence]


def _none_met(c: Comparison, r: Recommendation, one_repeat: str) -> list[str]:
    head = f"**No recommendation**: no setting met the SLOs ({slo_text(c.slos)})."
    if r.closest is None:
        return [head + one_repeat]
    closest = c.setting(r.closest)
    caveat = f" Note: {'; '.join(r.caveats)}." if r.caveats else ""
    return [f"{head} Closest, **not recommended**: {r.closest} (TTFT p99 {_value(closest, 'ttft_p99')}, "
            f"TPOT p99 {_value(closest, 'tpot_p99')}).{caveat}{one_repeat}",
            f"Latency of {r.closest} (mean / p50 / p99): {_latencies(closest)}"]


def _value(s: SettingSummary, key: str) -> str:
    unit = METRIC_BY_KEY[key].unit
    return f"{shown(s.values.get(key), unit)} {display_unit(unit)}"


def _figure(s: SettingSummary, key: str) -> str:
    return f"{METRIC_BY_KEY[key].label} {_value(s, key)}"


def _delta(c: Comparison, setting: str, key: str) -> MetricDelta | None:
    return None if setting == BASELINE else c.variation(setting).metric(key)


def _vs_baseline(c: Comparison, setting: str, key: str) -> str:
    """', +0.40 req/s [−1.87, +2.80] vs the baseline (indicative)', or '' for the baseline itself."""
    m = _delta(c, setting, key)
    if m is None:
        return ""
    return f", {shown(m.delta, m.unit, True)} {display_unit(m.unit)} {ci_text(m)} vs the baseline ({evidence(m)})"


def _why(c: Comparison, r: Recommendation, pick: SettingSummary) -> str:
    parts = [f"{_figure(pick, r.metric)}{_vs_baseline(c, pick.setting, r.metric)}"]
    good, done = pick.values.get("goodput_rps"), pick.values.get("completion_throughput_rps")
    if good is not None and done:
        parts.append(f"{good / done:.0%} of its {shown(done, 'req/s')} req/s completed within the SLOs")
    share = pick.values.get("rejected_share")
    if share:
        parts.append(f"{share:.0%} of arrivals rejected by vLLM's admission check (never good, never completed)")
    for key, bound in (("ttft_p99", c.slos.ttft_p99_s), ("tpot_p99", c.slos.tpot_p99_s)):
        if bound is not None:
            parts.append(f"{_figure(pick, key)} ≤ {bound * 1000:,.0f} ms")
    return "; ".join(parts)


def _trades(pick: SettingSummary, runner: SettingSummary) -> str:
    """What the pick gives up and gains against the runner-up, by >= TRADE_MIN (values, not intervals: each was
    compared with the baseline only, as the line says)."""
    worse: list[str] = []
    better: list[str] = []
    for key in TRADE_KEYS:
        a, b = pick.values.get(key), runner.values.get(key)
        if a is None or not b or abs(a / b - 1) < TRADE_MIN:
            continue
        metric = METRIC_BY_KEY[key]
        text = f"{metric.label} {_value(pick, key)} vs {_value(runner, key)} ({a / b - 1:+.0%})".replace("-", "−")
        (worse if (a > b) == (metric.better == "lower") else better).append(text)
    if not worse and not better:
        return "the two differ by less than 5% on TTFT, TPOT, tail ITL and throughput"
    out = []
    if worse:
        out.append(f"by value, against it the pick gives up {', '.join(worse)}")
    if better:
        out.append(f"{'and ' if worse else 'by value, against it the pick '}gains {', '.join(better)}")
    return " ".join(out)


def _latencies(s: SettingSummary) -> str:
    def three(name: str) -> str:
        values = [shown(s.values.get(f"{name}_{q}"), "s") for q in ("mean", "p50", "p99")]
        return f"{name.upper()} {' / '.join(values)} ms"

    return f"{three('ttft')}; {three('tpot')}"
