"""The comparison report of a plan: report.md, report.html (self-contained, plots inline), report.csv.

`write_report(plan_dir)` reads plan.json (the Plan; without it the runs' own conditions and the default SLOs)
and every finished run, compares them (tuner.compare) and writes the three files plus comparison.json (the
Comparison model, for machines). Human tables show latencies in ms and KV usage in %; the CSV and the JSON keep
base units (s, ratio). Plots are drawn with matplotlib's Agg backend and embedded as base64 PNG, so the HTML
page opens anywhere, offline.
"""

from __future__ import annotations

import base64
import csv
import html
import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: render to PNG only (must precede pyplot's import)
import matplotlib.pyplot as plt  # noqa: E402

from tuner.compare import (  # noqa: E402
    BASELINE,
    METRICS,
    Comparison,
    MetricDelta,
    compare,
)
from tuner.plan import Plan, Slos  # noqa: E402
from tuner.results import PLAN_FILE, load_results, write_atomically  # noqa: E402

FILES = ("report.md", "report.html", "report.csv", "comparison.json")
CSV_COLUMNS = ("setting", "metric", "unit", "baseline", "value", "delta", "ci_low", "ci_high", "significant",
               "relative", "ci_method")
# Metrics drawn as change-vs-baseline bars with their CI (the ones every run has a per-request or count basis for)
BAR_METRICS = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "itl_p50", "itl_p99", "e2e_p50", "e2e_p99",
               "completion_throughput_rps", "output_tokens_per_s")
SIGNAL_METRICS = ("preemptions", "max_waiting", "kv_usage_peak", "errors")


def write_report(plan_dir: Path) -> list[Path]:
    """Compare the plan's runs and write report.md, report.html, report.csv and comparison.json; return paths."""
    plan_dir = Path(plan_dir)
    results = load_results(plan_dir)
    if not results:
        raise ValueError(f"report: no finished runs under {plan_dir} (no */run.json)")
    plan = read_plan(plan_dir)
    order = [v.name for v in plan.variations] if plan else None
    comparison = compare(results, plan.slos if plan else Slos(), order=order)
    outputs = {
        "report.md": render_markdown(comparison),
        "report.html": render_html(comparison),
        "report.csv": render_csv(comparison),
        "comparison.json": comparison.model_dump_json(indent=2),
    }
    paths = []
    for name in FILES:
        write_atomically(plan_dir / name, outputs[name])
        paths.append(plan_dir / name)
    return paths


def read_plan(plan_dir: Path) -> Plan | None:
    """plan_dir/plan.json as a Plan, or None when the runner did not leave one."""
    path = plan_dir / PLAN_FILE
    return Plan.model_validate_json(path.read_text()) if path.exists() else None


# --- formatting -------------------------------------------------------------------------------------------

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
    return ", ".join(f"{p.name} {p.baseline} → {p.value}" for p in variation.changed) or "nothing"


def settings_rows(c: Comparison) -> list[list[str]]:
    rows = []
    for s in c.settings:
        p = s.params
        slo = {True: "✓", False: "✗", None: "n/a"}[s.meets_slos]
        capacity = f"{s.kv_capacity_tokens:,}" if s.kv_capacity_tokens is not None else "n/a"
        rows.append([s.setting, changed_text(c, s.setting), str(p.max_num_seqs), f"{p.max_num_batched_tokens:,}",
                     f"{p.gpu_memory_utilization:g}", f"{p.max_model_len:,}", str(p.block_size), capacity,
                     str(s.runs_ok), str(s.runs_failed), slo])
    return rows


SETTINGS_HEAD = ["setting", "changed", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
                 "max_model_len", "block_size", "KV capacity (tokens)", "runs ok", "runs failed", "meets SLOs"]
METRIC_HEAD = ["metric", "unit", "baseline", "value", "delta", "delta %", "95% CI of delta", "significant"]


def metric_rows(metrics: list[MetricDelta]) -> list[list[str]]:
    return [[m.label, display_unit(m.unit), shown(m.baseline, m.unit), shown(m.value, m.unit),
             shown(m.delta, m.unit, True), percent(m.relative), ci_text(m), significance(m)] for m in metrics]


