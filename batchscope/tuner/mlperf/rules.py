"""MLPerf Inference's Server and Offline scenarios for one configuration, as pure rules.

Server's rate search is a state machine (``next_rate``); a point passes when every check of ``judge`` does
(latency, kept up, queue growth, backlog, query count), and ``point_timing`` enforces its warm-up and window.
Offline is every request at t=0 and its throughput. The rules and why they need no drain: docs/tuner.md
(MLPerf scenarios).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Final, Literal

from pydantic import BaseModel, Field

from batchscope.loadgen import OfflineLoad, PoissonLoad
from batchscope.runs.provenance import Provenance
from batchscope.tuner.plan import Plan, Slos
from batchscope.tuner.results import RunResult, now_iso

SCHEMA_VERSION: Final = 2  # 2: points hold their checks, flow and enforced timing; the search its rules
POINT_RULE = ("a point passes when every check does: latency (p99 TTFT and p99 TPOT of the requests completed "
              "in the window within the bounds), kept up (completed / offered; a query rejected at admission is "
              "offered, not completed), queue growth (waiting, second "
              "half vs first), backlog (waiting at the end drains within the TTFT bound), query count; a run with "
              "no completed request, or a failed one, fails")
FOLDER_PREFIX = "mlperf-"  # a scenario's results: results/<plan>[.what-if]/mlperf-<scenario>/
Mode = Literal["real-time", "what-if"]
CheckName = Literal["latency", "kept up", "queue growth", "backlog", "query count"]


class ServerRules(BaseModel):
    """When a point counts as sustained, and the floor every point's timing is raised to."""

    min_queries: int = Field(1000, ge=1, le=1_000_000, description="Queries that must arrive in a point's window; "
                             "the window is stretched to (N + 3 sqrt(N)) / rate so that they do.")
    min_duration_s: float = Field(60.0, gt=0, description="Shortest window of a point, seconds.")
    kept_up_ratio: float = Field(0.95, gt=0, le=1, description="Least completed / offered over the window: a "
                                 "server falling behind by 5% or more fails; the in-flight count's change over a "
                                 "window of >= 1000 queries moves the ratio of one that keeps up by ~1-2%.")
    queue_growth_ratio: float = Field(0.025, ge=0, description="Most the window's second-half mean waiting queue "
                                      "may exceed its first half's, as a fraction of the queries offered (half the "
                                      "kept-up allowance: what a rate 5% above the server's completions adds).")


class PointFlow(BaseModel):
    """What arrived in a point's window and the waiting queue through it (vLLM's num_requests_waiting)."""

    offered: int = Field(description="Arrivals scheduled in the window, sent or refused.")
    waiting_first_half: float = Field(description="Time-weighted mean of num_requests_waiting, first half.")
    waiting_second_half: float = Field(description="Time-weighted mean of num_requests_waiting, second half.")
    waiting_end: float = Field(description="num_requests_waiting at the window's end (last sample before it).")
    running_end: float = Field(description="num_requests_running at the window's end (last sample before it).")


QueueSample = tuple[float, float, float]  # (time, num_requests_waiting, num_requests_running), held until the next


def flow_of(offered: int, samples: Sequence[QueueSample], start: float, end: float) -> PointFlow:
    """The flow of a window [start, end] from queue samples sorted by time (each value holds until the next)."""
    middle = (start + end) / 2
    before_end = [s for s in samples if s[0] <= end]
    last = before_end[-1] if before_end else (end, 0.0, 0.0)
    return PointFlow(offered=offered, waiting_first_half=_held_mean(samples, start, middle),
                     waiting_second_half=_held_mean(samples, middle, end), waiting_end=last[1], running_end=last[2])


def _held_mean(samples: Sequence[QueueSample], start: float, end: float) -> float:
    """Time-weighted mean of the waiting count over [start, end); 0 before the first sample (nothing waited)."""
    area = 0.0
    for (t, waiting, _), (following, _, _) in zip(samples, [*samples[1:], (math.inf, 0.0, 0.0)], strict=True):
        low, high = max(t, start), min(following, end)
        if high > low:
            area += waiting * (high - low)
    return area / (end - start) if end > start else 0.0


