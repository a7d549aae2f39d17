"""Running a plan: each setting × repeat restarted, loaded, measured and saved, with --resume and clean stops.

The order is pure (`plan_runs`: every setting for repeat 0, then repeat 1..., so slow drift of the machine does
not load one setting); `run_one` drives one run: start the server, read /metrics before, every second during
and after, run `batchscope load` for warm-up + window, stop the server, then compute and save the RunResult
(run.json written last and atomically: a run folder without it is unfinished and is redone by --resume).
With a live file (batchscope.live_run), each run's start replaces it with where the server and the load's
client metrics answer, for an exporter that follows it.
A signal (SIGINT, SIGTERM) raises `Interrupted` in the main thread; `run_one`'s cleanup stops the load and the
server and leaves no run.json. The cleanup itself is not interrupted (`signals_deferred`): a signal that lands
in it is raised once the server is stopped, so no server is left holding the GPU and the port.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import requests
import yaml
from pydantic import ValidationError

from batchscope.listen import free_port
from batchscope.live_run import LiveRun
from batchscope.nested import first_difference
from batchscope.vllm_log import failure_cause
from tuner.backends import CAUSE_LINES, Server, StartFailed, die_with_parent, make_server, stop_process, tail
from tuner.compare import changed_params
from tuner.plan import BASELINE, Plan, PlanError, ServingParams
from tuner.progress import Progress, read_client
from tuner.results import PLAN_FILE, RUN_FILE, RunResult, RunStart, now_iso, run_name, save, write_atomically
from tuner.signals import (
    MetricsPoint,
    client_figures,
    good_requests,
    parse_metrics,
    read_summary,
    request_samples,
    server_signals,
)

SAMPLE_INTERVAL_S = 1.0
MAX_SAMPLES = 24 * 3600  # a day of one-second samples: bounded memory whatever the window
LOAD_GRACE_S = 120.0  # beyond warm-up + window: Locust's start, the stop and the summary
LOAD_STOP_GRACE_S = 30.0  # the load generator aborts what is in flight and writes its summary first
# Recording rules read per run when a Prometheus is given: name -> PromQL over the window ({w} seconds).
PROMETHEUS_QUERIES = {
    "preemptions_rate_max": "max_over_time(sum(model:vllm_preemptions:rate1m)[{w}s:])",
    "generation_tokens_rate_mean": "avg_over_time(sum(model:vllm_generation_tokens:rate1m)[{w}s:])",
    "prompt_tokens_rate_mean": "avg_over_time(sum(model:vllm_prompt_tokens:rate1m)[{w}s:])",
    "queue_time_mean_max": "max_over_time(max(model:vllm_queue_time_seconds:mean1m)[{w}s:])",
    "client_completions_rate_mean": "avg_over_time(sum(scenario:batchscope_client_completions:rate1m)[{w}s:])",
}


class Interrupted(Exception):  # noqa: N818 - a user's request, not an error
    """SIGINT or SIGTERM arrived; the current run is abandoned cleanly."""


@dataclass(frozen=True)
class PlannedRun:
    index: int
    setting: str
    params: ServingParams
    repeat: int

    @property
    def name(self) -> str:
        return run_name(self.setting, self.repeat)


def plan_runs(plan: Plan) -> list[PlannedRun]:
    """Every setting × repeat, repeats interleaved (baseline first within each)."""
    settings = plan.settings()
    order = [(setting, params, repeat) for repeat in range(plan.repeats) for setting, params in settings]
    return [PlannedRun(i + 1, *entry) for i, entry in enumerate(order)]


def diff(baseline: ServingParams, params: ServingParams) -> list[str]:
    """What a setting changes, as 'field: old → new' (the exporter's change-log wording)."""
    return [f"{change.name}: {change.arrow()}" for change in changed_params(baseline, params)]


# --- the plan loop ------------------------------------------------------------------------------------------

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
            else run_one(plan, run, run_dir, server, progress, live_file)
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
    from tuner.whatif import run_what_if  # another module's work; imported when used

    progress.set_phase("virtual clock")
    return run_what_if(plan, run.setting, run.params, run.repeat)


# --- one run ------------------------------------------------------------------------------------------------

def run_one(plan: Plan, run: PlannedRun, run_dir: Path, server: Server, progress: Progress,
            live_file: Path | None = None) -> RunResult:
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
        annotate(plan, run, *window)
    return result


@dataclass
class LoadProcess:
    process: subprocess.Popen
    metrics_port: int
    out: Path
    started: float


def start_load(plan: Plan, run: PlannedRun, run_dir: Path, url: str) -> LoadProcess:
    spec_path = run_dir / "spec.yaml"
    spec = plan.run_spec()
    # the key stays out of files: the load generator takes it from the environment
    spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude={"api_key"}), sort_keys=False))
    env = {**os.environ, "BATCHSCOPE_API_KEY": spec.api_key.get_secret_value()} if spec.api_key else None
    port = free_port()
    out = run_dir / "load"
    argv = [sys.executable, "-m", "batchscope.cli", "load", "--spec", str(spec_path), "--host", url,
            "--out", str(out), "--run-id", plan.run_id(run.setting, run.repeat), "--metrics-port", str(port)]
    with open(run_dir / "load.log", "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                   preexec_fn=die_with_parent)
    return LoadProcess(process, port, out, time.monotonic())


def write_live_file(path: Path, plan: Plan, run: PlannedRun, command_line: list[str], url: str, metrics_port: int,
                    started_at: str) -> None:
    """Point a following exporter at this run: its server and its load's client metrics (replaced atomically)."""
    live = LiveRun(vllm_url=url, loadgen_url=f"http://127.0.0.1:{metrics_port}", command_line=command_line,
                   plan=plan.name, setting=run.setting, repeat=run.repeat, started_at=started_at)
    write_atomically(path, live.model_dump_json(indent=2) + "\n")


def follow_load(plan: Plan, load: LoadProcess, server: Server, progress: Progress) -> str | None:
    """Wait for the load to end, showing its phase and live figures; the reason if the server died meanwhile."""
    deadline = load.started + plan.warmup_s + plan.window_s + LOAD_GRACE_S
    while True:
        try:
            load.process.wait(timeout=0.5)
            return None
        except subprocess.TimeoutExpired:
            pass
        if not server.alive():
            return "server died during the run: " + (failure_cause(server.log_tail(CAUSE_LINES)) or "no output")
        if time.monotonic() > deadline:
            return f"load generator still running {LOAD_GRACE_S:g} s after the window's end"
        elapsed = time.monotonic() - load.started
        progress.set_phase("warm-up" if elapsed < plan.warmup_s else "window")
        progress.update_client(read_client(load.metrics_port))


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
    result = RunResult(**base, finished_at=finished_at, status="failed" if code else "ok", failure=failure,
                       client=client_figures(summary, good_requests(records, summary, plan.slos)),
                       samples=request_samples(records, summary),
                       server=signals,
                       prometheus=query_prometheus(plan.prometheus_url, summary.window_start_s, window_end))
    return result, (summary.window_start_s, window_end)


# --- vLLM's /metrics ----------------------------------------------------------------------------------------

def fetch_metrics(url: str, path: Path | None = None) -> MetricsPoint | None:
    """One read of /metrics (saved raw when a path is given); None when the server does not answer."""
    try:
        reply = requests.get(url + "/metrics", timeout=5)
        reply.raise_for_status()
    except requests.RequestException:
        return None
    if path is not None:
        path.write_text(reply.text)
    return parse_metrics(reply.text, time.time())


class MetricsSampler:
    """Reads /metrics every second on a thread, keeping the points (bounded) and appending them to a JSONL file."""

    def __init__(self, url: str, path: Path, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.url, self.path, self.interval_s = url, path, interval_s
        self.points: deque[MetricsPoint] = deque(maxlen=MAX_SAMPLES)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        with open(self.path, "a") as out:
            while not self._stop.is_set():
                point = fetch_metrics(self.url)
                if point is not None:
                    self.points.append(point)
                    out.write(point.model_dump_json() + "\n")
                    out.flush()
                self._stop.wait(self.interval_s)  # the sampling period; stop() cuts it short


# --- Prometheus and Grafana (optional) ----------------------------------------------------------------------

def query_prometheus(url: str | None, start: float, end: float) -> dict[str, float | None]:
    """The recording rules of PROMETHEUS_QUERIES over the window, evaluated at its end; None where empty."""
    if not url:
        return {}
    window = max(int(round(end - start)), 1)
    values: dict[str, float | None] = {}
    for name, query in PROMETHEUS_QUERIES.items():
        try:
            reply = requests.get(url.rstrip("/") + "/api/v1/query",
                                 params={"query": query.format(w=window), "time": f"{end:.3f}"}, timeout=10)
            result = reply.json()["data"]["result"]
            values[name] = float(result[0]["value"][1]) if result else None
        except (requests.RequestException, ValueError, KeyError, IndexError, TypeError):
            values[name] = None
    return values


def annotate(plan: Plan, run: PlannedRun, start: float, stop: float) -> None:
    """One Grafana region over the window, tagged with the setting, its text the change from the baseline."""
    if not plan.grafana_url:
        return
    changes = diff(plan.baseline, run.params) or ["baseline"]
    body = {"time": int(start * 1000), "timeEnd": int(stop * 1000), "tags": ["batchscope", "tuner", run.setting],
            "text": f"{plan.name} {run.name}: " + ", ".join(changes)}
    session = requests.Session()
    if os.environ.get("GRAFANA_TOKEN"):
        session.headers["Authorization"] = f"Bearer {os.environ['GRAFANA_TOKEN']}"
    elif os.environ.get("GRAFANA_USER"):
        session.auth = (os.environ["GRAFANA_USER"], os.environ.get("GRAFANA_PASSWORD", ""))
    try:
        reply = session.post(plan.grafana_url.rstrip("/") + "/api/annotations", json=body, timeout=10)
        if reply.status_code >= 300:
            print(f"tune: grafana annotation refused: HTTP {reply.status_code}", file=sys.stderr)
    except requests.RequestException as exc:
        print(f"tune: grafana annotation failed: {exc.__class__.__name__}", file=sys.stderr)


# --- signals --------------------------------------------------------------------------------------------------

class StopOnSignal:
    """Within the block, the first SIGINT or SIGTERM raises Interrupted (at once, or when the cleanup it landed
    in ends: ``signals_deferred``); later ones wait for the cleanup."""

    active: ClassVar[StopOnSignal | None] = None  # signal handlers are the process's: one block at a time

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self.raised = False
        self.deferring = 0  # nested signals_deferred blocks
        self._previous: dict = {}

    def __enter__(self) -> StopOnSignal:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        StopOnSignal.active = self
        return self

    def __exit__(self, *exc) -> None:
        StopOnSignal.active = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, number: int, _frame) -> None:
        if self.received is None:
            self.received = signal.Signals(number)
            if not self.deferring:
                self.interrupt()

    def interrupt(self) -> None:
        assert self.received is not None, "a signal arrived"
        self.raised = True
        raise Interrupted(self.received.name)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Cleanup that must finish (stopping the load and the server): a first signal that lands inside raises
    Interrupted when the block ends, not in the middle of it."""
    guard = StopOnSignal.active
    if guard is None:
        yield
        return
    guard.deferring += 1
    try:
        yield
    finally:
        guard.deferring -= 1
    if not guard.deferring and guard.received is not None and not guard.raised:
        guard.interrupt()
