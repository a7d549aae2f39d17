"""The report's words and numbers: display units, value formatting, and the rows of its tables.

Shared by the Markdown and the HTML page (and the plots' titles): human tables show latencies in ms and KV usage
in %; the CSV and comparison.json keep base units (s, ratio).
"""

from __future__ import annotations

from batchscope.tuner.compare import METRIC_BY_KEY, Comparison, MetricDelta, SettingSummary
from batchscope.tuner.plan import BASELINE, TUNABLE, Slos


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
    """The significance cell: ✓ only for run-level evidence; a one- or two-repeat delta is at most indicative."""
    if m.evidence == "not significant" and m.method == "runs" and m.ci_low is not None and m.ci_high is not None \
            and (m.ci_low > 0 or m.ci_high < 0):
        return "not after Holm"  # its own 95% interval excludes 0, the variation's family of metrics does not
    return {"significant": "✓", "not significant": "", "indicative": "indicative", "no spread": "no spread",
            "n/a": "n/a"}[m.evidence]


def mode_line(c: Comparison) -> str:
    if c.mode == "what-if":
        return ("Mode: **what-if** — every run on the simulator's virtual clock (a preview of the trade-offs, "
                "not a measurement of a GPU).")
    return "Mode: **real-time** — every run measured against a live server with the load generator."


def ci_line(c: Comparison) -> str:
    """What the intervals are and when a delta is called significant (one line under the comparison)."""
    if c.ci_basis == "runs":
        basis = (f"{c.confidence:.0%} Welch t interval of the delta (setting − baseline) over the runs, each run "
                 f"one value (requests within a run are correlated; runs are the independent unit). Significant "
                 f"(✓) = at least {c.min_repeats} ok runs per side and a Holm-adjusted p below "
                 f"{1 - c.confidence:.2f} over the variation's metrics; 'no spread' = every run of both sides gave "
                 f"the same value, which is no evidence.")
    else:
        basis = (f"fewer than {c.min_repeats} ok runs per setting, so no delta is called significant: each "
                 f"interval is a {c.confidence:.0%} bootstrap within the runs (requests resampled for latency "
                 f"percentiles, counts drawn as Poisson for throughput, goodput, preemptions and errors; none for "
                 f"means, max waiting and KV peak; {c.resamples:,} resamples, seed {c.seed}), which ignores "
                 f"run-to-run variance: 'indicative' = it excludes 0. Use repeats: {c.min_repeats} or more for "
                 f"significance.")
    return f"Confidence intervals: {basis} {repeats_line(c)}"


def repeats_line(c: Comparison) -> str:
    """What makes repeats differ, so what their spread means."""
    if c.mode == "what-if":
        from batchscope.tuner.whatif import STEP_JITTER_CV  # whatif brings the simulator: loaded for a what-if only

        return (f"What-if repeats differ by seed: repeat r draws its own step-time noise ({STEP_JITTER_CV:.0%} per "
                "step, lognormal; an assumption, not a measured GPU's) and, with Poisson load, its own arrivals; "
                "their spread is that noise's, not a real server's run-to-run variance.")
    return "Repeats are interleaved (every setting for repeat 0, then repeat 1, ...), the baseline's included."


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


def shown_knobs(c: Comparison) -> list[str]:
    """The knobs the settings table has a column for: those whose value differs between settings though no
    setting set them (the server chose differently). A knob the plan changes is in the 'changed' column, one the
    same everywhere in baseline_line: a column of one value says nothing and set vertically took ~190 px."""
    set_by_plan = {p.name for v in c.variations for p in v.changed}
    return [name for name in TUNABLE if name not in set_by_plan
            and len({knob_cell(s, name) for s in c.settings}) > 1]


def baseline_line(c: Comparison) -> str:
    """The baseline's knobs (those it sets or the server reported choosing), which every variation keeps but for
    its 'changed' column."""
    if not any(s.setting == BASELINE for s in c.settings):
        return ""
    base = c.setting(BASELINE)
    knobs = [f"{name} {cell}" for name in TUNABLE if name not in shown_knobs(c)
             and (cell := knob_cell(base, name)) != "default"]
    return f"Baseline: {', '.join(knobs)}; each variation keeps these but for its 'changed' column."


