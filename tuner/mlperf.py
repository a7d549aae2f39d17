"""MLPerf Inference's two LLM scenarios for one configuration: Server (rate search) and Offline (throughput).

Server: the highest Poisson arrival rate whose run meets the p99 TTFT and p99 TPOT bounds. The search is a
pure state machine, ``next_rate(state, last_point)``: bracket first (double the rate from the start until a
bound is violated; halve it while the start already violates), then bisect until the bracket is within a
relative tolerance or the point budget is spent. Each point is one fixed-duration run through ``measure(rate)``
(the what-if runner on the virtual clock, or the real-time runner).

The rule for a point (state it when quoting a result): the bounds apply to the requests that *completed in the
run's window* (the load generator's summary rule). Above capacity a fixed-duration Poisson run is not
stationary: the queue grows through the window, so its completed requests carry ever longer queueing in their
TTFT and the run violates; a run that completes nothing, or fails, violates too. Like MLPerf, the Server and
Offline results are separate figures and are never mixed.

Offline: every request released at t=0, no latency bound; throughput = completed / (last end - window start).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from pydantic import BaseModel, Field

import batchscope
from loadgen.spec import OfflineLoad, PoissonLoad
from tuner.plan import Plan, Slos
from tuner.results import RunResult, now_iso

SCHEMA_VERSION: Final = 1
POINT_RULE = ("bounds on the p99 TTFT and p99 TPOT of the requests completed in each run's window; a run with "
              "no completed request, or a failed one, violates")


class ServerPoint(BaseModel):
    """One fixed-duration Poisson run of the search."""

    rate_rps: float = Field(description="Poisson arrival rate of the run, requests/s.")
    meets: bool = Field(description="Both p99 bounds met by the window's completed requests.")
    ttft_p99_s: float | None = Field(None, description="p99 TTFT of the window's completed requests, seconds.")
    tpot_p99_s: float | None = Field(None, description="p99 TPOT of the window's completed requests, seconds.")
    completion_throughput_rps: float = Field(0.0, description="Requests completed in the window / window, req/s.")
    failure: str | None = Field(None, description="Why the run failed, when it did (counts as a violation).")


class SearchState(BaseModel):
    """Everything the search decides from: its settings and the bracket so far (no I/O, no clock)."""

    start_rps: float = Field(gt=0, description="First rate tried, requests/s.")
    tolerance: float = Field(0.05, gt=0, lt=1, description="Stop when (high - low) / high is at most this.")
    max_points: int = Field(12, ge=1, le=100, description="Most runs the search makes.")
    low_rps: float | None = Field(None, description="Highest rate seen meeting both bounds.")
    high_rps: float | None = Field(None, description="Lowest rate seen violating a bound.")
    measured: int = Field(0, description="Runs made so far.")


def next_rate(state: SearchState, last_point: ServerPoint | None) -> float | None:
    """Fold ``last_point`` into the bracket and return the next rate to run, or None when the search is done."""
    if last_point is None:
        return state.start_rps if state.measured < state.max_points else None
    state.measured += 1
    if last_point.meets:
        state.low_rps = max(state.low_rps or 0.0, last_point.rate_rps)
    else:
        state.high_rps = min(state.high_rps or float("inf"), last_point.rate_rps)
    if state.measured >= state.max_points:
        return None
    low, high = state.low_rps, state.high_rps
    if high is None:
        assert low is not None  # the point just folded in set one end of the bracket
        return 2 * low  # every rate so far met: double
    if low is None:
        return high / 2  # even the start violated: halve
    if low >= high or (high - low) / high <= state.tolerance:
        return None  # bracketed within the tolerance (or noise put a pass above a failure: stop, report both)
    return (low + high) / 2


def judge(rate: float, run: RunResult, slos: Slos) -> ServerPoint:
    """A run's verdict under the bounds (see the module's rule)."""
    client = run.client
    if run.status != "ok" or client is None or client.completed == 0:
        return ServerPoint(rate_rps=rate, meets=False, failure=run.failure or "no request completed in the window")
    ttft, tpot = client.ttft.p99, client.tpot.p99
    meets = _within(ttft, slos.ttft_p99_s) and _within(tpot, slos.tpot_p99_s)
    return ServerPoint(rate_rps=rate, meets=meets, ttft_p99_s=ttft, tpot_p99_s=tpot,
                       completion_throughput_rps=client.completion_throughput_rps)


def _within(value: float | None, bound: float | None) -> bool:
    # no bound: met; no value (e.g. one-token outputs have no TPOT): nothing violates it
    return bound is None or value is None or value <= bound


class ServerSearch(BaseModel):
    """MLPerf Server for one configuration: the rate bracket and every point measured."""

    schema_version: int = Field(SCHEMA_VERSION, description="Bumped on any breaking change.")
    tool_version: str = Field(batchscope.__version__, description="batchscope version that wrote it.")
    started_at: str = Field(description="Search start, ISO 8601 UTC.")
    setting: str = Field(description="'baseline' or the variation's name.")
    bracket_low_rps: float | None = Field(description="Highest rate seen meeting both bounds (None: none did).")
    bracket_high_rps: float | None = Field(description="Lowest rate seen violating a bound (None: none did).")
    points: list[ServerPoint] = Field(description="Every run, in the order made.")
    slos: Slos = Field(description="The bounds (p99 TTFT, p99 TPOT).")
    rule: str = Field(POINT_RULE, description="Which requests the bounds apply to.")
    tolerance: float = Field(description="Relative bracket width the search stops at.")
    max_points: int = Field(description="Run budget of the search.")


def search_server(setting: str, measure: Callable[[float], RunResult], slos: Slos, start_rps: float = 1.0,
                  tolerance: float = 0.05, max_points: int = 12) -> ServerSearch:
    """Drive next_rate with ``measure(rate)``, one fixed-duration Poisson run per point."""
    started = now_iso()
    state = SearchState(start_rps=start_rps, tolerance=tolerance, max_points=max_points)
    points: list[ServerPoint] = []
    point = None
    while (rate := next_rate(state, point)) is not None:
        point = judge(rate, measure(rate), slos)
        points.append(point)
    return ServerSearch(started_at=started, setting=setting, bracket_low_rps=state.low_rps,
                        bracket_high_rps=state.high_rps, points=points, slos=slos, tolerance=tolerance,
                        max_points=max_points)


class OfflineResult(BaseModel):
    """MLPerf Offline for one configuration: all requests at once, throughput only."""

    schema_version: int = Field(SCHEMA_VERSION, description="Bumped on any breaking change.")
    tool_version: str = Field(batchscope.__version__, description="batchscope version that wrote it.")
    started_at: str = Field(description="Run start, ISO 8601 UTC.")
    setting: str = Field(description="'baseline' or the variation's name.")
    status: str = Field(description="'ok' or 'failed'.")
    failure: str | None = Field(None, description="Why the run failed, when it did.")
    completed: int = Field(0, description="Requests completed in the window.")
    duration_s: float = Field(0.0, description="Window: its start to the last request's end, seconds.")
    requests_per_s: float = Field(0.0, description="completed / duration_s.")
    output_tokens_per_s: float = Field(0.0, description="Output tokens delivered in the window / duration_s.")


def offline_throughput(measure_offline: Callable[[], RunResult]) -> OfflineResult:
    """Run the offline scenario once and report its throughput."""
    started = now_iso()
    run = measure_offline()
    client = run.client
    if run.status != "ok" or client is None:
        return OfflineResult(started_at=started, setting=run.setting, status="failed",
                             failure=run.failure or "the run failed")
    return OfflineResult(started_at=started, setting=run.setting, status="ok", completed=client.completed,
                         duration_s=client.window_s, requests_per_s=client.completion_throughput_rps,
                         output_tokens_per_s=client.output_tokens_per_s)


def poisson_plan(plan: Plan, rate: float) -> Plan:
    """The plan with its load replaced by Poisson arrivals at ``rate`` (warm-up, window, lengths kept)."""
    cap = plan.workload.load.max_in_flight if isinstance(plan.workload.load, PoissonLoad) else 512
    return _with_load(plan, PoissonLoad(rate=rate, max_in_flight=cap))


def offline_plan(plan: Plan, requests: int) -> Plan:
    """The plan with its load replaced by ``requests`` released at t=0 and no warm-up (MLPerf Offline)."""
    return _with_load(plan, OfflineLoad(requests=requests)).model_copy(update={"warmup_s": 0.0})


def _with_load(plan: Plan, load: PoissonLoad | OfflineLoad) -> Plan:
    workload = plan.workload.model_copy(update={"load": load})
    return plan.model_copy(update={"workload": workload})
