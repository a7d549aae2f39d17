"""The simulator's promises on the realistic profile (h100-llama-3.1-8b), on the virtual clock.

These are the trade-offs the seed article is about: a larger max_num_batched_tokens admits prompts faster
(lower TTFT) at the price of slower decode steps (higher ITL); a smaller KV pool preempts; a smaller
max_num_seqs queues requests. Plus the start-up memory calibration against vLLM v0.19's log and the
decode-step fit of docs/calibration-sources.md §2. Every workload is fixed and seeded, so the figures are exact.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from batchscope.simulator.config import Deployment, ServeConfig
from batchscope.simulator.engine import EngineCore
from batchscope.simulator.virtual import RequestSpec, SimulationResult, poisson_workload, run_virtual

PROFILE = "h100-llama-3.1-8b"


def engine_for(**flags) -> EngineCore:
    flags.setdefault("max_model_len", 8192)
    return Deployment(ServeConfig(model="m", profile=PROFILE, **flags)).new_engine()


def run(workload: list[RequestSpec], **flags) -> tuple[EngineCore, SimulationResult]:
    engine = engine_for(**flags)
    result = run_virtual(engine, workload)
    assert len(result.records) == len(workload), "every request of the workload finishes"
    return engine, result


PREFILL_HEAVY = poisson_workload(rate=12, count=400, prompt_len=3000, max_tokens=100, seed=1)


def test_larger_token_budget_lowers_ttft_and_raises_itl() -> None:
    small, small_run = run(PREFILL_HEAVY, max_num_batched_tokens=2048)
    large, large_run = run(PREFILL_HEAVY, max_num_batched_tokens=8192)
    ttft_small, ttft_large = small.stats.time_to_first_token.mean, large.stats.time_to_first_token.mean
    itl_small, itl_large = small.stats.inter_token_latency.mean, large.stats.inter_token_latency.mean
    # measured: TTFT 1.06 s -> 0.81 s, ITL 0.050 s -> 0.084 s
    assert ttft_large < 0.85 * ttft_small
    assert itl_large > 1.4 * itl_small
    assert ttft_small == pytest.approx(1.06, rel=0.1) and ttft_large == pytest.approx(0.81, rel=0.1)
    assert itl_small == pytest.approx(0.050, rel=0.1) and itl_large == pytest.approx(0.084, rel=0.1)
    # bigger steps, so fewer of them; both runs deliver the same tokens
    assert large_run.steps < small_run.steps
    assert large.stats.generation_tokens == small.stats.generation_tokens == 400 * 100
    # every step but those of prefill chunks alone (no token: vLLM observes no iteration for them)
    assert small_run.steps - 10 < small.stats.iteration_tokens.count <= small_run.steps
    # the prefill chunks really were bigger: mean tokens per step grows with the budget
    assert large.stats.iteration_tokens.mean > small.stats.iteration_tokens.mean


def test_low_gpu_memory_utilization_preempts_under_high_concurrency() -> None:
    burst = [RequestSpec(0.0, 1000, 1000) for _ in range(256)]
    roomy, roomy_run = run(burst, gpu_memory_utilization=0.92)
    tight, tight_run = run(burst, gpu_memory_utilization=0.3)
    assert roomy.stats.num_preemptions == 0
    assert all(r.preemptions == 0 for r in roomy_run.records)
    assert tight.stats.num_preemptions > 0
    assert sum(r.preemptions for r in tight_run.records) == tight.stats.num_preemptions
    # recompute preemption costs time but never tokens: every request still gets its full output
    assert all(r.output_tokens == 1000 and r.finish_reason == "length" for r in tight_run.records)
    assert tight_run.max_kv_cache_usage > 0.95
    assert tight_run.duration > roomy_run.duration
    assert tight.limits.num_gpu_blocks < roomy.limits.num_gpu_blocks


def test_fewer_seqs_grow_the_queue_and_ttft() -> None:
    wide, wide_run = run(PREFILL_HEAVY, max_num_seqs=128)
    narrow, narrow_run = run(PREFILL_HEAVY, max_num_seqs=16)
    assert narrow_run.mean_waiting > 2 * wide_run.mean_waiting
    assert narrow_run.max_waiting > wide_run.max_waiting
    assert narrow.stats.time_to_first_token.mean > 2 * wide.stats.time_to_first_token.mean
    assert narrow_run.mean_running <= 16
    assert narrow.stats.request_queue_time.mean > wide.stats.request_queue_time.mean


def free_running(seed: int) -> tuple[EngineCore, SimulationResult]:
    workload = [
        RequestSpec(spec.arrival, 500, 2000, ignore_eos=False)
        for spec in poisson_workload(rate=4, count=60, prompt_len=500, max_tokens=2000, seed=3)
    ]
    return run(workload, seed=seed)


def test_same_seed_same_records_different_seed_different_lengths() -> None:
    first_engine, first = free_running(seed=7)
    again_engine, again = free_running(seed=7)
    assert first.records == again.records
    assert first.steps == again.steps and first.duration == again.duration
    assert first_engine.stats.generation_tokens == again_engine.stats.generation_tokens
    lengths = [r.output_tokens for r in sorted(first.records, key=lambda r: r.index)]
    assert len(set(lengths)) > 10, "EOS draws give varied output lengths"
    assert sum(r.finish_reason == "stop" for r in first.records) > len(lengths) // 2
    _, other = free_running(seed=8)
    other_lengths = [r.output_tokens for r in sorted(other.records, key=lambda r: r.index)]
    assert other_lengths != lengths


def test_startup_kv_cache_matches_vllm_v019_log() -> None:
    deployment = Deployment(
        ServeConfig(
            model="m",
            profile=PROFILE,
            gpu_memory_utilization=0.95,
            max_num_batched_tokens=8192,
            max_num_seqs=1024,
            max_model_len=8192,
        )
    )
    lines = deployment.kv_plan.log_lines()
    # v0.19's capacity, in 0.32's one-line format
    assert "GPU KV cache size: 476,016 tokens, Maximum concurrency for 8,192 tokens per request: 58.11x" in lines
    assert "Model loading took 14.99 GiB" in lines
    assert deployment.limits().num_gpu_blocks * 16 == 476_016


def test_startup_kv_cache_shrinks_with_utilization_and_token_budget() -> None:
    def tokens(**flags) -> int:
        return Deployment(ServeConfig(model="m", profile=PROFILE, max_model_len=8192, **flags)).kv_plan.kv_cache_tokens

    # a bigger profiled batch takes activation memory away from the cache; so does a lower utilization
    assert tokens(max_num_batched_tokens=8192) < tokens(max_num_batched_tokens=2048)
    assert tokens(gpu_memory_utilization=0.5) < tokens(gpu_memory_utilization=0.92)


def test_invalid_configs_are_rejected() -> None:
    with pytest.raises(ValueError, match="To serve at least one request with the models's max seq len \\(131072\\)"):
        Deployment(ServeConfig(model="m", profile=PROFILE, gpu_memory_utilization=0.3, max_model_len=131072))
    with pytest.raises(ValueError, match="greater than the derived max_model_len"):
        Deployment(ServeConfig(model="m", profile=PROFILE, max_model_len=200_000))
    with pytest.raises(ValidationError, match="must be greater than or equal to max_num_seqs"):
        ServeConfig(model="m", max_num_batched_tokens=64, max_num_seqs=128)
    for utilization in (0, 1.5):
        with pytest.raises(ValidationError, match="gpu_memory_utilization"):
            ServeConfig(model="m", gpu_memory_utilization=utilization)
    # the boundaries themselves are fine
    ServeConfig(model="m", max_num_batched_tokens=128, max_num_seqs=128, gpu_memory_utilization=1.0)


@pytest.mark.parametrize("prompt_len", [1000, 32_000, 120_000])
def test_single_request_decode_itl_matches_calibration_fit(prompt_len: int) -> None:
    """Concurrency 1: each decode step costs 6.44 ms + 4.37e-5 ms per context token (docs/calibration-sources.md §2)."""
    engine = engine_for(max_model_len=131072)
    engine.add_request(0.0, prompt_len, 64)
    now, itls = 0.0, []
    for _ in range(10_000):
        step = engine.schedule(now)
        if step is None:
            break
        context = int(engine.slots.num_computed[step.slots].sum())
        output = engine.complete(step, step.end)
        if output.token_slots.size and output.token_index[0] > 1:
            assert step.new_tokens.tolist() == [1]
            itls.append((context, step.end - now))
        now = step.end
    assert len(itls) == 63
    for context, itl in itls:
        fit = (6.44 + 4.37e-5 * context) / 1000
        assert itl == pytest.approx(fit, rel=0.02), f"context {context}"
    mean_context = sum(c for c, _ in itls) / len(itls)
    assert engine.stats.inter_token_latency.mean == pytest.approx((6.44 + 4.37e-5 * mean_context) / 1000, rel=0.02)