def settings_head(c: Comparison) -> list[str]:
    return ["setting", "changed", *shown_knobs(c), "KV capacity (tokens)", "runs ok", "runs failed", "meets SLOs"]


def settings_rows(c: Comparison) -> list[list[str]]:
    rows = []
    names = shown_knobs(c)
    for s in c.settings:
        slo = {True: "✓", False: "✗", None: "n/a"}[s.meets_slos]
        capacity = f"{s.kv_capacity_tokens:,}" if s.kv_capacity_tokens is not None else "n/a"
        knobs = [knob_cell(s, name) for name in names]
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


ADMISSION_HEAD = ["setting", "goodput (req/s)", "completion throughput (req/s)", "rejected (admission)",
                  "rejected share (%)", "vLLM's admission counter +", "TTFT p99 (ms)", "meets SLOs"]


def admission_rows(c: Comparison) -> list[list[str]]:
    """Per setting: goodput beside the arrivals vLLM's admission check refused (the client's count and share, the
    server's counter increase), and the TTFT they buy."""
    rows = []
    for s in c.settings:
        cells = [shown(s.values.get(key), METRIC_BY_KEY[key].unit) for key in
                 ("goodput_rps", "completion_throughput_rps", "rejected", "rejected_share")]
        counter = s.signals.get("admission_rejections")
        rows.append([s.setting, *cells, "n/a" if counter is None else shown(counter, "count"),
                     shown(s.values.get("ttft_p99"), "s"), {True: "✓", False: "✗", None: "n/a"}[s.meets_slos]])
    return rows


def queued_tokens_lines(c: Comparison) -> list[str]:
    """The suggested max_num_queued_tokens with its inputs (vLLM's guidance: TTFT target x prefill throughput)."""
    pick = c.queued_tokens_for()
    if pick is None:
        why = "the plan sets no p99 TTFT bound" if c.slos.ttft_p99_s is None else "no run measured a prefill"
        return [f"Suggested max_num_queued_tokens: none ({why})."]
    return [f"Suggested max_num_queued_tokens for {pick.setting}: **{pick.max_num_queued_tokens:,}** = TTFT target "
            f"{pick.ttft_target_s:g} s (the plan's p99 TTFT bound) × prefill throughput "
            f"{pick.prefill_tokens_per_s:,.0f} tokens/s ({pick.source_text}), vLLM's guidance: a request admitted "
            f"behind that many prompt tokens still in prefill gets its first token within about the target.",
            throughput_caveat(c.setting(pick.setting))]


def throughput_caveat(s: SettingSummary) -> str:
    """Whether the suggestion's throughput is the server's (requests waited or were refused: the load was above
    what it could take) or only the load's (none did: what the server could prefill is higher, the value low)."""
    waited, rejected = s.signals.get("max_waiting") or 0, s.values.get("rejected") or 0
    waited = waited if waited >= 2 else 0  # one request seen waiting at a /metrics read arrived between steps
    head = "The throughput is the one this plan's load drew: "
    if waited or rejected:
        seen = f"up to {waited:,.0f} requests waited" if waited else f"admission refused {rejected:,.0f}"
        return head + f"at {s.setting} {seen}, so the load exceeded what the server took: the figure is its own."
    return head + (f"at {s.setting} no queue formed and none was rejected, so it is the prompts the load offered, "
                   "not what the server could prefill: the value is a lower bound, and a queue capped at it refuses "
                   "sooner than it needs to; measure under a load above capacity for the server's own.")


QUEUED_TOKENS_HEAD = ["setting", "TTFT target (s)", "prefill throughput (tokens/s)", "measured from",
                      "max_num_queued_tokens"]


def queued_tokens_rows(c: Comparison) -> list[list[str]]:
    return [[q.setting, f"{q.ttft_target_s:g}", f"{q.prefill_tokens_per_s:,.0f}", q.source,
             f"{q.max_num_queued_tokens:,}"] for q in c.queued_tokens]