class PointCheck(BaseModel):
    """One of a point's checks, with the numbers it compared."""

    name: CheckName = Field(description="Which check.")
    passed: bool = Field(description="Whether the point met it.")
    detail: str = Field(description="The figures and the limit, in words.")


class ServerPoint(BaseModel):
    """One Poisson run of the search, its checks and the timing it was run with."""

    rate_rps: float = Field(description="Poisson arrival rate of the run, requests/s.")
    meets: bool = Field(description="Every check passed: the rate is sustained within the bounds.")
    checks: list[PointCheck] = Field(default_factory=list, description="Each check (none when the run failed).")
    warmup_s: float = Field(0.0, description="Warm-up the point ran with (the enforced floor applied), seconds.")
    window_s: float = Field(0.0, description="Window the point ran with (the enforced floor applied), seconds.")
    min_queries: int = Field(0, description="Queries the window had to receive.")
    offered: int = Field(0, description="Arrivals scheduled in the window, sent or refused.")
    completed: int = Field(0, description="Requests completed ok in the window.")
    rejected: int = Field(0, description="Requests vLLM's admission check refused in the window: offered, never "
                          "completed.")
    flow: PointFlow | None = Field(None, description="The window's arrivals and waiting queue (None: run failed).")
    ttft_p99_s: float | None = Field(None, description="p99 TTFT of the window's completed requests, seconds.")
    tpot_p99_s: float | None = Field(None, description="p99 TPOT of the window's completed requests, seconds.")
    completion_throughput_rps: float = Field(0.0, description="Requests completed in the window / window, req/s.")
    failure: str | None = Field(None, description="Why the run failed, when it did (the point fails).")

    def failed_checks(self) -> list[PointCheck]:
        return [check for check in self.checks if not check.passed]


class SearchState(BaseModel):
    """Everything the search decides from: its settings and the bracket so far (no I/O, no clock)."""

    start_rps: float = Field(gt=0, description="First rate tried, requests/s.")
    tolerance: float = Field(0.05, gt=0, lt=1, description="Stop when (high - low) / high is at most this.")
    max_points: int = Field(12, ge=1, le=100, description="Most runs the search makes.")
    low_rps: float | None = Field(None, description="Highest rate seen passing.")
    high_rps: float | None = Field(None, description="Lowest rate seen failing.")
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
        return 2 * low  # every rate so far passed: double
    if low is None:
        return high / 2  # even the start failed: halve
    if low >= high or (high - low) / high <= state.tolerance:
        return None  # bracketed within the tolerance (or noise put a pass above a failure: stop, report both)
    return (low + high) / 2


def judge(rate: float, run: RunResult, flow: PointFlow | None, slos: Slos, rules: ServerRules) -> ServerPoint:
    """A run's verdict: every check of the module's rule, each recorded."""
    timing = {"warmup_s": run.conditions.warmup_s, "window_s": run.conditions.duration_s,
              "min_queries": rules.min_queries}
    client = run.client
    if run.status != "ok" or client is None or client.completed == 0 or flow is None:
        return ServerPoint(rate_rps=rate, meets=False, **timing,
                           failure=run.failure or "no request completed in the window")
    throughput = client.completion_throughput_rps
    checks = [_latency(client.ttft.p99, client.tpot.p99, slos),
              _kept_up(client.completed, flow.offered, rules, client.rejected_total),
              _queue_growth(flow, rules), _backlog(flow.waiting_end, throughput, slos.ttft_p99_s),
              _query_count(flow.offered, rules.min_queries)]
    return ServerPoint(rate_rps=rate, meets=all(c.passed for c in checks), checks=checks, **timing,
                       offered=flow.offered, completed=client.completed, rejected=client.rejected_total, flow=flow,
                       ttft_p99_s=client.ttft.p99,
                       tpot_p99_s=client.tpot.p99, completion_throughput_rps=throughput)


