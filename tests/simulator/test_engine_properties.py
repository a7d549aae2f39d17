"""Property-based tests of the engine core: vLLM V1 scheduler invariants and metric bookkeeping.

The driver below steps ``EngineCore`` by hand on a virtual clock (like ``run_virtual``) so every invariant is
checked after every ``schedule`` and every ``complete``, with random arrivals, random limits, small KV pools
(so recompute preemption is frequent) and random aborts, both between steps and while a step is in flight.
It keeps its own model of the waiting queue (FCFS, preempted requests to the front) and its own tally of
every event, and compares the engine's ``EngineStats`` with that tally at the end.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, seed, settings, target
from hypothesis import strategies as st

from batchscope.simulator.cost import StepCostModel
from batchscope.simulator.engine import EngineCore, SchedulerLimits
from batchscope.simulator.finish import REASON_LENGTH, REASON_STOP
from batchscope.simulator.profile import load_profile
from batchscope.simulator.slots import ABORTED, FREE, RUNNING, WAITING
from batchscope.simulator.virtual import RequestSpec

TINY_COST = StepCostModel(load_profile("tiny"))
MAX_STEPS = 40_000
# ENGINE_PROPERTY_EXAMPLES=5000 for a deep search; the default keeps each test to a few seconds
SETTINGS = settings(
    max_examples=int(os.environ.get("ENGINE_PROPERTY_EXAMPLES", "150")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class Fate:
    """Everything the driver saw happen to one request."""

    slot: int = -1
    status: str = "pending"  # pending -> live -> finished | aborted
    outputs: int = 0
    computed: int = 0  # tokens computed for it in completed steps while it was alive
    lost: int = 0  # computed tokens thrown away by its preemptions
    preemptions: int = 0
    reason: int = -1
    first_scheduled: float = float("nan")
    first_token: float = float("nan")
    last_token: float = float("nan")
    finished_at: float = float("nan")


@dataclass
class Trace:
    fates: list[Fate]
    steps: int = 0
    steps_with_tokens: int = 0
    steps_with_preemption: int = 0
    tokens_scheduled: int = 0
    tokens_computed: int = 0
    tokens_delivered: int = 0
    first_tokens: int = 0
    prompt_of_first: int = 0
    iteration_tokens_sum: int = 0
    ttft_sum: float = 0.0
    itl_sum: float = 0.0
    aborts: int = 0
    aborts_in_flight: int = 0
    preemption_events: int = 0
    max_running: int = 0
    finish_counts: dict[int, int] = field(default_factory=lambda: {REASON_LENGTH: 0, REASON_STOP: 0})


def check_blocks(engine: EngineCore) -> None:
    in_use = engine.usable_blocks - engine.free_blocks
    assert engine.free_blocks >= 0
    assert 0 <= in_use <= engine.usable_blocks
    running = engine.slots.state == RUNNING
    assert in_use == int(engine.slots.num_blocks[running].sum())
    # only running requests hold blocks
    assert int(engine.slots.num_blocks[~running].sum()) == 0
    assert engine.num_running == int(running.sum())
    assert engine.num_running <= engine.limits.max_num_seqs
    assert 0.0 <= engine.kv_cache_usage <= 1.0


def drive(
    engine: EngineCore, reqs: list[RequestSpec], abort_prob: float = 0.0, abort_seed: int = 0,
    max_steps: int = MAX_STEPS,
) -> Trace:
    """Run ``reqs`` to completion on a virtual clock, checking the scheduler's invariants at every step."""
    lim = engine.limits
    bs = lim.block_size
    rng = np.random.default_rng(abort_seed)
    fates = [Fate() for _ in reqs]
    trace = Trace(fates)
    order = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival)
    live: dict[int, int] = {}  # slot -> request index, for requests not yet finished or aborted
    queue: deque[int] = deque()  # the driver's model of the waiting queue (slots)
    admitted_seq: dict[int, int] = {}  # slot -> admission number (running order is admission order)
    seq = 0
    now, nxt = 0.0, 0

    def abort_some(in_flight: bool) -> None:
        if abort_prob <= 0 or not live:
            return
        for slot in sorted(live):
            if rng.random() >= abort_prob:
                continue
            i = live.pop(slot)
            fate = fates[i]
            was = int(engine.slots.state[slot])
            assert was in (WAITING, RUNNING)
            fate.preemptions = int(engine.slots.preemptions[slot])
            engine.abort(slot)
            # an aborted request's slot is only recycled once no step that may name it is in flight
            assert engine.slots.state[slot] == (ABORTED if in_flight else FREE)
            assert engine.slots.num_blocks[slot] == 0
            assert (slot in queue) == (was == WAITING)
            if was == WAITING:
                queue.remove(slot)
            admitted_seq.pop(slot, None)
            fate.status = "aborted"
            trace.aborts += 1
            trace.aborts_in_flight += in_flight
            check_blocks(engine)

    for _ in range(max_steps):
        while nxt < len(order) and reqs[order[nxt]].arrival <= now:
            i = order[nxt]
            r = reqs[i]
            slot = engine.add_request(r.arrival, r.prompt_len, r.max_tokens, r.ignore_eos, r.min_tokens)
            assert slot not in live
            assert engine.slots.state[slot] == WAITING
            live[slot] = i
            fates[i].slot = slot
            fates[i].status = "live"
            queue.append(slot)
            nxt += 1
        abort_some(in_flight=False)

        state_before = engine.slots.state.copy()
        computed_before = engine.slots.num_computed.copy()
        output_before = engine.slots.num_output.copy()
        preempt_before = engine.slots.preemptions.copy()
        running_before = sorted((s for s in live if state_before[s] == RUNNING), key=admitted_seq.__getitem__)

        step = engine.schedule(now)
        if step is None:
            assert not live, "the engine went idle with requests still queued or running"
            if nxt == len(order):
                return trace
            now = reqs[order[nxt]].arrival
            continue

        # ----- the scheduled batch -----
        slots = step.slots.tolist()
        tokens = dict(zip(slots, step.new_tokens.tolist(), strict=True))
        assert len(tokens) == len(slots), "a request was scheduled twice in one step"
        assert all(s in live for s in slots)
        assert step.start == now and step.end > step.start
        assert (step.new_tokens > 0).all()
        assert int(step.new_tokens.sum()) <= lim.max_num_batched_tokens
        assert (engine.slots.state[step.slots] == RUNNING).all()
        trace.tokens_scheduled += int(step.new_tokens.sum())
        for s, n in tokens.items():
            # never more than the request still needs; blocks cover exactly what will be computed
            need = int(engine.slots.prompt_len[s] + engine.slots.num_output[s] - engine.slots.num_computed[s])
            assert 1 <= n <= need
            assert engine.slots.num_blocks[s] == ceil_div(int(engine.slots.num_computed[s]) + n, bs)
        check_blocks(engine)
        trace.max_running = max(trace.max_running, engine.num_running)

        # ----- preemptions: newest running requests, recompute style, to the front of the queue -----
        victims = []
        for s in live:
            grew = int(engine.slots.preemptions[s] - preempt_before[s])
            if s not in running_before:
                assert grew == 0, "only running requests are preempted"
                continue
            if grew:
                assert grew == 1
                assert engine.slots.state[s] == WAITING
                assert engine.slots.num_computed[s] == 0 and engine.slots.num_blocks[s] == 0
                assert engine.slots.num_output[s] == output_before[s], "preemption keeps the generated tokens"
                assert s not in tokens
                fates[live[s]].lost += int(computed_before[s])
                victims.append(s)
        assert len(victims) == step.num_preempted
        trace.preemption_events += len(victims)
        trace.steps_with_preemption += bool(victims)
        survivors = [s for s in running_before if s not in victims]
        if victims:
            assert min(admitted_seq[v] for v in victims) > max((admitted_seq[s] for s in survivors), default=-1)
            for v in sorted(victims, key=admitted_seq.__getitem__, reverse=True):
                queue.appendleft(v)
                del admitted_seq[v]

        # ----- phase 1: running requests first, in order, each given all it needs while the budget lasts ---
        budget = lim.max_num_batched_tokens
        served = [s for s in survivors if s in tokens]
        assert served == survivors[: len(served)], "running requests are served in order"
        for k, s in enumerate(served):
            need = int(engine.slots.prompt_len[s] + engine.slots.num_output[s] - engine.slots.num_computed[s])
            if tokens[s] < need:
                assert k == len(served) - 1 and budget == tokens[s], "only the budget cuts a running request"
            budget -= tokens[s]
        if len(served) < len(survivors):
            assert budget == 0

        # ----- phase 2: waiting requests FCFS, head-of-line, only if nobody was preempted -----
        admitted = [s for s in slots if state_before[s] == WAITING]
        assert [s for s in slots if state_before[s] == RUNNING] == served
        assert slots == served + admitted
        if victims:
            assert not admitted, "no admissions in a step that preempted"
        assert admitted == list(queue)[: len(admitted)], "admission is FCFS from the front of the queue"
        for s in admitted:
            queue.popleft()
            admitted_seq[s] = seq
            seq += 1
            assert computed_before[s] == 0
            want = min(int(engine.slots.prompt_len[s] + engine.slots.num_output[s]), budget)
            assert tokens[s] == want
            budget -= want
            fate = fates[live[s]]
            if np.isnan(fate.first_scheduled):
                fate.first_scheduled = now
            assert engine.slots.first_scheduled[s] == fate.first_scheduled
        assert engine.num_waiting == len(queue)
        if queue and not victims:
            head = queue[0]
            blocks = ceil_div(min(int(engine.slots.prompt_len[head] + engine.slots.num_output[head]), budget), bs)
            assert budget == 0 or engine.num_running == lim.max_num_seqs or blocks > engine.free_blocks, (
                "a waiting request was left out although budget, a seat and blocks were available"
            )

        # ----- the step runs; some clients may go away meanwhile -----
        abort_some(in_flight=True)
        alive = engine.slots.state[step.slots] == RUNNING
        for s, n in zip(step.slots[alive].tolist(), step.new_tokens[alive].tolist(), strict=True):
            fates[live[s]].computed += n
            trace.tokens_computed += n
        expected_sampled = {
            s
            for s in step.slots[alive].tolist()
            if engine.slots.num_computed[s] + tokens[s] == engine.slots.prompt_len[s] + engine.slots.num_output[s]
        }
        out = engine.complete(step, step.end)
        now = step.end
        trace.steps += 1

        # ----- what the step produced -----
        sampled = out.token_slots.tolist()
        assert set(sampled) == expected_sampled and len(sampled) == len(expected_sampled)
        trace.tokens_delivered += len(sampled)
        step_prompt_of_first = step_cached_of_first = 0
        for s, index in zip(sampled, out.token_index.tolist(), strict=True):
            fate = fates[live[s]]
            fate.outputs += 1
            assert index == fate.outputs
            assert engine.slots.num_computed[s] == engine.slots.prompt_len[s] + fate.outputs - 1
            if fate.outputs == 1:
                trace.first_tokens += 1
                step_prompt_of_first += reqs[live[s]].prompt_len
                step_cached_of_first += int(engine.slots.cached_tokens[s])
                trace.ttft_sum += now - reqs[live[s]].arrival
                fate.first_token = now
            else:
                trace.itl_sum += now - fate.last_token
            fate.last_token = now
        trace.prompt_of_first += step_prompt_of_first
        # vLLM observes a step that yields a token, with the prompt tokens it computed (not those found cached)
        if sampled:
            trace.steps_with_tokens += 1
            trace.iteration_tokens_sum += step_prompt_of_first - step_cached_of_first + len(sampled)
        finished = dict(zip(out.finished_slots.tolist(), out.finish_reasons.tolist(), strict=True))
        assert set(finished) <= set(sampled)
        for s in sampled:
            fate = fates[live[s]]
            r = reqs[live[s]]
            if s not in finished:
                assert fate.outputs < r.max_tokens
                continue
            reason = finished[s]
            assert engine.slots.state[s] == FREE, "a finished request's slot is released at once"
            fate.status = "finished"
            fate.reason = reason
            fate.finished_at = now
            fate.preemptions = int(engine.slots.preemptions[s])
            trace.finish_counts[reason] += 1
            del live[s]
            del admitted_seq[s]
        for s in step.slots[~alive].tolist():
            assert engine.slots.state[s] == FREE, "a slot aborted mid-step is released when the step completes"
        check_blocks(engine)
        for s in live:
            if engine.slots.state[s] == RUNNING:
                assert engine.slots.num_blocks[s] == ceil_div(int(engine.slots.num_computed[s]), bs)
            else:
                assert engine.slots.state[s] == WAITING and engine.slots.num_blocks[s] == 0
    raise AssertionError(f"the engine did not finish within {max_steps} steps")


