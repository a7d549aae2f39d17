"""MLPerf scenarios: the Server rate search (pure), a point's checks (pure, then on the virtual clock, where a rate
above capacity must fail even when its latency stays within the bounds) and Offline."""

from __future__ import annotations

import math

import pytest

from batchscope.loadgen.figures.summary import Distribution
from batchscope.tuner.mlperf.measure import measure_what_if
from batchscope.tuner.mlperf.rules import (
    PointFlow,
    SearchState,
    ServerPoint,
    ServerRules,
    flow_of,
    judge,
    next_rate,
    offline_plan,
    offline_throughput,
    point_timing,
    poisson_plan,
    search_server,
)
from batchscope.tuner.plan import Slos
from batchscope.tuner.results.record import ClientFigures, RunResult
from batchscope.tuner.whatif import run_what_if

from .test_whatif import one_knob_plan

SLOS = Slos(ttft_p99_s=0.5, tpot_p99_s=0.05)
FEW = ServerRules(min_queries=100)  # the pure tests' points receive 100 queries


def drive(state: SearchState, threshold: float) -> list[float]:
    """Run the state machine against a monotone system that passes up to ``threshold`` req/s."""
    rates, point = [], None
    while (rate := next_rate(state, point)) is not None:
        rates.append(rate)
        point = ServerPoint(rate_rps=rate, meets=rate <= threshold)
    return rates


def test_brackets_upward_by_doubling_then_bisects() -> None:
    state = SearchState(start_rps=1.0, tolerance=0.05, max_points=20)
    rates = drive(state, threshold=11.3)
    assert rates[:5] == [1, 2, 4, 8, 16]  # doubling until 16 fails
    assert rates[5] == 12  # then bisection of [8, 16]
    assert state.low_rps <= 11.3 < state.high_rps
    assert (state.high_rps - state.low_rps) / state.high_rps <= 0.05
    assert state.measured == len(rates) < 20


def test_halves_downward_when_the_start_already_fails() -> None:
    state = SearchState(start_rps=64.0, tolerance=0.05, max_points=20)
    rates = drive(state, threshold=5.0)
    assert rates[:5] == [64, 32, 16, 8, 4]
    assert state.low_rps <= 5.0 < state.high_rps


def test_the_search_is_bounded_by_its_point_budget() -> None:
    state = SearchState(start_rps=1.0, tolerance=1e-6, max_points=7)
    assert len(drive(state, threshold=3.7)) == 7
    assert state.low_rps <= 3.7 < state.high_rps
    nothing_meets = SearchState(start_rps=1.0, max_points=5)
    assert len(drive(nothing_meets, threshold=0.0)) == 5 and nothing_meets.low_rps is None


# ----- a point's checks, on figures given directly -----------------------------------------------------------

def fake_run(ttft: float = 0.2, completed: int = 100, window_s: float = 50.0) -> RunResult:
    """A measured run of ``completed`` requests in the window, each with ``ttft`` and a 20 ms TPOT."""
    plan = one_knob_plan()
    client = ClientFigures(ttft=Distribution.of([ttft]), tpot=Distribution.of([0.02]), itl=Distribution.of([0.02]),
                           e2e=Distribution.of([ttft + 1]), completion_throughput_rps=completed / window_s,
                           output_tokens_per_s=0.0, completed=completed, errors=0, window_s=window_s)
    return RunResult(plan=plan.name, setting="baseline", repeat=0, mode="what-if", params=plan.baseline,
                     conditions=plan.run_spec(), started_at="", finished_at="", status="ok", client=client)


def steady(offered: int = 100, first: float = 1.0, second: float = 1.0, end: float = 0.0) -> PointFlow:
    return PointFlow(offered=offered, waiting_first_half=first, waiting_second_half=second, waiting_end=end,
                     running_end=8)


def failed_names(point: ServerPoint) -> set[str]:
    return {check.name for check in point.failed_checks()}


