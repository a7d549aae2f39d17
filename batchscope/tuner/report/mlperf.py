"""The MLPerf scenarios' sections of a report: Server (the sustained-rate bracket per setting, every point with
its checks and the enforced timing) and Offline (throughput per setting).

They come from results/<plan>[.what-if]/mlperf-<scenario>/<setting>.json (tuner/mlperf/measure.py). A plan
folder's report adds them after the one-knob comparison; a folder holding only scenario results (the plan folder
of a scenario-only plan, or an mlperf-<scenario> folder itself) gets a report of them alone. The sections are
blocks (headings, paragraphs, tables) that files.py renders as Markdown and as HTML.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from batchscope.tuner.mlperf import FOLDER_PREFIX, OfflineResult, ServerPoint, ServerSearch
from batchscope.tuner.report.blocks import Block, Heading, Paragraph, Table
from batchscope.tuner.report.text import slo_text

SERVER_DIR, OFFLINE_DIR = f"{FOLDER_PREFIX}server", f"{FOLDER_PREFIX}offline"
FOLDERS = (SERVER_DIR, OFFLINE_DIR)
SERVER_HEAD = ["setting", "sustained (highest passing), req/s", "lowest failing, req/s", "failed there",
               "runs", "offline, req/s"]
POINT_HEAD = ["rate, req/s", "warm-up, s", "window, s", "offered", "completed", "completed / offered",
              "waiting, 1st → 2nd half", "waiting at end", "p99 TTFT, ms", "p99 TPOT, ms", "result", "why"]
OFFLINE_HEAD = ["setting", "status", "requests", "duration, s", "req/s", "output tokens/s"]


def is_scenario_dir(folder: Path) -> bool:
    """Whether ``folder`` is a scenario's results folder (mlperf-server/ or mlperf-offline/)."""
    return folder.name in FOLDERS


def scenario_dirs(folder: Path) -> list[Path]:
    """The scenario folders a report of ``folder`` covers, holding results: itself when it is one, else its
    mlperf-server/ and mlperf-offline/ (in that order)."""
    candidates = [folder] if is_scenario_dir(folder) else [folder / name for name in FOLDERS]
    return [d for d in candidates if d.is_dir() and _result_files(d)]


def scenario_blocks(dirs: list[Path]) -> list[Block]:
    """The sections of the scenario folders ``dirs`` (scenario_dirs' order)."""
    offline = _load_offline(next((d for d in dirs if d.name == OFFLINE_DIR), None))
    blocks: list[Block] = []
    for folder in dirs:
        if folder.name == SERVER_DIR:
            blocks += server_blocks(_load(folder, ServerSearch), offline)
        else:
            blocks += offline_blocks(offline)
    return blocks


Result = TypeVar("Result", ServerSearch, OfflineResult)


def _load(folder: Path, model: type[Result]) -> list[Result]:
    results = [model.model_validate_json(path.read_text()) for path in _result_files(folder)]
    return sorted(results, key=lambda r: r.started_at)  # run order: the plan's order of settings


def _load_offline(folder: Path | None) -> list[OfflineResult]:
    return _load(folder, OfflineResult) if folder is not None else []


def _result_files(folder: Path) -> list[Path]:
    # <setting>.json beside its points' folder <setting>/ (a report's own files are not results)
    return [path for path in folder.glob("*.json") if (folder / path.stem).is_dir()]


def server_blocks(searches: list[ServerSearch], offline: list[OfflineResult]) -> list[Block]:
    """The Server section: the floor and checks in words, the bracket per setting, then each setting's points."""
    if not searches:
        return []
    ceiling = {o.setting: o.requests_per_s for o in offline if o.status == "ok"}
    first = searches[0]
    rows = [[s.setting, _rate(s.bracket_low_rps), _rate(s.bracket_high_rps), _failed_at_high(s), str(len(s.points)),
             _throughput(ceiling.get(s.setting))] for s in searches]
    blocks: list[Block] = [
        Heading(2, "MLPerf Server: highest sustained Poisson rate"),
        Paragraph(f"{_mode(first.mode)} Bounds: {slo_text(first.slos)}. {_rule_text(first)}"),
        Table(SERVER_HEAD, rows),
        Paragraph("Offline throughput (all requests at once) is beside it for reference only: no rate much above "
                  "it is sustained (its start and drain keep it slightly under the steady capacity). Server and "
                  "Offline are separate figures."),
    ]
    for search in searches:
        blocks += [Heading(3, f"Server points: {search.setting}"),
                   Table(POINT_HEAD, [_point_row(p) for p in search.points])]
    return blocks


