"""The throughput bench's runs: closed loops on the tiny profile, the paced run on the H100 profile (its stream
count from the cost model, then rescaled), and the virtual clock's speed."""

from __future__ import annotations

import time

import numpy as np

from batchscope.simulator.config import Deployment, ServeConfig
from batchscope.simulator.cost import StepCostModel
from batchscope.simulator.profile import load_profile
from batchscope.simulator.virtual import poisson_workload, run_virtual
from throughput.measure import run
from throughput.results import RunResult, RunSpec, VirtualResult
from throughput.settings import (
    CLOSED_LOOP_STREAMS,
    PACED_ATTEMPTS,
    PACED_PROFILE,
    PACED_TOKENS_PER_S,
    PACED_TOLERANCE,
)


def closed_loop_specs(prompt_len: int, max_tokens: int) -> list[RunSpec]:
    return [RunSpec(f"closed loop {n}", "tiny", n, prompt_len, max_tokens, max_num_seqs=1024,
                    max_num_batched_tokens=8192, gpu_memory_utilization=1.0) for n in CLOSED_LOOP_STREAMS]


def modelled_streams(tokens_per_s: float, prompt_len: int, max_tokens: int) -> int:
    """The stream count whose decode steps, priced by the paced profile's cost model, stream tokens_per_s."""
    cost = StepCostModel(load_profile(PACED_PROFILE))
    context = prompt_len + max_tokens / 2  # a stream's mean context over its life
    counts = np.arange(1, 1025)
    rates = [n / cost.step_seconds(np.ones(n), np.full(n, context)) for n in counts]
    return int(counts[np.argmin(np.abs(np.array(rates) - tokens_per_s))])


def paced_run(prompt_len: int, max_tokens: int, warmup_s: float, duration_s: float) -> list[RunResult]:
    """Runs at ~PACED_TOKENS_PER_S, rescaling the stream count from each measured rate; the last one counts."""
    streams = modelled_streams(PACED_TOKENS_PER_S, prompt_len, max_tokens)
    attempts: list[RunResult] = []
    for _ in range(PACED_ATTEMPTS):
        spec = RunSpec(f"paced ~{PACED_TOKENS_PER_S:,} tok/s", PACED_PROFILE, streams, prompt_len, max_tokens,
                       max_num_seqs=256, max_num_batched_tokens=8192, gpu_memory_utilization=0.92)
        attempts.append(run(spec, warmup_s, duration_s))
        rate = attempts[-1].tokens_per_s
        if abs(rate / PACED_TOKENS_PER_S - 1) <= PACED_TOLERANCE or rate <= 0:
            break
        streams = max(1, round(streams * PACED_TOKENS_PER_S / rate))
    return attempts


def virtual_clock() -> VirtualResult:
    config = ServeConfig(model="m", profile="h100-llama-3.1-8b", max_model_len=8192, max_num_seqs=256)
    engine = Deployment(config).new_engine()
    workload = poisson_workload(rate=12, count=3000, prompt_len=1000, max_tokens=1000, seed=1)
    start = time.perf_counter()
    result = run_virtual(engine, workload)
    wall = time.perf_counter() - start
    return VirtualResult("Poisson 12 req/s x 3000 requests of 1000+1000 tokens, h100-llama-3.1-8b, max_num_seqs "
                         "256", len(result.records), result.steps, result.duration, wall, result.mean_running)