def test_a_point_within_the_bounds_that_kept_up_passes_every_check() -> None:
    point = judge(2.0, fake_run(), steady(), SLOS, FEW)
    assert point.meets and {c.name for c in point.checks} == {"latency", "kept up", "queue growth", "backlog",
                                                               "query count"}
    assert all(c.passed for c in point.checks)
    assert point.offered == point.completed == 100 and point.window_s == one_knob_plan().window_s
    assert "completed 100 of 100 offered (100.0% ≥ 95%)" in {c.name: c.detail for c in point.checks}["kept up"]


@pytest.mark.parametrize(("run", "flow", "failed"), [
    (fake_run(ttft=0.9), steady(), {"latency"}),
    # within the bounds, but 20% of what arrived is still in flight at the window's end
    (fake_run(completed=80), steady(), {"kept up"}),
    # the mean waiting queue grew by 5 requests between the halves: above 2.5% of 100 offered
    (fake_run(), steady(first=1.0, second=6.0), {"queue growth"}),
    # 3 waiting at the end, but at 2 completions/s only 1 can start within the 0.5 s TTFT bound
    (fake_run(), steady(end=3.0), {"backlog"}),
    (fake_run(completed=90), steady(offered=90), {"query count"}),
])
def test_each_check_fails_a_point_on_its_own(run: RunResult, flow: PointFlow, failed: set[str]) -> None:
    point = judge(2.0, run, flow, SLOS, FEW)
    assert not point.meets and failed_names(point) == failed


def test_the_kept_up_threshold_is_the_rules() -> None:
    run, flow = fake_run(completed=93), steady()
    assert "kept up" in failed_names(judge(2.0, run, flow, SLOS, FEW))
    assert judge(2.0, run, flow, SLOS, FEW.model_copy(update={"kept_up_ratio": 0.9})).meets


def test_a_failed_run_or_a_missing_flow_fails_the_point() -> None:
    failed = fake_run().model_copy(update={"status": "failed", "client": None, "failure": "no request"})
    assert judge(1.0, failed, None, SLOS, FEW).failure == "no request"
    missing = judge(1.0, fake_run(), None, SLOS, FEW)
    assert not missing.meets and missing.failure


def test_search_server_reports_the_bracket_and_every_point() -> None:
    calls: list[float] = []

    def measure(rate: float) -> tuple[RunResult, PointFlow]:
        calls.append(rate)  # a server that keeps up to 20 req/s; above, a fifth of the offered stays in flight
        return fake_run(completed=100 if rate <= 20 else 80), steady()

    search = search_server("baseline", measure, SLOS, FEW, start_rps=2.0, tolerance=0.05, max_points=12)
    assert [p.rate_rps for p in search.points] == calls
    assert search.bracket_low_rps <= 20.0 < search.bracket_high_rps
    assert all(p.meets == (p.rate_rps <= 20.0) for p in search.points)
    assert search.rules == FEW and search.slos == SLOS and search.schema_version == 2


def test_flow_of_holds_each_sample_until_the_next() -> None:
    # waiting 0 over [0, 10), 4 over [10, 15), 8 from 15 on; the window [10, 30]
    samples = [(0.0, 0.0, 2.0), (10.0, 4.0, 3.0), (15.0, 8.0, 5.0), (40.0, 1.0, 1.0)]
    flow = flow_of(50, samples, 10.0, 30.0)
    assert flow.waiting_first_half == pytest.approx((4 * 5 + 8 * 5) / 10)
    assert flow.waiting_second_half == pytest.approx(8.0)
    assert (flow.waiting_end, flow.running_end, flow.offered) == (8.0, 5.0, 50)


def test_the_timing_floor_raises_warm_up_and_window_but_keeps_longer_ones() -> None:
    plan = one_knob_plan(slos={"ttft_p99_s": 2.0, "tpot_p99_s": 0.2}, warmup_s=5, window_s=15)
    rules = ServerRules(min_queries=1000, min_duration_s=60)
    warmup, window = point_timing(plan, 10.0, rules)
    assert warmup == pytest.approx(2.0 + 0.2 * (plan.workload.output_tokens - 1))  # the longest E2E allowed
    assert window == pytest.approx(math.ceil((1000 + 3 * math.sqrt(1000)) / 10 * 10) / 10)  # >= 1000 queries
    assert point_timing(plan, 1000.0, rules)[1] == 60  # a fast rate: the minimum duration
    assert point_timing(plan.model_copy(update={"warmup_s": 300, "window_s": 500}), 10.0, rules) == (300, 500)
    assert point_timing(plan.model_copy(update={"slos": Slos(ttft_p99_s=None)}), 10.0, rules)[0] == 5


