"""The comparison report of a plan's folder: report.md, report.html (plots inline), report.csv, comparison.json.

`write_report(plan_dir)` reads plan.json and every finished run, compares them (tuner.compare) and writes the
files; the MLPerf results found beside them (report/mlperf.py) are sections after the comparison, or the whole
report of a folder holding only those. Words and numbers: report/text.py; plots: report/plots.py.
"""

from __future__ import annotations

import csv
import html
import io
from pathlib import Path

from batchscope.tuner.compare import METRICS, Comparison, compare
from batchscope.tuner.plan import BASELINE, TUNABLE, Plan, Slos
from batchscope.tuner.report.blocks import Block, Heading, Paragraph
from batchscope.tuner.report.html import html_blocks, html_figure, html_page, html_table, markdown_bold
from batchscope.tuner.report.mlperf import is_scenario_dir, scenario_blocks, scenario_dirs
from batchscope.tuner.report.plots import PLOTS, png
from batchscope.tuner.report.prediction import prediction_blocks
from batchscope.tuner.report.recommendation import recommendation_lines
from batchscope.tuner.report.text import (
    ADMISSION_HEAD,
    METRIC_HEAD,
    QUEUED_TOKENS_HEAD,
    admission_rows,
    baseline_line,
    changed_text,
    ci_line,
    conditions_rows,
    metric_rows,
    mode_line,
    queued_tokens_lines,
    queued_tokens_rows,
    settings_head,
    settings_rows,
    slo_text,
    verdict_lines,
)
from batchscope.tuner.results import PLAN_FILE, load_results, write_atomically

CSV_COLUMNS = ("setting", "metric", "unit", "baseline", "value", "delta", "ci_low", "ci_high", "significant",
               "relative", "ci_method", "evidence")


def write_report(plan_dir: Path) -> list[Path]:
    """Compare the plan's runs and write report.md, report.html, report.csv and comparison.json, the scenarios'
    sections included; without runs, report.md and report.html of the scenarios alone; return the paths."""
    plan_dir = Path(plan_dir)
    scenarios = prediction_blocks(plan_dir) + scenario_blocks(scenario_dirs(plan_dir))
    results = [] if is_scenario_dir(plan_dir) else load_results(plan_dir)
    if not results:
        if not scenarios:
            raise ValueError(f"no finished runs under {plan_dir} (no */run.json) and no MLPerf scenario "
                             f"results (no mlperf-server/ or mlperf-offline/)")
        return _write(plan_dir, {"report.md": scenarios_markdown(plan_dir, scenarios),
                                 "report.html": scenarios_html(plan_dir, scenarios)})
    plan = read_plan(plan_dir)
    order = [v.name for v in plan.variations] if plan else None
    comparison = compare(results, plan.slos if plan else Slos(), order=order,
                         objective=plan.objective if plan else "goodput")
    return _write(plan_dir, {
        "report.md": render_markdown(comparison, scenarios),
        "report.html": render_html(comparison, scenarios),
        "report.csv": render_csv(comparison),
        "comparison.json": comparison.model_dump_json(indent=2),
    })


def _write(folder: Path, outputs: dict[str, str]) -> list[Path]:
    for name, text in outputs.items():
        write_atomically(folder / name, text)
    return [folder / name for name in outputs]


def read_plan(plan_dir: Path) -> Plan | None:
    """plan_dir/plan.json as a Plan, or None when the runner did not leave one."""
    path = plan_dir / PLAN_FILE
    return Plan.model_validate_json(path.read_text()) if path.exists() else None


# --- Markdown ---------------------------------------------------------------------------------------------