def check_outcome(engine: EngineCore, reqs: list[RequestSpec], trace: Trace) -> None:
    """Every request ended properly, and EngineStats agrees with the events the driver saw."""
    stats = engine.stats
    assert engine.num_running == 0 and engine.num_waiting == 0
    assert engine.free_blocks == engine.usable_blocks, "KV blocks leaked"
    finished = [(r, f) for r, f in zip(reqs, trace.fates, strict=True) if f.status == "finished"]
    aborted = [f for f in trace.fates if f.status == "aborted"]
    assert len(finished) + len(aborted) == len(reqs)
    for r, f in finished:
        if r.ignore_eos:
            assert f.outputs == r.max_tokens and f.reason == REASON_LENGTH
        else:
            assert f.outputs <= r.max_tokens
            assert (f.reason == REASON_STOP) == (f.outputs < r.max_tokens)
            assert f.outputs >= r.min_tokens
            if f.reason == REASON_STOP:
                assert f.outputs > r.min_tokens, "EOS is suppressed for the first min_tokens tokens"
        # recompute: every computed token is accounted for, the lost ones exactly once more
        assert f.computed == r.prompt_len + f.outputs - 1 + f.lost
        assert (f.lost > 0) == (f.preemptions > 0)
    for r, f in zip(reqs, trace.fates, strict=True):
        if f.status == "aborted":
            assert f.outputs <= r.max_tokens
    minimal = sum(r.prompt_len + f.outputs - 1 for r, f in finished)
    assert trace.tokens_computed >= minimal
    if any(f.preemptions for _, f in finished):
        assert trace.tokens_computed > minimal
    assert trace.tokens_computed <= trace.tokens_scheduled

    # counters
    assert stats.generation_tokens == trace.tokens_delivered == sum(f.outputs for f in trace.fates)
    assert stats.num_preemptions == trace.preemption_events == sum(f.preemptions for f in trace.fates)
    assert stats.request_success["length"] == trace.finish_counts[REASON_LENGTH]
    assert stats.request_success["stop"] == trace.finish_counts[REASON_STOP]
    # vLLM 0.32 counts no client disconnect in request_success_total; the simulator keeps its own count
    assert stats.request_success["abort"] == 0 and stats.requests_aborted == trace.aborts == len(aborted)
    firsts = [r.prompt_len for r, f in zip(reqs, trace.fates, strict=True) if f.outputs > 0]
    assert stats.prompt_tokens == trace.prompt_of_first == sum(firsts)
    assert sum(stats.prompt_tokens_by_source().values()) == stats.prompt_tokens
    assert 0 <= stats.prompt_tokens_cached <= stats.prefix_cache_hits
    # histograms
    assert stats.time_to_first_token.count == trace.first_tokens == len(firsts)
    # one observation per finished request (an aborted one is in none, as in vLLM 0.32)
    assert stats.request_num_preemptions.count == stats.request_prefill_kv_computed_tokens.count == len(finished)
    assert stats.request_num_preemptions.sum == sum(f.preemptions for _, f in finished)
    assert stats.inter_token_latency.count == stats.generation_tokens - trace.first_tokens
    assert stats.e2e_request_latency.count == len(finished)
    assert stats.request_queue_time.count == len(finished)
    assert stats.iteration_tokens.count == trace.steps_with_tokens
    assert stats.iteration_tokens.sum == pytest.approx(trace.iteration_tokens_sum)
    assert stats.time_to_first_token.sum == pytest.approx(trace.ttft_sum)
    assert stats.inter_token_latency.sum == pytest.approx(trace.itl_sum)
    assert stats.e2e_request_latency.sum == pytest.approx(sum(f.finished_at - r.arrival for r, f in finished))
    assert stats.request_queue_time.sum == pytest.approx(sum(f.first_scheduled - r.arrival for r, f in finished))
    assert stats.request_prefill_time.sum == pytest.approx(sum(f.first_token - f.first_scheduled for _, f in finished))
    assert stats.request_decode_time.sum == pytest.approx(sum(f.last_token - f.first_token for _, f in finished))
    assert stats.request_generation_tokens.sum == sum(f.outputs for _, f in finished)
    assert stats.request_prompt_tokens.sum == sum(r.prompt_len for r, _ in finished)
    assert stats.request_params_max_tokens.sum == sum(r.max_tokens for r, _ in finished)


