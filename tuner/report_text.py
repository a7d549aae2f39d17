"""The report's words and numbers: display units, value formatting, and the rows of its tables.

Shared by the Markdown and the HTML page (and the plots' titles): human tables show latencies in ms and KV usage
in %; the CSV and comparison.json keep base units (s, ratio).
"""

from __future__ import annotations

from tuner.comparison import Comparison, MetricDelta, SettingSummary
from tuner.metric_defs import METRIC_BY_KEY
from tuner.plan import BASELINE, TUNABLE, Slos


def display_unit(unit: str) -> str:
    """The unit a human table shows: ms for seconds, % for ratios, else the base unit."""
    return {"s": "ms", "ratio": "%"}.get(unit, unit)


def shown(value: float | None, unit: str, signed: bool = False) -> str:
    """A value in its display unit (see display_unit), with sensible precision."""
    if value is None:
        return "n/a"
    scaled = value * {"s": 1000, "ratio": 100}.get(unit, 1)
    if unit in ("count", "requests"):  # whole events, unless a mean over repeats
        digits = 0 if float(scaled).is_integer() else 1
    else:
        digits = 2 if unit == "req/s" or abs(scaled) < 10 else 1
    text = f"{scaled:{'+' if signed else ''},.{digits}f}"
    return text.replace("-", "−")


def percent(relative: float | None) -> str:
    return "n/a" if relative is None else f"{relative * 100:+.1f}%".replace("-", "−")


def ci_text(m: MetricDelta) -> str:
    if m.ci_low is None or m.ci_high is None:
        return "n/a"
    return f"[{shown(m.ci_low, m.unit, True)}, {shown(m.ci_high, m.unit, True)}]"


def significance(m: MetricDelta) -> str:
    return {True: "✓", False: "", None: "n/a"}[m.significant]


def mode_line(c: Comparison) -> str:
    if c.mode == "what-if":
        return ("Mode: **what-if** — every run on the simulator's virtual clock (a preview of the trade-offs, "
                "not a measurement of a GPU).")
    return "Mode: **real-time** — every run measured against a live server with the load generator."


def ci_line(c: Comparison) -> str:
    basis = ("across repeats (each setting's repeat values resampled)" if c.ci_basis == "repeats" else
             "across requests (one repeat per setting: each run's completed requests resampled for latency "
             "percentiles; completion, preemption and error counts drawn as Poisson for throughput, "
             "preemptions and errors; none for max waiting and KV peak)")
    return (f"Confidence intervals: {c.confidence:.0%} percentile bootstrap of the delta (setting − baseline), "
            f"{c.resamples:,} resamples, seed {c.seed}, {basis}. Significant (✓) = the interval excludes 0.")


def conditions_rows(c: Comparison) -> list[tuple[str, str]]:
    w = c.conditions
    load = w.load.model_dump()
    level = {k: v for k, v in load.items() if k != "mode"}
    return [("model (requested)", w.model), ("endpoint", w.endpoint), ("input tokens", str(w.input_tokens)),
            ("output tokens", str(w.output_tokens)), ("stream", str(w.stream).lower()),
            ("load mode", load["mode"]), ("load level", ", ".join(f"{k} {v}" for k, v in level.items())),
            ("seed", str(w.seed)), ("warm-up", f"{w.warmup_s:g} s"), ("window", f"{w.duration_s:g} s"),
            ("request timeout", f"{w.timeout_s:g} s")]


def slo_text(slos: Slos) -> str:
    parts = [f"p99 TTFT ≤ {slos.ttft_p99_s * 1000:,.0f} ms" if slos.ttft_p99_s else "p99 TTFT: no bound",
             f"p99 TPOT ≤ {slos.tpot_p99_s * 1000:,.0f} ms" if slos.tpot_p99_s else "p99 TPOT: no bound"]
    return ", ".join(parts)


def changed_text(c: Comparison, setting: str) -> str:
    if setting == BASELINE:
        return "—"
    variation = c.variation(setting)
    return ", ".join(f"{p.name} {p.arrow()}" for p in variation.changed) or "nothing"


def settings_rows(c: Comparison) -> list[list[str]]:
    rows = []
    for s in c.settings:
        slo = {True: "✓", False: "✗", None: "n/a"}[s.meets_slos]
        capacity = f"{s.kv_capacity_tokens:,}" if s.kv_capacity_tokens is not None else "n/a"
        knobs = [knob_cell(s, name) for name in TUNABLE]
        rows.append([s.setting, changed_text(c, s.setting), *knobs, capacity, str(s.runs_ok), str(s.runs_failed),
                     slo])
    return rows


def knob_cell(s: SettingSummary, name: str) -> str:
    """A knob's value as set, or 'default' with what the server reported choosing when it told ('default (128)')."""
    value = getattr(s.params, name)
    if value is None:
        value = getattr(s.reported, name, None)  # not every knob is reported (vLLM exposes no max_num_seqs)
        return "default" if value is None else f"default ({number(value)})"
    return number(value)


def number(value: int | float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


SETTINGS_HEAD = ["setting", "changed", *TUNABLE, "KV capacity (tokens)", "runs ok", "runs failed", "meets SLOs"]
METRIC_HEAD = ["metric", "unit", "baseline", "value", "delta", "delta %", "95% CI of delta", "significant"]


def metric_rows(metrics: list[MetricDelta]) -> list[list[str]]:
    return [[m.label, display_unit(m.unit), shown(m.baseline, m.unit), shown(m.value, m.unit),
             shown(m.delta, m.unit, True), percent(m.relative), ci_text(m), significance(m)] for m in metrics]


VERDICT_NOTES = {"significant": "significant vs baseline", "indicative": "indicative vs baseline, too few repeats to "
                 "be significant", "not significant": "not significantly different from the baseline",
                 "no spread": "no spread across runs vs baseline", "n/a": "no CI"}


def verdict_lines(c: Comparison) -> list[str]:
    lines = []
    for v in c.verdicts.best:
        if v.setting is None:
            lines.append(f"{v.objective}: none")
            continue
        unit = METRIC_BY_KEY[v.metric].unit
        note = "the baseline" if v.setting == BASELINE else VERDICT_NOTES.get(v.evidence or "n/a", "no CI")
        caveat = f" — but {v.caveat}" if v.caveat else ""
        lines.append(f"{v.objective}: **{v.setting}** ({shown(v.value, unit)} {display_unit(unit)}; {note}){caveat}")
    met = ", ".join(c.verdicts.met_slos) or "none"
    lines.append(f"Met the SLOs ({slo_text(c.slos)}): {met}")
    lines.append(f"Pareto front, TTFT p99 vs TPOT p99: {', '.join(c.verdicts.pareto_ttft_tpot) or 'none'}")
    return lines