def md_table(head: list[str], rows: list[list[str]]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown_blocks(blocks: list[Block]) -> list[str]:
    """The scenario sections' blocks as Markdown lines."""
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            out += ["#" * block.level + " " + block.text, ""]
        elif isinstance(block, Paragraph):
            out += [block.text, ""]
        else:
            out += [md_table(block.head, block.rows), ""]
    return out


def scenarios_markdown(folder: Path, blocks: list[Block]) -> str:
    """report.md of a folder holding only scenario results."""
    return "\n".join([f"# MLPerf scenarios: {folder.name}", "", *markdown_blocks(blocks)])


def render_markdown(c: Comparison, scenarios: list[Block] | None = None) -> str:
    """report.md: conditions, settings, verdicts, one section per variation, failed runs, then the scenarios'
    sections (when the plan folder has any)."""
    out = [f"# Tuning report: {c.plan}", "", *[f"{line}\n" for line in recommendation_lines(c)], mode_line(c), "",
           ci_line(c), "",
           "## Locked conditions", "", md_table(["condition", "value"], [list(r) for r in conditions_rows(c)]), "",
           f"SLOs: {slo_text(c.slos)}.", "",
           "## Settings", "", baseline_line(c), "", md_table(settings_head(c), settings_rows(c)), "",
           "## Verdicts", "", *[f"- {line}" for line in verdict_lines(c)], "",
           "## Goodput and admission rejections", "", md_table(ADMISSION_HEAD, admission_rows(c)), "",
           *[f"{line}\n" for line in queued_tokens_lines(c)]]
    if c.queued_tokens:
        out += [md_table(QUEUED_TOKENS_HEAD, queued_tokens_rows(c)), ""]
    for v in c.variations:
        out += [f"## {v.setting}: {changed_text(c, v.setting)}", "", f"**Explanation:** {v.explanation}", "",
                md_table(METRIC_HEAD, metric_rows(v.metrics)), ""]
    out += ["## Failed runs", ""]
    if c.failed:
        out += [md_table(["run", "failure"], [[f"{f.setting}-r{f.repeat}", f.failure] for f in c.failed]), ""]
    else:
        out += ["None.", ""]
    out += markdown_blocks(scenarios or [])
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
        for metric in METRICS:
            value = base.values.get(metric.key)
            zero = None if value is None else 0.0
            writer.writerow([BASELINE, metric.key, metric.unit, fmt(value), fmt(value), fmt(zero), "", "", "",
                             fmt(zero), "n/a", "n/a"])
    for v in c.variations:
        for m in v.metrics:
            writer.writerow([v.setting, m.metric, m.unit, fmt(m.baseline), fmt(m.value), fmt(m.delta),
                             fmt(m.ci_low), fmt(m.ci_high), fmt(m.significant), fmt(m.relative), m.method,
                             m.evidence])
    return buffer.getvalue()


# --- HTML -------------------------------------------------------------------------------------------------

# the metric tables' column of ✓/✗/n/a marks
METRIC_MARKS = frozenset({METRIC_HEAD.index("significant")})


def scenarios_html(folder: Path, blocks: list[Block]) -> str:
    """report.html of a folder holding only scenario results."""
    title = f"MLPerf scenarios: {folder.name}"
    return html_page(title, [f"<h1>{html.escape(title)}</h1>", *html_blocks(blocks)])


def _settings_table(c: Comparison) -> str:
    """Its meets-SLOs column of marks, and its knob columns (long names over short values) set vertically."""
    head = settings_head(c)
    knobs = frozenset(i for i, name in enumerate(head) if name in TUNABLE)
    return html_table(head, settings_rows(c), marks=frozenset({head.index("meets SLOs")}), vertical=knobs)


def render_html(c: Comparison, scenarios: list[Block] | None = None) -> str:
    """report.html: the Markdown report's content plus the plots, one self-contained page."""
    out = [f"<h1>Tuning report: {html.escape(c.plan)}</h1>",
           *[f"<p class='recommendation'>{markdown_bold(line)}</p>" for line in recommendation_lines(c)],
           f"<p>{markdown_bold(mode_line(c))}</p>", f"<p class='note'>{html.escape(ci_line(c))}</p>",
           "<h2>Locked conditions</h2>", html_table(["condition", "value"], [list(r) for r in conditions_rows(c)]),
           f"<p>SLOs: {html.escape(slo_text(c.slos))}.</p>",
           "<h2>Settings</h2>", f"<p>{html.escape(baseline_line(c))}</p>",
           _settings_table(c),
           "<h2>Verdicts</h2>", "<ul>" + "".join(f"<li>{markdown_bold(x)}</li>" for x in verdict_lines(c)) + "</ul>",
           "<h2>Goodput and admission rejections</h2>", html_table(ADMISSION_HEAD, admission_rows(c)),
           *[f"<p>{markdown_bold(line)}</p>" for line in queued_tokens_lines(c)]]
    if c.queued_tokens:
        out.append(html_table(QUEUED_TOKENS_HEAD, queued_tokens_rows(c)))
    out.append("<h2>Plots</h2>")
    drawn = ((plot_id, caption, draw(c)) for plot_id, caption, draw in PLOTS)
    out += [html_figure(plot_id, caption, png(figure)) for plot_id, caption, figure in drawn if figure is not None]
    for v in c.variations:
        out += [f"<h2>{html.escape(v.setting)}: {html.escape(changed_text(c, v.setting))}</h2>",
                f"<p class='explanation'><strong>Explanation:</strong> {html.escape(v.explanation)}</p>",
                html_table(METRIC_HEAD, metric_rows(v.metrics), marks=METRIC_MARKS)]
    out.append("<h2>Failed runs</h2>")
    if c.failed:
        out.append(html_table(["run", "failure"], [[f"{f.setting}-r{f.repeat}", f.failure] for f in c.failed]))
    else:
        out.append("<p>None.</p>")
    out += html_blocks(scenarios or [])
    out.append(f"<p class='note'>Comparison schema {c.schema_version}, batchscope {html.escape(c.tool_version)}.</p>")
    return html_page(f"Tuning report: {c.plan}", out)
