"""Automatic prefix caching (issue 11): vLLM V1's block pool semantics, hits that skip prefill, and invariants.

Unit tests of the free-block queue (LRU: freed blocks to the tail, allocation evicts from the head, a hit takes
a block out of the queue), a virtual-clock run showing TTFT fall with a shared prefix and the hit counters
matching the shared tokens, and hypothesis properties: caching never changes outputs or token counts, and the
block accounting stays exact (no block freed twice, none leaked) through preemptions and aborts.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchscope.simulator.config import Deployment, ServeConfig
from batchscope.simulator.cost import StepCostModel
from batchscope.simulator.engine import EngineCore, SchedulerLimits
from batchscope.simulator.prefix_cache import PrefixCache, block_hashes
from batchscope.simulator.profile import load_profile
from batchscope.simulator.slots import RUNNING
from batchscope.simulator.virtual import RequestSpec, add_to_engine, run_virtual

TINY_COST = StepCostModel(load_profile("tiny"))


def test_equal_prefixes_give_equal_chained_hashes():
    a = block_hashes(list(range(40)), 16)
    b = block_hashes([*range(32), 99, 98], 16)
    c = block_hashes([7, *range(1, 40)], 16)
    assert len(a) == 2 and a == b[:2]
    assert not set(a) & set(c), "a different first block changes every later hash (chained)"


def test_free_queue_is_lru_freed_to_the_tail_allocated_from_the_head():
    cache = PrefixCache(4)
    cache.take(3)  # three anonymous blocks in use, one free
    for block in (11, 12, 13):
        assert cache.register(block)
    for block in (13, 12, 11):  # a request frees its last block first
        cache.release(block)
    assert cache.free_blocks == 4
    cache.take(2)  # the anonymous block, then 13: the least recently freed cached block is evicted
    assert set(cache.refs) == {11, 12} and cache.evictions == 1
    assert cache.evictable([11, 12]) == 2
    cache.touch([12])  # a hit takes it out of the queue
    assert cache.free_blocks == 1 and cache.refs[12] == 1
    cache.take(1)
    assert set(cache.refs) == {12}, "11 evicted, 12 kept: it is in use"
    cache.release(12)
    assert cache.free_blocks == 1 and cache.refs[12] == 0


def shared_prefix_workload(shared: int, unique: int, count: int, gap_s: float) -> list[RequestSpec]:
    rng = np.random.default_rng(3)
    prefix = rng.integers(1, 100_000, size=shared).tolist()
    return [RequestSpec(i * gap_s, shared + unique, 8, prompt_ids=(*prefix, *rng.integers(1, 100_000, unique).tolist()))
            for i in range(count)]


def h100_engine(caching: bool) -> EngineCore:
    return Deployment(ServeConfig(model="m", max_model_len=8192, enable_prefix_caching=caching)).new_engine()


def test_a_shared_prefix_cuts_ttft_and_the_hits_count_its_tokens():
    workload = shared_prefix_workload(shared=1600, unique=200, count=6, gap_s=1.0)  # one at a time
    cached, plain = h100_engine(True), h100_engine(False)
    with_cache = sorted(run_virtual(cached, workload).records, key=lambda r: r.index)
    without = sorted(run_virtual(plain, workload).records, key=lambda r: r.index)
    ttft = [r.first_token - r.arrival for r in with_cache]
    assert all(t < ttft[0] / 2 for t in ttft[1:]), ttft
    assert all(abs((r.first_token - r.arrival) - (without[0].first_token - without[0].arrival)) < 1e-9
               for r in without), "without caching every request prefills the whole prompt"
    stats = cached.stats
    assert stats.prefix_cache_queries == 6 * 1800
    assert stats.prefix_cache_hits == 5 * 1600  # 100 full blocks shared; the block after them differs
    assert plain.stats.prefix_cache_queries == plain.stats.prefix_cache_hits == 0


def test_a_preempted_request_recomputes_from_its_own_cached_blocks():
    limits = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=2048, block_size=16,
                             num_gpu_blocks=60)
    engine = EngineCore(limits, TINY_COST, 0.0, enable_prefix_caching=True)
    workload = [RequestSpec(0.0, 300, 400), RequestSpec(0.001, 300, 400)]  # together they outgrow 59 blocks
    records = run_virtual(engine, workload).records
    assert sum(r.preemptions for r in records) >= 1
    assert engine.stats.prefix_cache_hits > 0, "the resumed request hit the blocks it had computed"
    assert engine.free_blocks == engine.usable_blocks


def check_blocks(engine: EngineCore) -> None:
    """Every block is in exactly one place: used by running requests (shared ones once) or in the free queue."""
    cache = engine.prefix_cache
    assert cache is not None
    slots = engine.slots
    running = np.flatnonzero(slots.state == RUNNING)
    held = {slot: engine._cached[slot].held for slot in running.tolist()}
    users: dict[int, int] = {}
    for hashes in held.values():
        assert len(hashes) == len(set(hashes))
        for block_hash in hashes:
            users[block_hash] = users.get(block_hash, 0) + 1
    assert {h: n for h, n in cache.refs.items() if n} == users, "ref counts are the holders"
    queued = [key for key in cache._queue if isinstance(key, int)]
    assert sorted(queued) == sorted(h for h, n in cache.refs.items() if n == 0), "free cached blocks are queued"
    anonymous_free = sum(size for key, size in cache._queue.items() if not isinstance(key, int))
    assert cache.free_blocks == anonymous_free + len(queued)
    own = int(slots.num_blocks[running].sum()) - sum(len(h) for h in held.values())
    assert own + len(users) + cache.free_blocks == engine.usable_blocks, "a block leaked or was freed twice"


requests = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 120), st.integers(1, 60), st.floats(0, 0.05)),
                    min_size=1, max_size=14)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=requests, blocks=st.integers(12, 60), budget=st.integers(16, 256), seqs=st.integers(1, 8),
       aborts=st.lists(st.integers(0, 13), max_size=3))
def test_caching_keeps_outputs_and_block_accounting(requests, blocks, budget, seqs, aborts):
    """Requests share one of four prefixes; small pools force preemption; some are aborted mid-run."""
    limits = SchedulerLimits(max_num_seqs=seqs, max_num_batched_tokens=max(budget, seqs), max_model_len=300,
                             block_size=8, num_gpu_blocks=blocks)
    prefixes = [list(range(p * 1000, p * 1000 + 64)) for p in range(4)]
    workload = []
    for index, (prefix, unique, output, gap) in enumerate(requests):
        ids = (*prefixes[prefix][: 8 * prefix + 24], *range(50_000 + index * 200, 50_000 + index * 200 + unique))
        if len(ids) + output <= min(limits.max_model_len, (blocks - 1) * 8):
            workload.append(RequestSpec(gap * index, len(ids), output, ignore_eos=False, prompt_ids=ids))
    outcomes = []
    for caching in (False, True):
        engine = EngineCore(limits, TINY_COST, 0.05, seed=7, enable_prefix_caching=caching)
        slots = [add_to_engine(engine, spec, 0.0) for spec in workload]
        now, steps, ends = 0.0, 0, {}
        while (step := engine.schedule(now)) is not None and steps < 20_000:
            if caching:
                check_blocks(engine)
            output = engine.complete(step, step.end)
            now, steps = step.end, steps + 1
            for slot, reason in zip(output.finished_slots.tolist(), output.finish_reasons.tolist(), strict=True):
                ends[slot] = (reason, int(engine.slots.num_output[slot]))
            # aborted after its first token: the same moment of its life with and without caching (a step count
            # is not: hits shorten prefills, so step 3 finds requests further along with caching on)
            for victim in aborts:
                if victim < len(slots) and slots[victim] not in ends and engine.slots.num_output[slots[victim]]:
                    engine.abort(slots[victim])
                    ends[slots[victim]] = ("aborted", 0)
        assert engine.free_blocks == engine.usable_blocks, "every block back in the free queue"
        outcomes.append(([ends.get(slot) for slot in slots], engine.stats.prompt_tokens,
                         engine.stats.generation_tokens, engine.stats.request_success))
    assert outcomes[0] == outcomes[1], "a cache hit changed an output"