# ----- strategies --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    limits: SchedulerLimits
    reqs: list[RequestSpec]
    eos_probability: float
    engine_seed: int
    abort_prob: float
    abort_seed: int

    def engine(self) -> EngineCore:
        return EngineCore(self.limits, TINY_COST, self.eos_probability, seed=self.engine_seed)


@st.composite
def scenarios(draw, free_running: bool = False, aborts: bool = True, max_requests: int = 24) -> Scenario:
    block_size = draw(st.sampled_from([1, 4, 16]))
    n = draw(st.integers(1, max_requests))
    reqs = []
    t = 0.0
    for _ in range(n):
        # bursts (gap 0) and spread-out arrivals; a tiny-profile step takes roughly 0.3-3 ms
        t += draw(st.sampled_from([0.0, 0.0, 0.0005, 0.002, 0.01]))
        prompt = draw(st.integers(1, 160))
        max_tokens = draw(st.integers(1, 40))
        ignore_eos = draw(st.booleans()) if free_running else True
        min_tokens = draw(st.integers(0, max_tokens)) if free_running else 0
        reqs.append(RequestSpec(t, prompt, max_tokens, ignore_eos, min_tokens))
    longest = max(r.prompt_len + r.max_tokens for r in reqs)
    # the pool always holds the longest request (plus vLLM's null block), and often little more,
    # so that concurrent requests run out of blocks and preempt each other
    one = ceil_div(longest, block_size)
    extra = draw(st.one_of(st.integers(0, 2), st.integers(0, one), st.integers(0, 4 * one)))
    limits = SchedulerLimits(
        max_num_seqs=draw(st.integers(1, 12)),
        max_num_batched_tokens=draw(st.sampled_from([1, 7, 16, 64, 200, 512])),
        max_model_len=longest,
        block_size=block_size,
        num_gpu_blocks=one + 1 + extra,
    )
    eos = draw(st.sampled_from([0.05, 0.2, 0.6])) if free_running else 0.01
    abort_prob = draw(st.sampled_from([0.0, 0.0, 0.005, 0.02, 0.05])) if aborts else 0.0
    return Scenario(limits, reqs, eos, draw(st.integers(0, 2**16)), abort_prob, draw(st.integers(0, 2**16)))


