"""`batchscope tune PLAN` and `batchscope report PLAN_DIR`: the one-knob method, run and reported.

Options and exit statuses are in the parsers' help and docs/tuner.md (Commands): 0 the plan ran (failed runs are
recorded), 2 bad input, 4 nothing could be compared, 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from batchscope.inputs import exits
from batchscope.tuner.compare import Comparison
from batchscope.tuner.mlperf import FOLDER_PREFIX, SCENARIOS, ServerRules, describe, nothing_measured, run_scenario
from batchscope.tuner.plan import Plan, PlanError, load_plan, plan_runs
from batchscope.tuner.report import WHAT_IF_SUFFIX, console_lines, scenario_dirs
from batchscope.tuner.results import PLAN_FILE, RUN_FILE, CannotWrite, check_writable, load_results
from batchscope.tuner.run import Interrupted, Progress, StopOnSignal, nothing_compared, run_plan


def add_parser(commands: argparse._SubParsersAction) -> None:
    tune = commands.add_parser("tune", help="run a tuning plan: one serving parameter changed at a time")
    tune.add_argument("plan", help="plan YAML file")
    tune.add_argument("--results", default="results", metavar="DIR", help="results folder (default: results)")
    tune.add_argument("--resume", action="store_true", help="skip finished runs, redo unfinished ones")
    tune.add_argument("--what-if", action="store_true", help="run every setting on the simulator's virtual clock")
    tune.add_argument("--live-file", metavar="FILE",
                      help="at each run's start, write where its server and client metrics answer and its command "
                           "line here (JSON, replaced atomically): `batchscope exporter --follow FILE` shows the run")
    tune.add_argument("--scenario", choices=SCENARIOS,
                      help="MLPerf scenario per setting instead of the plan's load: server (highest Poisson rate "
                           "sustained within the plan's p99 TTFT/TPOT bounds) or offline (all requests at once)")
    tune.add_argument("--start-rps", type=float, default=1.0, help="server scenario: first rate tried, req/s")
    tune.add_argument("--min-queries", type=int, default=ServerRules().min_queries,
                      help="server scenario: queries each point's window must receive (the window is stretched "
                           "to fit them at the probed rate; MLPerf's min_query_count, scaled down)")
    tune.add_argument("--requests", type=int, default=1000, help="offline scenario: requests released at once")
    tune.set_defaults(run=run_tune)
    report = commands.add_parser("report", help="write the comparison report of a plan's results (with its "
                                                 "MLPerf scenarios' results), or of a scenario's alone")
    report.add_argument("plan_dir", help="results/<plan> or results/<plan>/mlperf-<scenario> folder")
    report.set_defaults(run=run_report)


def run_tune(args: argparse.Namespace) -> int:
    try:
        plan = load_plan(args.plan)
        results = Path(args.results)
        if results.exists() and not results.is_dir():
            raise PlanError(f"--results: {results} is a file, not a folder")
        if args.live_file and Path(args.live_file).is_dir():
            raise PlanError(f"--live-file: {args.live_file} is a folder, not a file")
        runs = plan_runs(plan)
    except PlanError as exc:
        return _error(str(exc))
    plan_dir = results / (plan.name + (WHAT_IF_SUFFIX if args.what_if else ""))
    live_file = Path(args.live_file) if args.live_file else None
    # an unusable folder is bad input, found before any server starts (not a traceback at a run's first file)
    folders = [("--live-file", live_file.parent)] if live_file else []
    for flag, folder in [*folders, ("--results", plan_dir)]:
        try:
            check_writable(folder)
        except CannotWrite as exc:
            return _error(f"{flag}: {exc}")
    if args.scenario:
        return run_mlperf(args, plan, plan_dir, live_file)
    try:
        with StopOnSignal(), Progress(total=len(runs)) as progress:
            done = run_plan(plan, plan_dir, resume=args.resume, what_if=args.what_if, live_file=live_file,
                            progress=progress)
    except PlanError as exc:
        return _error(str(exc))
    except Interrupted as exc:
        print(f"batchscope tune: interrupted ({exc}); finished runs are saved, --resume completes the plan",
              file=sys.stderr)
        return exits.INTERRUPTED
    failed = sum(1 for result in done if result.status == "failed")
    print(f"batchscope tune: {len(done)} runs done ({failed} failed), {len(runs) - len(done)} done before; "
          f"results in {plan_dir}")
    try:
        _print_report(plan_dir)
    except (ValueError, CannotWrite) as exc:  # the runs stand; the report says why it cannot compare them
        print(f"batchscope tune: no report: {exc}", file=sys.stderr)
    problem = nothing_compared(plan, load_results(plan_dir))  # this call's runs and those done before (--resume)
    if problem:
        print(f"batchscope tune: error: {problem}", file=sys.stderr)
        return exits.RUN_FAILED
    return exits.OK


def run_mlperf(args: argparse.Namespace, plan: Plan, plan_dir: Path, live_file: Path | None) -> int:
    if not 0 < args.start_rps <= 1e6:
        return _error("--start-rps: must be in (0, 1e6] req/s")
    if not 0 < args.requests <= 1_000_000:
        return _error("--requests: must be in 1..1000000")
    if not 0 < args.min_queries <= 1_000_000:
        return _error("--min-queries: must be in 1..1000000")
    try:
        with StopOnSignal(), Progress(total=len(plan.settings())) as progress:
            results = run_scenario(plan, plan_dir, args.scenario, what_if=args.what_if, live_file=live_file,
                                   progress=progress, start_rps=args.start_rps, offline_requests=args.requests,
                                   rules=ServerRules(min_queries=args.min_queries))
    except Interrupted as exc:
        print(f"batchscope tune: interrupted ({exc})", file=sys.stderr)
        return exits.INTERRUPTED
    for result in results:
        print(describe(result))
    out_dir = plan_dir / f"{FOLDER_PREFIX}{args.scenario}"
    print(f"batchscope tune: {args.scenario} scenario results in {out_dir}")
    try:
        _print_report(out_dir)
    except CannotWrite as exc:  # the results stand
        print(f"batchscope tune: no report: {exc}", file=sys.stderr)
    problem = nothing_measured(results)
    if problem:
        print(f"batchscope tune: error: {problem}", file=sys.stderr)
        return exits.RUN_FAILED
    return exits.OK


def run_report(args: argparse.Namespace) -> int:
    plan_dir = Path(args.plan_dir)
    problem = not_a_results_folder(plan_dir)
    if problem:
        return _error(f"plan_dir: {plan_dir} {problem}; expected a results folder (results/<plan> or "
                      "results/<plan>/mlperf-<scenario>)", "report")
    try:
        _print_report(plan_dir)
    except (ValueError, CannotWrite) as exc:  # no finished run, runs whose conditions differ, a folder it cannot write
        return _error(str(exc), "report")
    return exits.OK


def not_a_results_folder(path: Path) -> str:
    """Why ``path`` is no folder a report can be written of ("" when it is one)."""
    if not path.exists():
        return "does not exist"
    if not path.is_dir():
        return "is a file"
    if (path / PLAN_FILE).is_file() or scenario_dirs(path) or any(path.glob(f"*/{RUN_FILE}")):
        return ""
    return f"has no results (no {PLAN_FILE}, */{RUN_FILE} or mlperf-*/)"


def _print_report(plan_dir: Path) -> None:
    from batchscope.tuner.report import write_report  # matplotlib and the statistics: loaded only to write a report

    written = write_report(plan_dir)
    for path in written:
        print(f"report: {path}")
    comparison = next((path for path in written if path.name == "comparison.json"), None)
    if comparison is not None:  # goodput, rejections and the max_num_queued_tokens suggestion at a glance
        for line in console_lines(Comparison.model_validate_json(comparison.read_text())):
            print(line)


def _error(message: str, command: str = "tune") -> int:
    print(f"batchscope {command}: error: {message}", file=sys.stderr)
    return exits.BAD_INPUT
