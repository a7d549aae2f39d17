"""MLPerf's scenarios for each setting of a plan: `server` (the highest Poisson rate meeting the p99 bounds) and
`offline` (all requests at once, throughput). The search logic is tuner/mlperf.py's; this drives it with real-time
runs (the plan's backend, restarted per point) or what-if runs, and keeps every point's data.

Layout: results/<plan>[.what-if]/mlperf-<scenario>/<setting>.json (the search or the offline result) and one
folder per point, <setting>/rate-<rps>/ or <setting>/offline/, holding that run's data and run.json.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from tuner.backends import Server, make_server
from tuner.mlperf import OfflineResult, ServerSearch, offline_plan, offline_throughput, poisson_plan, search_server
from tuner.plan import Plan, ServingParams
from tuner.progress import Progress
from tuner.results import RUN_FILE, RunResult, write_atomically
from tuner.runner import PlannedRun, run_one, what_if_run

SCENARIOS = ("server", "offline")
ScenarioResult = ServerSearch | OfflineResult


def run_scenario(plan: Plan, plan_dir: Path, scenario: str, *, what_if: bool, live_file: Path | None,
                 progress: Progress, start_rps: float, offline_requests: int) -> list[ScenarioResult]:
    """Run ``scenario`` for every setting of the plan; return (and save) one result per setting."""
    server = None if what_if else make_server(plan.backend)
    out_dir = plan_dir / f"mlperf-{scenario}"
    results: list[ScenarioResult] = []
    for index, (setting, params) in enumerate(plan.settings(), start=1):
        progress.begin(index, f"{scenario} {setting}")
        points = _Points(plan, setting, params, out_dir / setting, server, progress, live_file)
        result: ScenarioResult
        if scenario == "server":
            result = search_server(setting, points.at_rate, plan.slos, start_rps=start_rps)
        else:
            result = offline_throughput(partial(points.offline, offline_requests))
        write_atomically(out_dir / f"{setting}.json", result.model_dump_json(indent=2))
        results.append(result)
    return results


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

    def at_rate(self, rate: float) -> RunResult:
        return self._measure(poisson_plan(self.plan, rate), f"rate-{rate:g}")

    def offline(self, requests: int) -> RunResult:
        return self._measure(offline_plan(self.plan, requests), "offline")

    def _measure(self, point_plan: Plan, folder: str) -> RunResult:
        run, run_dir = PlannedRun(0, self.setting, self.params, 0), self.setting_dir / folder
        if run_dir.exists():
            shutil.rmtree(run_dir)  # the same point measured again (a rerun of the scenario): start clean
        result = what_if_run(point_plan, run, self.progress) if self.server is None \
            else run_one(point_plan, run, run_dir, self.server, self.progress, self.live_file)
        write_atomically(run_dir / RUN_FILE, result.model_dump_json(indent=2))
        return result


def describe(result: ScenarioResult) -> str:
    """One line per setting for the console."""
    if isinstance(result, ServerSearch):
        low, high = result.bracket_low_rps, result.bracket_high_rps
        bracket = f"[{_rate(low)}, {_rate(high)}] req/s"
        return (f"server {result.setting}: highest rate meeting p99 TTFT/TPOT bounds in {bracket} "
                f"after {len(result.points)} runs")
    if result.status != "ok":
        return f"offline {result.setting}: failed ({result.failure})"
    return (f"offline {result.setting}: {result.requests_per_s:.2f} req/s, {result.output_tokens_per_s:.0f} "
            f"output tokens/s ({result.completed} requests in {result.duration_s:.1f} s)")


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"

