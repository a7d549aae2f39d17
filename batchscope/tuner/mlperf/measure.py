"""MLPerf's scenarios for each setting of a plan: `server` (the highest Poisson rate sustained within the p99
bounds) and `offline` (all requests at once, throughput). The search and its checks are rules.py's; this drives
them with real-time runs (the plan's backend, restarted per point) or what-if runs, and gives each point its
flow: the arrivals offered in the window and vLLM's waiting queue through it (on the virtual clock the engine's
num_waiting at every step; in real time the load generator's summary and the /metrics samples).

Layout: results/<plan>[.what-if]/mlperf-<scenario>/<setting>.json (the search or the offline result) and one
folder per point, <setting>/rate-<rps>/ or <setting>/offline/, holding that run's data and run.json.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from batchscope.loadgen import PoissonLoad
from batchscope.tuner.mlperf.rules import (
    FOLDER_PREFIX,
    OfflineResult,
    PointFlow,
    QueueSample,
    ServerPoint,
    ServerRules,
    ServerSearch,
    flow_of,
    offline_plan,
    offline_throughput,
    poisson_plan,
    search_server,
)
from batchscope.tuner.plan import BASELINE, Plan, PlannedRun, ServingParams
from batchscope.tuner.results import RUN_FILE, MetricsPoint, RunResult, read_summary, write_atomically
from batchscope.tuner.run import (
    ANNOTATIONS_DRAIN_S,
    Progress,
    Server,
    grafana_annotator,
    make_server,
    run_one,
    what_if_run,
)
from batchscope.vllm.catalogue import NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING
from batchscope.workload import poisson

if TYPE_CHECKING:
    from batchscope.runs.annotations import GrafanaAnnotator
    from batchscope.simulator import EngineCore, Step

SCENARIOS = ("server", "offline")
ScenarioResult = ServerSearch | OfflineResult
WAITING, RUNNING = NUM_REQUESTS_WAITING.name, NUM_REQUESTS_RUNNING.name


def run_scenario(plan: Plan, plan_dir: Path, scenario: str, *, what_if: bool, live_file: Path | None,
                 progress: Progress, start_rps: float, offline_requests: int,
                 rules: ServerRules | None = None) -> list[ScenarioResult]:
    """Run ``scenario`` for every setting of the plan; return (and save) one result per setting."""
    server = None if what_if else make_server(plan.backend)
    annotator = None if what_if else grafana_annotator(plan)
    try:
        return _run_settings(plan, plan_dir / f"{FOLDER_PREFIX}{scenario}", scenario, start_rps, offline_requests,
                             _Points(plan, "", plan.baseline, plan_dir, server, progress, live_file,
                                     rules or ServerRules(), annotator))
    finally:
        if annotator is not None:
            annotator.close(ANNOTATIONS_DRAIN_S)


def _run_settings(plan: Plan, out_dir: Path, scenario: str, start_rps: float, offline_requests: int,
                  template: _Points) -> list[ScenarioResult]:
    results: list[ScenarioResult] = []
    for index, (setting, params) in enumerate(plan.settings(), start=1):
        template.progress.begin(index, f"{scenario} {setting}")
        points = replace(template, setting=setting, params=params, setting_dir=out_dir / setting)
        result: ScenarioResult
        if scenario == "server":
            result = search_server(setting, points.at_rate, plan.slos, points.rules, start_rps=start_rps,
                                   plan=plan.name, mode="what-if" if points.server is None else "real-time")
        else:
            result = offline_throughput(partial(points.offline, offline_requests))
        write_atomically(out_dir / f"{setting}.json", result.model_dump_json(indent=2))
        results.append(result)
    return results


@dataclass
class QueueTrace:
    """The engine's waiting and running counts at each step of a virtual run (run_timed's observer)."""

    samples: list[QueueSample] = field(default_factory=list)

    def observe(self, engine: EngineCore, step: Step) -> None:
        self.samples.append((step.start, engine.num_waiting, engine.num_running))


@dataclass(frozen=True)
class _Points:
    """Measures the points of one setting's scenario, each into its own folder under the setting's."""

    plan: Plan
    setting: str
    params: ServingParams
    setting_dir: Path
    server: Server | None
    progress: Progress
    live_file: Path | None
    rules: ServerRules
    annotator: GrafanaAnnotator | None

    def at_rate(self, rate: float) -> tuple[RunResult, PointFlow | None]:
        point_plan = poisson_plan(self.plan, rate, self.rules)
        run_dir = self._clean(f"rate-{rate:g}")
        if self.server is None:
            self.progress.set_phase("virtual clock")
            run, flow = measure_what_if(point_plan, self.setting, self.params)
        else:
            run = run_one(point_plan, PlannedRun(0, self.setting, self.params, 0), run_dir, self.server,
                          self.progress, self.live_file, self.annotator)
            flow = _real_time_flow(run_dir) if run.status == "ok" else None
        write_atomically(run_dir / RUN_FILE, run.model_dump_json(indent=2))
        return run, flow

    def offline(self, requests: int) -> RunResult:
        point_plan, run_dir = offline_plan(self.plan, requests), self._clean("offline")
        planned = PlannedRun(0, self.setting, self.params, 0)
        run = what_if_run(point_plan, planned, self.progress) if self.server is None \
            else run_one(point_plan, planned, run_dir, self.server, self.progress, self.live_file, self.annotator)
        write_atomically(run_dir / RUN_FILE, run.model_dump_json(indent=2))
        return run

    def _clean(self, folder: str) -> Path:
        run_dir = self.setting_dir / folder
        if run_dir.exists():
            shutil.rmtree(run_dir)  # the same point measured again (a rerun of the scenario): start clean
        return run_dir


def measure_what_if(point_plan: Plan, setting: str, params: ServingParams) -> tuple[RunResult, PointFlow | None]:
    """A server point on the virtual clock (repeat 0) and its flow: the arrivals are the ones run_what_if draws
    (same seed), the queue the engine's at every step."""
    from batchscope.tuner.whatif import run_what_if  # the virtual clock: another module's, loaded when used

    load = point_plan.workload.load
    assert isinstance(load, PoissonLoad), "a server point is a Poisson run (mlperf.poisson_plan)"
    trace = QueueTrace()
    run = run_what_if(point_plan, setting, params, 0, on_step=trace.observe)
    if run.status != "ok":
        return run, None
    start = point_plan.warmup_s
    end = start + point_plan.window_s
    arrivals = poisson.before(end, load.rate, point_plan.workload.seed)
    return run, flow_of(int((arrivals >= start).sum()), trace.samples, start, end)


