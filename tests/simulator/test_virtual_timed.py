"""run_timed: closed-loop users and stopping runs on the virtual clock, as the load generator drives a server."""

from __future__ import annotations

import numpy as np
import pytest

from batchscope.simulator.config import Deployment, ServeConfig
from batchscope.simulator.engine import EngineCore, Step
from batchscope.simulator.virtual import (
    ClosedLoop,
    FixedArrivals,
    RequestSpec,
    poisson_workload,
    run_timed,
    run_virtual,
)
from batchscope.workload.prompt_layout import prompt_ids


def engine_for(**flags) -> EngineCore:
    flags.setdefault("max_model_len", 4096)
    return Deployment(ServeConfig(model="m", profile="h100-llama-3.1-8b", **flags)).new_engine()


def test_closed_loop_keeps_exactly_n_in_flight_and_obeys_littles_law() -> None:
    users, ramp_up, warmup, stop = 32, 2.0, 10.0, 40.0
    loop = ClosedLoop(users, 512, 64, ramp_up_s=ramp_up, issue_until=stop)
    in_flight: list[int] = []
    in_engine: list[int] = []

    def watch(engine: EngineCore, step: Step) -> None:
        if step.start >= ramp_up:
            in_flight.append(loop.in_flight)
            in_engine.append(engine.num_running + engine.num_waiting)

    run = run_timed(engine_for(), loop, stop, on_step=watch)
    # as its client counts: a request on the front end's input or output path is in flight too
    assert in_flight and set(in_flight) == {users}, "every step after the ramp-up runs with exactly N in flight"
    assert max(in_engine) <= users and min(in_engine) < users, "some are on the front end's paths, never more"
    assert run.cut == users, "the stop cuts one request per user"
    ended = [r for r in run.records if warmup <= r.finished <= stop]
    throughput = len(ended) / (stop - warmup)
    mean_e2e = np.mean([r.finished - r.arrival for r in ended])
    assert throughput * mean_e2e == pytest.approx(users, rel=0.02)  # Little's law; measured: within 0.01%


def test_closed_loop_users_start_over_the_ramp_up_and_send_on_completion() -> None:
    run = run_timed(engine_for(), ClosedLoop(4, 128, 8, ramp_up_s=1.0, issue_until=5.0), 5.0)
    ends = {round(r.finished, 9) for r in run.records}
    starts = sorted(r.arrival for r in run.records if round(r.arrival, 9) not in ends)
    # the users' first requests leave on the ramp-up's schedule; every later one leaves as its previous one ends
    assert starts == pytest.approx([0.0, 0.25, 0.5, 0.75])
    assert len(run.records) > 4 * len(starts)


def test_stop_cuts_in_flight_requests_and_undelivered_steps() -> None:
    workload = [RequestSpec(0.0, 256, 1000) for _ in range(8)]
    engine = engine_for()
    run = run_timed(engine, FixedArrivals(workload), stop=2.0)
    assert run.records == [] and run.cut == 8 and run.duration == 2.0
    # tokens came out until the stop, only from steps that ended by then
    assert 0 < engine.stats.generation_tokens < 8 * 1000
    # a step of prefill chunks alone yields no token: vLLM observes no iteration for it
    assert 0 < engine.stats.iteration_tokens.count <= run.steps


def test_fixed_arrivals_without_a_stop_match_run_virtual_and_keep_exact_gaps() -> None:
    workload = poisson_workload(rate=6, count=120, prompt_len=1500, max_tokens=80, seed=3)
    reference = run_virtual(engine_for(), workload)
    timed = run_timed(engine_for(), FixedArrivals(workload))
    assert timed.records == reference.records and timed.steps == reference.steps
    for record in timed.records:
        gaps = timed.gaps[record.index]
        assert gaps.size == record.output_tokens - 1
        assert gaps.sum() == pytest.approx(record.finished - record.first_token)


def test_open_loop_refuses_arrivals_beyond_max_in_flight() -> None:
    burst = [RequestSpec(0.0, 512, 32) for _ in range(50)]
    run = run_timed(engine_for(), FixedArrivals(burst), max_in_flight=20)
    assert run.issued == 20 and run.refused == 30 and len(run.records) == 20


def test_prompts_are_numbered_by_the_requests_sent_and_shared_ids_hit_the_prefix_cache() -> None:
    drawn: list[int] = []

    def prompts(number: int) -> list[int]:  # 256 shared ids, then 256 of the request's own (layout's salt)
        drawn.append(number)
        return prompt_ids([[7] * 256], list(range(1000, 1256)), number)

    # a burst of three at t=0 of which two are refused (one in flight at most), then one request a second
    arrivals = [RequestSpec(0.0, 512, 16)] * 3 + [RequestSpec(float(t), 512, 16) for t in range(1, 6)]
    engine = engine_for()
    run = run_timed(engine, FixedArrivals(arrivals), max_in_flight=1, prompts=prompts)
    assert run.refused == 2 and run.issued == 6 and drawn == list(range(6)), "refused arrivals draw no prompt"
    assert engine.stats.prefix_cache_queries == 6 * 512
    assert engine.stats.prefix_cache_hits == 5 * 256, "the first computes the prefix, the others hit it alone"