# ----- tests ---------------------------------------------------------------------------------------------


@SETTINGS
@given(scenarios())
def test_invariants_hold_at_every_step(sc: Scenario) -> None:
    engine = sc.engine()
    trace = drive(engine, sc.reqs, sc.abort_prob, sc.abort_seed)
    check_outcome(engine, sc.reqs, trace)
    target(float(trace.preemption_events), label="preemptions")
    event(f"preempted: {trace.preemption_events > 0}")
    event(f"aborted: {trace.aborts > 0}")


@SETTINGS
@given(scenarios(free_running=True))
def test_free_running_outputs_stop_at_eos_within_max_and_min_tokens(sc: Scenario) -> None:
    engine = sc.engine()
    trace = drive(engine, sc.reqs, sc.abort_prob, sc.abort_seed)
    check_outcome(engine, sc.reqs, trace)
    event(f"stops: {trace.finish_counts[REASON_STOP] > 0}")


def test_random_scenarios_exercise_preemption_and_aborts() -> None:
    """The generator is only useful if preemption (and aborts) actually happen in a good share of examples."""
    seen: list[Trace] = []

    @seed(20240601)
    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(scenarios())
    def run(sc: Scenario) -> None:
        engine = sc.engine()
        trace = drive(engine, sc.reqs, sc.abort_prob, sc.abort_seed)
        check_outcome(engine, sc.reqs, trace)
        seen.append(trace)

    run()
    assert len(seen) >= 30
    preempted = [t for t in seen if t.preemption_events > 0]
    assert len(preempted) >= len(seen) // 4, f"only {len(preempted)} of {len(seen)} examples preempted"
    assert any(t.steps_with_preemption > 1 for t in preempted)
    assert any(t.aborts_in_flight for t in seen) and any(t.aborts > t.aborts_in_flight for t in seen)
    # preempted requests that finished had to recompute
    assert any(f.preemptions and f.status == "finished" and f.lost > 0 for t in seen for f in t.fates)


