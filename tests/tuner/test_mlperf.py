"""MLPerf scenarios: the Server rate search (pure, then on the virtual clock, checked directly) and Offline."""

from __future__ import annotations

import pytest

from loadgen.summary import Distribution
from tuner.mlperf import (
    SearchState,
    ServerPoint,
    next_rate,
    offline_plan,
    offline_throughput,
    poisson_plan,
    search_server,
)
from tuner.plan import Slos
from tuner.results import ClientFigures, RunResult
from tuner.whatif import run_what_if

from .test_whatif import one_knob_plan

SLOS = Slos(ttft_p99_s=0.5, tpot_p99_s=0.05)


def drive(state: SearchState, threshold: float) -> list[float]:
    """Run the state machine against a monotone system that meets the bounds up to ``threshold`` req/s."""
    rates, point = [], None
    while (rate := next_rate(state, point)) is not None:
        rates.append(rate)
        point = ServerPoint(rate_rps=rate, meets=rate <= threshold)
    return rates


def test_brackets_upward_by_doubling_then_bisects() -> None:
    state = SearchState(start_rps=1.0, tolerance=0.05, max_points=20)
    rates = drive(state, threshold=11.3)
    assert rates[:5] == [1, 2, 4, 8, 16]  # doubling until 16 violates
    assert rates[5] == 12  # then bisection of [8, 16]
    assert state.low_rps <= 11.3 < state.high_rps
    assert (state.high_rps - state.low_rps) / state.high_rps <= 0.05
    assert state.measured == len(rates) < 20


def test_halves_downward_when_the_start_already_violates() -> None:
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


def fake_run(rate: float, threshold: float) -> RunResult:
    """A measured run whose p99 TTFT jumps past the bound above ``threshold`` (a saturating server)."""
    plan = one_knob_plan()
    ttft = 0.2 if rate <= threshold else 3.0
    client = ClientFigures(ttft=Distribution.of([ttft]), tpot=Distribution.of([0.02]), itl=Distribution.of([0.02]),
                           e2e=Distribution.of([ttft + 1]), completion_throughput_rps=min(rate, threshold),
                           output_tokens_per_s=0.0, completed=10, errors=0, window_s=30.0)
    return RunResult(plan=plan.name, setting="baseline", repeat=0, mode="what-if", params=plan.baseline,
                     conditions=plan.run_spec(), started_at="", finished_at="", status="ok", client=client)


def test_search_server_reports_the_bracket_and_every_point() -> None:
    calls: list[float] = []

    def measure(rate: float) -> RunResult:
        calls.append(rate)
        return fake_run(rate, threshold=20.0)

    search = search_server("baseline", measure, SLOS, start_rps=2.0, tolerance=0.05, max_points=12)
    assert [p.rate_rps for p in search.points] == calls
    assert search.bracket_low_rps <= 20.0 < search.bracket_high_rps
    assert all(p.meets == (p.rate_rps <= 20.0) for p in search.points)
    assert search.points[0].ttft_p99_s == pytest.approx(0.2) and search.slos == SLOS


def test_a_failed_point_is_a_violation() -> None:
    failed = fake_run(1.0, 10.0).model_copy(update={"status": "failed", "client": None, "failure": "no request"})
    search = search_server("baseline", lambda rate: failed, SLOS, start_rps=1.0, max_points=3)
    assert search.bracket_low_rps is None and search.bracket_high_rps == 0.25
    assert all(not p.meets and p.failure == "no request" for p in search.points)


# ----- on the virtual clock --------------------------------------------------------------------------------

def server_plan():
    return one_knob_plan(workload={"input_tokens": 1024, "output_tokens": 128, "seed": 1,
                                   "load": {"mode": "poisson", "rate": 1}}, warmup_s=5, window_s=20)


def measure_what_if(rate: float) -> RunResult:
    plan = server_plan()
    return run_what_if(poisson_plan(plan, rate), "baseline", plan.baseline, 0)


def test_server_search_on_the_virtual_clock_finds_a_bracket_a_direct_check_confirms() -> None:
    search = search_server("baseline", measure_what_if, SLOS, start_rps=4.0, tolerance=0.05, max_points=12)
    low, high = search.bracket_low_rps, search.bracket_high_rps
    print(f"bracket [{low}, {high}] req/s in {len(search.points)} points")
    assert low is not None and high is not None and low < high
    assert (high - low) / high <= 0.05 and len(search.points) <= 12
    # a fresh run at each end: above the bracket a bound is violated, below it both are met
    above, below = measure_what_if(high).client, measure_what_if(low).client
    print(f"at {high}: ttft p99 {above.ttft.p99:.3f} s, tpot p99 {above.tpot.p99:.4f} s; "
          f"at {low}: ttft p99 {below.ttft.p99:.3f} s, tpot p99 {below.tpot.p99:.4f} s")
    assert above.ttft.p99 > SLOS.ttft_p99_s or above.tpot.p99 > SLOS.tpot_p99_s
    assert below.ttft.p99 <= SLOS.ttft_p99_s and below.tpot.p99 <= SLOS.tpot_p99_s


def test_offline_reports_throughput_of_all_requests_at_once() -> None:
    plan = server_plan()
    result = offline_throughput(lambda: run_what_if(offline_plan(plan, 300), "baseline", plan.baseline, 0))
    assert result.status == "ok" and result.completed == 300
    assert result.requests_per_s > 0 and result.output_tokens_per_s > 0
    assert result.requests_per_s == pytest.approx(result.completed / result.duration_s)
    assert result.output_tokens_per_s == pytest.approx(300 * 128 / result.duration_s)