def verdict_lines(c: Comparison) -> list[str]:
    lines = []
    for v in c.verdicts.best:
        if v.setting is None:
            lines.append(f"{v.objective}: none")
            continue
        unit = METRICS[[m.key for m in METRICS].index(v.metric)].unit
        note = {True: "significant vs baseline", False: "not significantly different from the baseline",
                None: "the baseline" if v.setting == BASELINE else "no CI"}[v.significant_vs_baseline]
        lines.append(f"{v.objective}: **{v.setting}** ({shown(v.value, unit)} {display_unit(unit)}; {note})")
    met = ", ".join(c.verdicts.met_slos) or "none"
    lines.append(f"Met the SLOs ({slo_text(c.slos)}): {met}")
    lines.append(f"Pareto front, TTFT p99 vs TPOT p99: {', '.join(c.verdicts.pareto_ttft_tpot) or 'none'}")
    return lines


# --- Markdown ---------------------------------------------------------------------------------------------

def md_table(head: list[str], rows: list[list[str]]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(c: Comparison) -> str:
    """report.md: conditions, settings, verdicts, one section per variation, failed runs."""
    out = [f"# Tuning report: {c.plan}", "", mode_line(c), "", ci_line(c), "",
           "## Locked conditions", "", md_table(["condition", "value"], [list(r) for r in conditions_rows(c)]), "",
           f"SLOs: {slo_text(c.slos)}.", "",
           "## Settings", "", md_table(SETTINGS_HEAD, settings_rows(c)), "",
           "## Verdicts", "", *[f"- {line}" for line in verdict_lines(c)], ""]
    for v in c.variations:
        out += [f"## {v.setting}: {changed_text(c, v.setting)}", "", f"**Explanation:** {v.explanation}", "",
                md_table(METRIC_HEAD, metric_rows(v.metrics)), ""]
    out += ["## Failed runs", ""]
    if c.failed:
        out += [md_table(["run", "failure"], [[f"{f.setting}-r{f.repeat}", f.failure] for f in c.failed]), ""]
    else:
        out += ["None.", ""]
    out += [f"_Comparison schema {c.schema_version}, batchscope {c.tool_version}._", ""]
    return "\n".join(out)


# --- CSV --------------------------------------------------------------------------------------------------

def render_csv(c: Comparison) -> str:
    """report.csv: one row per setting x metric, base units; the baseline's rows have delta 0 and no CI."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)

    def fmt(value: float | bool | None) -> str:
        return "" if value is None else str(value).lower() if isinstance(value, bool) else repr(float(value))

    base = c.setting(BASELINE) if any(s.setting == BASELINE for s in c.settings) else None
    if base is not None:
        for m in METRICS:
            value = base.values.get(m.key)
            writer.writerow([BASELINE, m.key, m.unit, fmt(value), fmt(value), fmt(None if value is None else 0.0),
                             "", "", "", fmt(None if value is None else 0.0), "n/a"])
    for v in c.variations:
        for m in v.metrics:
            writer.writerow([v.setting, m.metric, m.unit, fmt(m.baseline), fmt(m.value), fmt(m.delta),
                             fmt(m.ci_low), fmt(m.ci_high), fmt(m.significant), fmt(m.relative), m.method])
    return buffer.getvalue()


# --- plots ------------------------------------------------------------------------------------------------

SIGNIFICANT, NOT_SIGNIFICANT, BASE_COLOUR, FRONT = "#1f77b4", "#b0b0b0", "#555555", "#d62728"


def png(figure: plt.Figure) -> str:
    """The figure as base64 PNG (and closed: Agg figures otherwise accumulate)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def plot_deltas(c: Comparison) -> str:
    """One panel per metric: each variation's change vs the baseline, %, with the 95% CI as error bars."""
    figure, axes = plt.subplots(len(BAR_METRICS) // 2, 2, figsize=(11, 2.6 * (len(BAR_METRICS) // 2)),
                                squeeze=False)
    # settings without a finished run have nothing to draw (they are listed under failed runs)
    drawn = [v for v in c.variations if c.setting(v.setting).runs_ok]
    names = [v.setting for v in drawn]
    base_values = c.setting(BASELINE).values if any(s.setting == BASELINE for s in c.settings) else {}
    for ax, key in zip(axes.flat, BAR_METRICS, strict=True):
        deltas = [v.metric(key) for v in drawn]
        base = base_values.get(key)
        unit = METRICS[[m.key for m in METRICS].index(key)].unit
        heights, low, high, colours = [], [], [], []
        for m in deltas:
            rel = (m.relative or 0.0) * 100
            heights.append(rel)
            if m.ci_low is not None and m.baseline:
                low.append(max(rel - m.ci_low / m.baseline * 100, 0))
                high.append(max(m.ci_high / m.baseline * 100 - rel, 0))
            else:
                low.append(0)
                high.append(0)
            colours.append(SIGNIFICANT if m.significant else NOT_SIGNIFICANT)
        if names:
            ax.bar(names, heights, yerr=[low, high], color=colours, capsize=4, ecolor="black")
        else:
            ax.text(0.5, 0.5, "no variations", ha="center", va="center", transform=ax.transAxes)
        ax.axhline(0, color=BASE_COLOUR, linewidth=0.8)
        label = METRICS[[m.key for m in METRICS].index(key)].label
        ax.set_title(f"{label} (baseline {shown(base, unit)} {display_unit(unit)})", fontsize=10)
        ax.set_ylabel("change vs baseline (%)")
        ax.set_xlabel("setting")
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    figure.suptitle("Change vs baseline with 95% CI (blue: significant, grey: not)", fontsize=11)
    figure.tight_layout()
    return png(figure)


def plot_signals(c: Comparison) -> str:
    """Server-side signals per setting (values, not deltas): preemptions, max waiting, KV peak, errors."""
    figure, axes = plt.subplots(1, len(SIGNAL_METRICS), figsize=(13, 3.4), squeeze=False)
    settings = [s for s in c.settings if s.runs_ok]
    names = [s.setting for s in settings]
    for ax, key in zip(axes.flat, SIGNAL_METRICS, strict=True):
        metric = METRICS[[m.key for m in METRICS].index(key)]
        scale = 100 if metric.unit == "ratio" else 1
        values = [(s.values.get(key) or 0.0) * scale for s in settings]
        colours = [BASE_COLOUR if n == BASELINE else SIGNIFICANT for n in names]
        ax.bar(names, values, color=colours)
        ax.set_ylim(bottom=0, top=max([*values, 1]) * 1.1)  # all-zero bars: an axis from 0, not ±0.04
        ax.set_title(metric.label, fontsize=10)
        ax.set_ylabel(f"{metric.label} ({display_unit(metric.unit)})")
        ax.set_xlabel("setting")
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    figure.tight_layout()
    return png(figure)


def plot_pareto(c: Comparison) -> str:
    """TTFT p99 against TPOT p99 per setting, the Pareto front joined and highlighted, SLO bounds dashed."""
    figure, ax = plt.subplots(figsize=(7, 5))
    points = {s.setting: (s.values.get("ttft_p99"), s.values.get("tpot_p99")) for s in c.settings}
    points = {n: (x * 1000, y * 1000) for n, (x, y) in points.items() if x is not None and y is not None}
    front = [n for n in c.verdicts.pareto_ttft_tpot if n in points]
    for name, (x, y) in points.items():
        on_front = name in front
        ax.scatter(x, y, s=80 if on_front else 40, color=FRONT if on_front else NOT_SIGNIFICANT,
                   edgecolor="black", zorder=3)
    label_points(ax, points)
    if front:
        xs, ys = zip(*sorted(points[n] for n in front), strict=True)
        ax.plot(xs, ys, color=FRONT, linewidth=1.5, label="Pareto front", zorder=2)
    if c.slos.ttft_p99_s:
        ax.axvline(c.slos.ttft_p99_s * 1000, color=BASE_COLOUR, linestyle="--", label="SLO TTFT p99")
    if c.slos.tpot_p99_s:
        ax.axhline(c.slos.tpot_p99_s * 1000, color=BASE_COLOUR, linestyle=":", label="SLO TPOT p99")
    if not points:
        ax.text(0.5, 0.5, "no finished runs", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("TTFT p99 (ms)")
    ax.set_ylabel("TPOT p99 (ms)")
    ax.set_title("TTFT p99 vs TPOT p99 (lower-left is better)")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    return png(figure)


def plot_throughput_preemptions(c: Comparison) -> str:
    """Completion throughput against preemptions per setting: does throughput fall where preemption rises?"""
    figure, ax = plt.subplots(figsize=(7, 5))
    points = {}
    for s in c.settings:
        x, y = s.values.get("preemptions"), s.values.get("completion_throughput_rps")
        if x is None or y is None:
            continue
        points[s.setting] = (x, y)
        ax.scatter(x, y, s=60, color=BASE_COLOUR if s.setting == BASELINE else SIGNIFICANT, edgecolor="black")
    label_points(ax, points)
    if not points:
        ax.text(0.5, 0.5, "no finished runs", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("preemptions in the window (count)")
    ax.set_ylabel("completion throughput (req/s)")
    ax.set_title("Throughput vs preemptions")
    ax.grid(alpha=0.3)
    return png(figure)


def label_points(ax: plt.Axes, points: dict[str, tuple[float, float]]) -> None:
    """Name each point; settings that landed on the same spot share one label instead of overprinting."""
    spots: dict[tuple[float, float], list[str]] = {}
    for name, (x, y) in points.items():
        spots.setdefault((round(x, 6), round(y, 6)), []).append(name)
    for (x, y), names in spots.items():
        ax.annotate(", ".join(names), (x, y), textcoords="offset points", xytext=(6, 4), fontsize=9)


PLOTS = (
    ("deltas", "Change vs baseline per metric, with 95% CI", plot_deltas),
    ("signals", "Server signals per setting", plot_signals),
    ("pareto", "TTFT p99 vs TPOT p99 with the Pareto front", plot_pareto),
    ("throughput-preemptions", "Completion throughput vs preemptions", plot_throughput_preemptions),
)


# --- HTML -------------------------------------------------------------------------------------------------

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1300px; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f2f4f7; overflow-wrap: anywhere; } td:first-child, th:first-child { text-align: left; }
div.wide { overflow-x: auto; }
td.sig { color: #0a7a2f; font-weight: bold; text-align: center; }
.explanation { background: #f7f9fc; border-left: 4px solid #1f77b4; padding: 0.5em 0.8em; }
.note { color: #555; } figure { margin: 1em 0; } img.plot { max-width: 100%; border: 1px solid #eee; }
"""


def html_table(head: list[str], rows: list[list[str]], sig_column: int | None = None) -> str:
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = []
    for row in rows:
        cells = "".join(("<td class='sig'>" if i == sig_column else "<td>") + f"{html.escape(x)}</td>"
                        for i, x in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    return f"<div class='wide'><table><thead><tr>{header}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"


def markdown_bold(text: str) -> str:
    """The one Markdown construct verdict lines use (**bold**), as HTML, after escaping."""
    parts = html.escape(text).split("**")
    return "".join(f"<strong>{p}</strong>" if i % 2 else p for i, p in enumerate(parts))


def render_html(c: Comparison) -> str:
    """report.html: the Markdown report's content plus the plots, one self-contained page."""
    out = [f"<h1>Tuning report: {html.escape(c.plan)}</h1>",
           f"<p>{markdown_bold(mode_line(c))}</p>", f"<p class='note'>{html.escape(ci_line(c))}</p>",
           "<h2>Locked conditions</h2>", html_table(["condition", "value"], [list(r) for r in conditions_rows(c)]),
           f"<p>SLOs: {html.escape(slo_text(c.slos))}.</p>",
           "<h2>Settings</h2>", html_table(SETTINGS_HEAD, settings_rows(c), sig_column=len(SETTINGS_HEAD) - 1),
           "<h2>Verdicts</h2>", "<ul>" + "".join(f"<li>{markdown_bold(x)}</li>" for x in verdict_lines(c)) + "</ul>",
           "<h2>Plots</h2>"]
    for plot_id, caption, draw in PLOTS:
        out.append(f"<figure><img class='plot' id='plot-{plot_id}' alt='{html.escape(caption)}' "
                   f"src='data:image/png;base64,{draw(c)}'><figcaption>{html.escape(caption)}</figcaption></figure>")
    for v in c.variations:
        out += [f"<h2>{html.escape(v.setting)}: {html.escape(changed_text(c, v.setting))}</h2>",
                f"<p class='explanation'><strong>Explanation:</strong> {html.escape(v.explanation)}</p>",
                html_table(METRIC_HEAD, metric_rows(v.metrics), sig_column=len(METRIC_HEAD) - 1)]
    out.append("<h2>Failed runs</h2>")
    if c.failed:
        out.append(html_table(["run", "failure"], [[f"{f.setting}-r{f.repeat}", f.failure] for f in c.failed]))
    else:
        out.append("<p>None.</p>")
    out.append(f"<p class='note'>Comparison schema {c.schema_version}, batchscope {html.escape(c.tool_version)}.</p>")
    body = "\n".join(out)
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>Tuning report: "
            f"{html.escape(c.plan)}</title><style>{CSS}</style></head><body>\n{body}\n</body></html>\n")