def test_preempted_requests_recompute_and_still_finish() -> None:
    """Eight 64+64 requests at once in a 256-token pool: the newest get preempted and recompute."""
    limits = SchedulerLimits(
        max_num_seqs=8, max_num_batched_tokens=512, max_model_len=128, block_size=16, num_gpu_blocks=17
    )
    engine = EngineCore(limits, TINY_COST, 0.01)
    reqs = [RequestSpec(0.0, 64, 64) for _ in range(8)]
    trace = drive(engine, reqs)
    check_outcome(engine, reqs, trace)
    assert engine.stats.num_preemptions > 0
    assert trace.max_running == 4  # the pool fits four 64-token prompts at a time
    assert all(f.outputs == 64 for f in trace.fates)
    preempted = [f for f in trace.fates if f.preemptions]
    assert preempted and all(f.lost > 0 for f in preempted)
    assert trace.tokens_computed == sum(64 + 63 + f.lost for f in trace.fates)
    assert trace.tokens_computed > 8 * (64 + 63)
    # FCFS: the oldest request is never a victim, so it finishes first
    assert trace.fates[0].preemptions == 0
    assert trace.fates[0].finished_at == min(f.finished_at for f in trace.fates)


def test_abort_in_flight_frees_blocks_at_once_and_drops_the_step_tokens() -> None:
    limits = SchedulerLimits(
        max_num_seqs=4, max_num_batched_tokens=64, max_model_len=128, block_size=16, num_gpu_blocks=20
    )
    engine = EngineCore(limits, TINY_COST, 0.01)
    a = engine.add_request(0.0, 100, 10)
    b = engine.add_request(0.0, 10, 10)
    step = engine.schedule(0.0)
    assert step.slots.tolist() == [a] and step.new_tokens.tolist() == [64]  # chunked prefill
    engine.abort(a)
    assert engine.free_blocks == engine.usable_blocks
    assert engine.slots.state[a] == ABORTED  # not recycled while the step that names it is in flight
    c = engine.add_request(0.0, 5, 5)
    assert c not in (a, b)
    out = engine.complete(step, step.end)
    assert out.token_slots.size == 0 and engine.slots.num_computed[a] == 0
    assert engine.slots.state[a] == FREE
    assert engine.stats.request_success["abort"] == 0 and engine.stats.requests_aborted == 1
    assert engine.stats.generation_tokens == 0
    step = engine.schedule(step.end)
    assert step.slots.tolist() == [b, c] and step.new_tokens.tolist() == [10, 5]


