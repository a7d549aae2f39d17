"""Running a plan: each setting × repeat restarted, loaded, measured and saved, with --resume and clean stops.

The plan's order is plan/order.py's; each run is one_run.py's (real time) or whatif.py's (the virtual clock);
run.json is written last and atomically, so a run folder without it is unfinished and is redone by --resume. A
signal stops the plan between or inside runs cleanly (stopping.py). The other jobs have modules of their own:
the load process (load_process.py), /metrics sampling (metrics_sampler.py), Prometheus and Grafana
(observers.py).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from batchscope.tuner.compare import first_difference
from batchscope.tuner.plan import BASELINE, Plan, PlanError, PlannedRun, plan_runs
from batchscope.tuner.results import PLAN_FILE, RUN_FILE, RunResult, save, write_atomically
from batchscope.tuner.run.observers import grafana_annotator
from batchscope.tuner.run.one_run import run_one
from batchscope.tuner.run.progress import Progress
from batchscope.tuner.run.servers import Server, make_server

if TYPE_CHECKING:
    from batchscope.runs.annotations import GrafanaAnnotator

ANNOTATIONS_DRAIN_S = 30.0  # at the plan's end, for the last runs' Grafana regions to be delivered


def prepare_plan_dir(plan: Plan, plan_dir: Path, resume: bool) -> None:
    """Write plan.json; refuse to mix runs of another plan, or to overwrite runs without --resume."""
    if plan_dir.exists() and not plan_dir.is_dir():
        raise PlanError(f"results: {plan_dir} is a file, not a folder")
    written = plan_dir / PLAN_FILE
    if any(plan_dir.glob(f"*/{RUN_FILE}")) and not resume:
        raise PlanError(f"results: {plan_dir} already holds runs; pass --resume to finish the plan, or remove it")
    if resume and written.exists():
        _refuse_another_plan(written, json.loads(plan.model_dump_json()))
    write_atomically(written, plan.model_dump_json(indent=2))


def _refuse_another_plan(written: Path, plan: dict) -> None:
    """PlanError naming the first field on which the plan differs from the one that wrote the folder."""
    try:
        before = json.loads(written.read_text())
    except (OSError, ValueError):
        raise PlanError(f"results: {written} is not a plan written by batchscope tune; remove the folder") from None
    if not isinstance(before, dict):
        before = {}
    with contextlib.suppress(ValidationError):  # a field added since, at its default, is not a change
        before = json.loads(Plan.model_validate(before).model_dump_json())
    difference = first_difference(before, plan)
    if difference is not None:
        field, old, new = difference
        raise PlanError(f"results: --resume needs the same plan, but {field} is {old!r} in {written} and {new!r} "
                        "now; restore it, or write to another --results folder")


def run_plan(plan: Plan, plan_dir: Path, *, resume: bool, what_if: bool, live_file: Path | None,
             progress: Progress) -> list[RunResult]:
    """Run every planned run not finished yet; return the results written by this call."""
    prepare_plan_dir(plan, plan_dir, resume)
    server = None if what_if else make_server(plan.backend)
    annotator = None if what_if else grafana_annotator(plan)
    try:
        return _run_each(plan, plan_dir, server, progress, live_file, annotator)
    finally:
        if annotator is not None:
            annotator.close(ANNOTATIONS_DRAIN_S)


def _run_each(plan: Plan, plan_dir: Path, server: Server | None, progress: Progress, live_file: Path | None,
              annotator: GrafanaAnnotator | None) -> list[RunResult]:
    done = []
    for run in plan_runs(plan):
        run_dir = plan_dir / run.name
        if (run_dir / RUN_FILE).exists():
            progress.note(f"run {run.index}/{progress.total} {run.name}: done before, skipped")
            continue
        if run_dir.exists():
            shutil.rmtree(run_dir)  # an interrupted run: its partial data would mix with the new one
        progress.begin(run.index, run.name)
        result = what_if_run(plan, run, progress) if server is None \
            else run_one(plan, run, run_dir, server, progress, live_file, annotator)
        save(result, plan_dir)
        done.append(result)
        progress.note(f"run {run.index}/{progress.total} {run.name}: {result.status}"
                      + (f" ({result.failure})" if result.failure else ""))
    return done


def nothing_compared(plan: Plan, results: list[RunResult]) -> str | None:
    """Why a plan's finished runs compare nothing, in one line: every baseline run failed, or every variation's
    did; None when a variation can be compared with the baseline (or the plan has only the baseline)."""
    ok = {result.setting for result in results if result.status == "ok"}
    if BASELINE not in ok:
        failure = next((r.failure for r in results if r.setting == BASELINE and r.failure), "no reason recorded")
        return f"the baseline failed in every run ({failure}): nothing to compare with"
    if plan.variations and ok == {BASELINE}:
        return "every variation failed: nothing was compared with the baseline"
    return None


def what_if_run(plan: Plan, run: PlannedRun, progress: Progress) -> RunResult:
    from batchscope.tuner.whatif import run_what_if  # another module's work; imported when used

    progress.set_phase("virtual clock")
    return run_what_if(plan, run.setting, run.params, run.repeat)