def _rule_text(search: ServerSearch) -> str:
    if search.schema_version < 2:
        return "Written before the sustained-rate checks: its points were judged on the latency bounds only."
    rules = search.rules
    return (f"A rate passes only when the server kept up with it: p99 TTFT and TPOT of the window's completed "
            f"requests within the bounds; completed / offered ≥ {rules.kept_up_ratio:.0%}; the mean waiting queue "
            f"(vLLM's num_requests_waiting) grew from the window's first half to its second by at most "
            f"{rules.queue_growth_ratio:.1%} of the offered queries; the requests waiting at the end could start "
            f"within the TTFT bound at the completion rate; at least {rules.min_queries:,} queries arrived. "
            f"Enforced floor of every point: warm-up at least the longest E2E the bounds allow, window at least "
            f"{rules.min_duration_s:g} s and (N + 3√N) / rate for N = {rules.min_queries:,} queries (MLPerf's "
            f"LoadGen runs at least its min_duration, 600 s, and min_query_count queries; here the window is "
            f"shorter and N queries are enforced). Search: "
            f"doubling then bisection to {search.tolerance:.0%}, at most {search.max_points} runs.")


def _failed_at_high(search: ServerSearch) -> str:
    point = next((p for p in search.points if p.rate_rps == search.bracket_high_rps), None)
    return "—" if point is None else why(point)


def _point_row(p: ServerPoint) -> list[str]:
    flow = p.flow
    measured = ["n/a"] * 5 if flow is None else [
        f"{p.offered:,}", f"{p.completed:,}", f"{p.completed / p.offered:.1%}" if p.offered else "n/a",
        f"{flow.waiting_first_half:.1f} → {flow.waiting_second_half:.1f}", f"{flow.waiting_end:g}"]
    return [f"{p.rate_rps:g}", _seconds(p.warmup_s), _seconds(p.window_s), *measured, _ms(p.ttft_p99_s),
            _ms(p.tpot_p99_s), "pass" if p.meets else "fail", why(p)]


def why(point: ServerPoint) -> str:
    """Why a point passed or failed: the failed checks' details, its run's failure, or 'every check passed'."""
    if point.failure:
        return point.failure
    if not point.checks:  # written before the checks (schema 1): judged on the latency bounds alone
        return "latency bounds met" if point.meets else "a latency bound violated"
    failed = point.failed_checks()
    return "; ".join(f"{c.name}: {c.detail}" for c in failed) if failed else "every check passed"


def offline_blocks(results: list[OfflineResult]) -> list[Block]:
    """The Offline section: one row per setting."""
    if not results:
        return []
    rows = [[r.setting, r.status if r.failure is None else f"{r.status}: {r.failure}", f"{r.completed:,}",
             _seconds(r.duration_s), _throughput(r.requests_per_s), f"{r.output_tokens_per_s:,.0f}"] for r in results]
    return [Heading(2, "MLPerf Offline: all requests at once"),
            Paragraph(f"{_mode(results[0].mode)} Every request released at t = 0, no latency bound; throughput = "
                      f"completed / (last end − start)."),
            Table(OFFLINE_HEAD, rows)]


def _mode(mode: str) -> str:
    return "What-if: on the simulator's virtual clock." if mode == "what-if" else "Real time: a live server."


def _rate(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


def _throughput(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _seconds(value: float) -> str:
    return f"{value:,.1f}"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:,.0f}"