# ----- on the virtual clock --------------------------------------------------------------------------------

def server_plan(**changes):
    return one_knob_plan(workload={"input_tokens": 1024, "output_tokens": 128, "seed": 1,
                                   "load": {"mode": "poisson", "rate": 1}}, warmup_s=5, window_s=20, **changes)


def offline_rps(plan, requests: int = 600) -> float:
    """Offline throughput; with more requests the start and the drain weigh less and it nears the capacity."""
    run = run_what_if(offline_plan(plan, requests), "baseline", plan.baseline, 0)
    return offline_throughput(lambda: run).requests_per_s


def test_above_capacity_a_point_fails_even_when_its_latency_stays_within_loose_bounds() -> None:
    """The defect: a short window's completed requests met the bounds while the queue grew. Above the offline
    throughput nothing is sustained, whatever the bounds."""
    # a loose TTFT bound and no TPOT bound: the warm-up stays the plan's 5 s, and through the window the queue
    # grows below the in-flight cap (512) rather than pinned at it
    plan = server_plan(slos={"ttft_p99_s": 120.0, "tpot_p99_s": None})
    rate = 1.2 * offline_rps(plan)
    short = run_what_if(poisson_plan(plan, rate).model_copy(update={"window_s": 20}), "baseline", plan.baseline,
                        0).client
    assert short.ttft.p99 <= 120  # the latency-only rule passed this rate
    rules = ServerRules(min_queries=400)
    run, flow = measure_what_if(poisson_plan(plan, rate, rules), "baseline", plan.baseline)
    point = judge(rate, run, flow, plan.slos, rules)
    checks = {c.name: c for c in point.checks}
    print(f"at {rate:.1f} req/s: " + "; ".join(f"{c.name}: {c.detail}" for c in point.checks))
    assert checks["latency"].passed and not point.meets
    assert {"kept up", "queue growth"} <= failed_names(point)
    assert point.offered >= 400 and point.completed < 0.9 * point.offered
    assert flow.waiting_second_half > flow.waiting_first_half + 0.025 * flow.offered


def test_server_search_on_the_virtual_clock_brackets_a_rate_a_fresh_check_confirms() -> None:
    plan, rules = server_plan(slos=SLOS.model_dump()), ServerRules(min_queries=400)

    def measure(rate: float) -> tuple[RunResult, PointFlow | None]:
        return measure_what_if(poisson_plan(plan, rate, rules), "baseline", plan.baseline)

    search = search_server("baseline", measure, SLOS, rules, start_rps=4.0, tolerance=0.05, max_points=12)
    low, high = search.bracket_low_rps, search.bracket_high_rps
    print(f"bracket [{low}, {high}] req/s in {len(search.points)} points")
    assert low is not None and high is not None and low < high
    assert (high - low) / high <= 0.05 and len(search.points) <= 12
    assert low <= offline_rps(plan, 2000)  # here the capacity binds, not the bounds: the bracket is at it
    # a fresh run at each end: above the bracket a check fails, below it every one passes
    assert not judge(high, *measure(high), SLOS, rules).meets
    assert judge(low, *measure(low), SLOS, rules).meets
    assert all(p.warmup_s == 6.9 and p.offered >= 400 for p in search.points)  # 0.5 s + 0.05 s x 127, to 0.1 s


def test_offline_reports_throughput_of_all_requests_at_once() -> None:
    plan = server_plan()
    result = offline_throughput(lambda: run_what_if(offline_plan(plan, 300), "baseline", plan.baseline, 0))
    assert result.status == "ok" and result.completed == 300 and result.mode == "what-if"
    assert result.requests_per_s > 0 and result.output_tokens_per_s > 0
    assert result.requests_per_s == pytest.approx(result.completed / result.duration_s)
    assert result.output_tokens_per_s == pytest.approx(300 * 128 / result.duration_s)