def _real_time_flow(run_dir: Path) -> PointFlow | None:
    """A real-time point's flow: offered from the load generator's summary, the queue from the /metrics samples
    read every second (None when the summary or the samples are missing)."""
    summary = read_summary(run_dir / "load")
    samples_path = run_dir / "metrics-samples.jsonl"
    if summary is None or summary.offered_rate_rps is None or not samples_path.exists():
        return None
    points = [MetricsPoint.model_validate_json(line) for line in samples_path.read_text().splitlines() if line]
    samples = sorted((p.t, p.values.get(WAITING, 0.0), p.values.get(RUNNING, 0.0)) for p in points)
    start, duration = summary.window_start_s, summary.effective_duration_s
    return flow_of(round(summary.offered_rate_rps * duration), samples, start, start + duration)


def describe(result: ScenarioResult) -> str:
    """One line per setting for the console."""
    if isinstance(result, ServerSearch):
        low, high = result.bracket_low_rps, result.bracket_high_rps
        bracket = f"[{_rate(low)}, {_rate(high)}] req/s"
        failing = next((p for p in result.points if p.rate_rps == high), None)
        why = f"; at {_rate(high)}: {why_failed(failing)}" if failing is not None else ""
        return (f"server {result.setting}: highest sustained rate within the p99 TTFT/TPOT bounds in {bracket} "
                f"after {len(result.points)} runs{why}")
    if result.status != "ok":
        return f"offline {result.setting}: failed ({result.failure})"
    return (f"offline {result.setting}: {result.requests_per_s:.2f} req/s, {result.output_tokens_per_s:.0f} "
            f"output tokens/s ({result.completed} requests in {result.duration_s:.1f} s)")


def failure_of(result: ScenarioResult) -> str | None:
    """Why a setting's scenario measured nothing (its offline run failed, or every server point's run did); None
    when it measured something (a server point that ran but missed the bounds is a measurement)."""
    if isinstance(result, OfflineResult):
        return None if result.status == "ok" else result.failure or "failed (no reason recorded)"
    failures = [point.failure for point in result.points]
    return failures[0] or "failed (no reason recorded)" if failures and all(failures) else None


def nothing_measured(results: list[ScenarioResult]) -> str | None:
    """Why a scenario's results compare nothing, in one line (the plan's rule: tuner.run.runner.nothing_compared)."""
    failures = {result.setting: failure_of(result) for result in results}
    if failures.get(BASELINE) is not None:
        return f"the baseline's runs all failed ({failures[BASELINE]}): nothing to compare with"
    if len(failures) > 1 and all(failure is not None for setting, failure in failures.items() if setting != BASELINE):
        return "every variation's runs failed: nothing was compared with the baseline"
    return None


def why_failed(point: ServerPoint) -> str:
    """The names of a failed point's failed checks (or its run's failure)."""
    return point.failure or ", ".join(check.name for check in point.failed_checks()) or "passed"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"
