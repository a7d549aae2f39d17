"""One real-time run: start the server, read /metrics before, every second during and after, run the load for
warm-up + window, stop the server, then compute the RunResult (a failed start or a server gone mid-run is a failed
run, not an exception). A signal during the run abandons it: the cleanup stops the load and the server first
(tuner.stopping) and no run.json is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from batchscope.tuner.plan import Plan, PlannedRun
from batchscope.tuner.results import (
    MetricsPoint,
    RunResult,
    RunStart,
    measured_client,
    now_iso,
    read_summary,
    server_signals,
)
from batchscope.tuner.run.load_process import LOAD_STOP_GRACE_S, LoadProcess, follow_load, start_load, write_live_file
from batchscope.tuner.run.metrics_sampler import MetricsSampler, fetch_metrics
from batchscope.tuner.run.observers import annotate, query_prometheus
from batchscope.tuner.run.progress import Progress
from batchscope.tuner.run.servers import Server, StartFailed, stop_process, tail
from batchscope.tuner.run.stopping import signals_deferred

if TYPE_CHECKING:
    from batchscope.runs.annotations import GrafanaAnnotator


def run_one(plan: Plan, run: PlannedRun, run_dir: Path, server: Server, progress: Progress,
            live_file: Path | None = None, annotator: GrafanaAnnotator | None = None) -> RunResult:
    """Start, measure, stop; a start failure or a server gone mid-run is a failed run, not an exception."""
    run_dir.mkdir(parents=True)
    started_at = now_iso()
    base = RunStart(plan=plan.name, setting=run.setting, repeat=run.repeat, mode="real-time", params=run.params,
                    conditions=plan.run_spec(), started_at=started_at)
    progress.set_phase("starting server")
    try:
        started = server.start(run.params, run_dir / "server.log")
    except StartFailed as exc:
        base["command_line"] = exc.command_line
        return RunResult(**base, finished_at=now_iso(), status="failed", failure=str(exc), log_tail=exc.log_tail)
    except BaseException:  # a signal while it started (its own cleanup may not have covered every step)
        with signals_deferred():
            server.stop()
        raise
    sampler = MetricsSampler(started.url, run_dir / "metrics-samples.jsonl")
    load = None
    try:
        base["command_line"], base["reported"] = started.command_line, started.reported
        before = fetch_metrics(started.url, run_dir / "metrics-before.prom")
        sampler.start()
        load = start_load(plan, run, run_dir, started.url)
        if live_file is not None:
            write_live_file(live_file, plan, run, started.command_line, started.url, load.metrics_port, started_at)
        died = follow_load(plan, load, server, progress)
        after = fetch_metrics(started.url, run_dir / "metrics-after.prom") if not died else None
    finally:
        with signals_deferred():
            sampler.stop()
            if load is not None:
                stop_process(load.process, LOAD_STOP_GRACE_S, LOAD_STOP_GRACE_S / 3)
            progress.set_phase("stopping")
            log_tail = server.log_tail()
            server.stop()
    if died:
        return RunResult(**base, finished_at=now_iso(), status="failed", failure=died, log_tail=log_tail)
    points = [p for p in (before, *sampler.points, after) if p is not None]
    result, window = measured(plan, base, started.reported.kv_capacity_tokens, load, points, run_dir)
    if window is not None:
        annotate(annotator, plan, run, *window)
    return result


def measured(plan: Plan, base: RunStart, kv_capacity_tokens: int | None, load: LoadProcess,
             points: list[MetricsPoint], run_dir: Path) -> tuple[RunResult, tuple[float, float] | None]:
    """The RunResult from what the run left (the summary's figures, the records, the /metrics points), and the
    measurement window (Unix seconds) when there was one."""
    code = load.process.returncode
    summary = read_summary(load.out)
    finished_at = now_iso()
    if summary is None:
        last = (tail((run_dir / "load.log").read_text(errors="replace"), 1) or ["no output"])[-1]
        return RunResult(**base, finished_at=finished_at, status="failed",
                         failure=f"load generator exited with status {code} and wrote no summary: {last}"), None
    window_end = summary.window_start_s + summary.effective_duration_s
    records = load.out / "records.jsonl"
    failure = summary.failure or (f"load generator exited with status {code}" if code else None)
    signals = server_signals(points, summary.window_start_s, window_end, kv_capacity_tokens) \
        if points else None
    client, samples = measured_client(records, summary, plan.slos)
    result = RunResult(**base, finished_at=finished_at, status="failed" if code else "ok", failure=failure,
                       client=client, samples=samples, server=signals,
                       prometheus=query_prometheus(plan.prometheus_url, summary.window_start_s, window_end))
    return result, (summary.window_start_s, window_end)