def _latency(ttft: float | None, tpot: float | None, slos: Slos) -> PointCheck:
    parts = [_bound_text("p99 TTFT", ttft, slos.ttft_p99_s), _bound_text("p99 TPOT", tpot, slos.tpot_p99_s)]
    return PointCheck(name="latency", passed=_within(ttft, slos.ttft_p99_s) and _within(tpot, slos.tpot_p99_s),
                      detail="; ".join(parts))


def _bound_text(label: str, value: float | None, bound: float | None) -> str:
    shown = "n/a" if value is None else f"{value:.3g} s"
    if bound is None:
        return f"{label} {shown} (no bound)"
    return f"{label} {shown} {'≤' if _within(value, bound) else '>'} {bound:g} s"


def _within(value: float | None, bound: float | None) -> bool:
    # no bound: met; no value (e.g. one-token outputs have no TPOT): nothing violates it
    return bound is None or value is None or value <= bound


def _kept_up(completed: int, offered: int, rules: ServerRules, rejected: int = 0) -> PointCheck:
    # a query vLLM's admission check refused is offered and not completed: a rate held by refusing is not sustained
    ratio = completed / offered if offered else 1.0
    passed = ratio >= rules.kept_up_ratio
    refused = f"; {rejected} rejected at admission, not completed" if rejected else ""
    return PointCheck(name="kept up", passed=passed, detail=f"completed {completed} of {offered} offered "
                      f"({ratio:.1%} {'≥' if passed else '<'} {rules.kept_up_ratio:.0%}{refused})")


def _queue_growth(flow: PointFlow, rules: ServerRules) -> PointCheck:
    growth, allowed = flow.waiting_second_half - flow.waiting_first_half, rules.queue_growth_ratio * flow.offered
    passed = growth <= allowed
    return PointCheck(name="queue growth", passed=passed,
                      detail=f"mean waiting {flow.waiting_first_half:.1f} → {flow.waiting_second_half:.1f} "
                             f"(growth {growth:+.1f} {'≤' if passed else '>'} {allowed:.1f}, "
                             f"{rules.queue_growth_ratio:.1%} of offered)")


def _backlog(waiting_end: float, throughput: float, ttft_bound: float | None) -> PointCheck:
    if ttft_bound is None:
        return PointCheck(name="backlog", passed=True, detail=f"{waiting_end:g} waiting at the end (no TTFT bound)")
    drains = throughput * ttft_bound
    passed = waiting_end <= drains
    return PointCheck(name="backlog", passed=passed,
                      detail=f"{waiting_end:g} waiting at the end {'≤' if passed else '>'} {drains:.1f} (completion "
                             f"rate {throughput:.2f}/s x TTFT bound {ttft_bound:g} s)")


def _query_count(offered: int, min_queries: int) -> PointCheck:
    passed = offered >= min_queries
    return PointCheck(name="query count", passed=passed,
                      detail=f"{offered} queries arrived {'≥' if passed else '<'} the minimum {min_queries}")


def point_timing(plan: Plan, rate: float, rules: ServerRules) -> tuple[float, float]:
    """(warm-up, window) of a point at ``rate``: the plan's, raised to the floor the module describes."""
    slos, outputs = plan.slos, plan.workload.output_tokens
    longest_e2e = 0.0 if slos.ttft_p99_s is None or slos.tpot_p99_s is None \
        else slos.ttft_p99_s + slos.tpot_p99_s * (outputs - 1)
    queries = rules.min_queries + 3 * math.sqrt(rules.min_queries)
    window = max(plan.window_s, rules.min_duration_s, queries / rate)
    return _tenths_up(max(plan.warmup_s, longest_e2e)), _tenths_up(window)


def _tenths_up(seconds: float) -> float:
    # readable timings; the rounding first keeps 27.400000000000002 at 27.4
    return math.ceil(round(seconds * 10, 6)) / 10