def test_eos_draws_follow_the_per_token_probability() -> None:
    """With ignore_eos=False each token after min_tokens is EOS with the profile's probability (geometric)."""
    p, min_tokens = 0.1, 5
    limits = SchedulerLimits(
        max_num_seqs=256, max_num_batched_tokens=4096, max_model_len=512, block_size=16, num_gpu_blocks=10_000
    )
    engine = EngineCore(limits, TINY_COST, p, seed=3)
    reqs = [RequestSpec(0.0, 8, 400, ignore_eos=False, min_tokens=min_tokens) for _ in range(2000)]
    trace = drive(engine, reqs)
    check_outcome(engine, reqs, trace)
    outputs = np.array([f.outputs for f in trace.fates])
    assert outputs.min() == min_tokens + 1
    assert abs(float((outputs == min_tokens + 1).mean()) - p) < 0.02  # EOS right at the first allowed token
    assert float(outputs.mean()) == pytest.approx(min_tokens + 1 / p, rel=0.08)
    assert engine.stats.request_success["stop"] == 2000


# ----- regressions of engine bugs found by the properties above -------------------------------------


def test_zero_eos_probability_means_outputs_run_to_max_tokens() -> None:
    limits = SchedulerLimits(
        max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64, block_size=16, num_gpu_blocks=8
    )
    engine = EngineCore(limits, TINY_COST, eos_probability=0.0)
    reqs = [RequestSpec(0.0, 10, 20, ignore_eos=False)]
    trace = drive(engine, reqs)
    assert trace.fates[0].outputs == 20 and trace.fates[0].reason == REASON_LENGTH


def test_a_max_model_len_request_accepted_at_startup_is_served() -> None:
    from batchscope.simulator.config import Deployment, ServeConfig
    from batchscope.simulator.virtual import RequestSpec, run_virtual

    # tiny profile at this utilization: 12 blocks, one of them vLLM's null block: 176 usable tokens
    with pytest.raises(ValueError, match="To serve at least one request"):
        Deployment(ServeConfig(model="m", profile="tiny", gpu_memory_utilization=0.2445, max_model_len=192))
    deployment = Deployment(ServeConfig(model="m", profile="tiny", gpu_memory_utilization=0.2445, max_model_len=176))
    assert deployment.kv_plan.num_gpu_blocks == 12
    result = run_virtual(deployment.new_engine(), [RequestSpec(0.0, 166, 10)], max_steps=10_000)
    assert result.records[0].output_tokens == 10