class ServerSearch(Provenance):
    """MLPerf Server for one configuration: the rate bracket and every point measured."""

    schema_version: int = Field(SCHEMA_VERSION, description="Bumped on any breaking change.")
    plan: str = Field("", description="The plan's name.")
    mode: Mode = Field("what-if", description="Points measured in real time or on the virtual clock.")
    started_at: str = Field(description="Search start, ISO 8601 UTC.")
    setting: str = Field(description="'baseline' or the variation's name.")
    bracket_low_rps: float | None = Field(description="Highest rate seen passing (None: none did).")
    bracket_high_rps: float | None = Field(description="Lowest rate seen failing (None: none did).")
    points: list[ServerPoint] = Field(description="Every run, in the order made.")
    slos: Slos = Field(description="The bounds (p99 TTFT, p99 TPOT).")
    rules: ServerRules = Field(default_factory=ServerRules, description="The checks' limits and the floor.")
    rule: str = Field(POINT_RULE, description="When a point passes.")
    tolerance: float = Field(description="Relative bracket width the search stops at.")
    max_points: int = Field(description="Run budget of the search.")


Measure = Callable[[float], tuple[RunResult, PointFlow | None]]


def search_server(setting: str, measure: Measure, slos: Slos, rules: ServerRules | None = None, *,
                  start_rps: float = 1.0, tolerance: float = 0.05, max_points: int = 12, plan: str = "",
                  mode: Mode = "what-if") -> ServerSearch:
    """Drive next_rate with ``measure(rate)``, one Poisson run per point, each judged by ``judge``."""
    rules = rules or ServerRules()
    started = now_iso()
    state = SearchState(start_rps=start_rps, tolerance=tolerance, max_points=max_points)
    points: list[ServerPoint] = []
    point = None
    while (rate := next_rate(state, point)) is not None:
        point = judge(rate, *measure(rate), slos, rules)
        points.append(point)
    return ServerSearch(plan=plan, mode=mode, started_at=started, setting=setting, bracket_low_rps=state.low_rps,
                        bracket_high_rps=state.high_rps, points=points, slos=slos, rules=rules, tolerance=tolerance,
                        max_points=max_points)


class OfflineResult(Provenance):
    """MLPerf Offline for one configuration: all requests at once, throughput only."""

    schema_version: int = Field(SCHEMA_VERSION, description="Bumped on any breaking change.")
    plan: str = Field("", description="The plan's name.")
    mode: Mode = Field("what-if", description="Measured in real time or on the virtual clock.")
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
    common = {"plan": run.plan, "mode": run.mode, "started_at": started, "setting": run.setting}
    if run.status != "ok" or client is None:
        return OfflineResult(**common, status="failed", failure=run.failure or "the run failed")
    return OfflineResult(**common, status="ok", completed=client.completed, duration_s=client.window_s,
                         requests_per_s=client.completion_throughput_rps,
                         output_tokens_per_s=client.output_tokens_per_s)


def poisson_plan(plan: Plan, rate: float, rules: ServerRules | None = None) -> Plan:
    """The plan with its load replaced by Poisson arrivals at ``rate`` (lengths kept), warm-up and window raised
    to the enforced floor (``point_timing``) under ``rules``."""
    cap = plan.workload.load.max_in_flight if isinstance(plan.workload.load, PoissonLoad) else 512
    warmup, window = point_timing(plan, rate, rules or ServerRules())
    return _with_load(plan, PoissonLoad(rate=rate, max_in_flight=cap)).model_copy(
        update={"warmup_s": warmup, "window_s": window})


def offline_plan(plan: Plan, requests: int) -> Plan:
    """The plan with its load replaced by ``requests`` released at t=0 and no warm-up (MLPerf Offline)."""
    return _with_load(plan, OfflineLoad(requests=requests)).model_copy(update={"warmup_s": 0.0})


def _with_load(plan: Plan, load: PoissonLoad | OfflineLoad) -> Plan:
    workload = plan.workload.model_copy(update={"load": load})
    return plan.model_copy(update={"workload": workload})
