"""Run the engine core on a virtual clock: minutes of load in a fraction of a second, deterministically.

Used by the tests and for what-if runs: hand it a workload (arrival times and lengths) and it steps the
engine from event to event, never sleeping.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from simulator.engine import REASON_LENGTH, EngineCore


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload: when it arrives and how long it is."""

    arrival: float
    prompt_len: int
    max_tokens: int
    ignore_eos: bool = True
    min_tokens: int = 0


@dataclass(frozen=True)
class RequestRecord:
    """One finished request, timed on the virtual clock (seconds)."""

    index: int
    arrival: float
    first_scheduled: float
    first_token: float
    finished: float
    prompt_tokens: int
    output_tokens: int
    finish_reason: str
    preemptions: int


@dataclass
class SimulationResult:
    """Per-request records plus time-weighted scheduler state over the run."""

    records: list[RequestRecord] = field(default_factory=list)
    steps: int = 0
    duration: float = 0.0
    mean_waiting: float = 0.0
    max_waiting: int = 0
    mean_running: float = 0.0
    max_kv_cache_usage: float = 0.0


def poisson_workload(
    rate: float, count: int, prompt_len: int, max_tokens: int, seed: int = 0
) -> list[RequestSpec]:
    """``count`` identical requests with exponential inter-arrival gaps at ``rate`` per second."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=count)
    return [RequestSpec(float(t), prompt_len, max_tokens) for t in np.cumsum(gaps)]


def run_virtual(engine: EngineCore, workload: Sequence[RequestSpec], max_steps: int = 5_000_000) -> SimulationResult:
    """Feed ``workload`` to ``engine`` at its arrival times and step until every request has finished."""
    pending = sorted(range(len(workload)), key=lambda i: workload[i].arrival)
    slot_to_index: dict[int, int] = {}
    result = SimulationResult()
    now, next_arrival = 0.0, 0
    waiting_area = running_area = 0.0
    while result.steps < max_steps:
        while next_arrival < len(pending) and workload[pending[next_arrival]].arrival <= now:
            index = pending[next_arrival]
            spec = workload[index]
            slot = engine.add_request(spec.arrival, spec.prompt_len, spec.max_tokens, spec.ignore_eos, spec.min_tokens)
            slot_to_index[slot] = index
            next_arrival += 1
        step = engine.schedule(now)
        if step is None:
            if next_arrival == len(pending):
                break
            now = workload[pending[next_arrival]].arrival
            continue
        result.max_waiting = max(result.max_waiting, engine.num_waiting)
        waiting_area += engine.num_waiting * (step.end - step.start)
        running_area += engine.num_running * (step.end - step.start)
        result.max_kv_cache_usage = max(result.max_kv_cache_usage, engine.kv_cache_usage)
        output = engine.complete(step, step.end)
        result.steps += 1
        now = step.end
        for slot, reason in zip(output.finished_slots.tolist(), output.finish_reasons.tolist(), strict=True):
            result.records.append(_record(engine, slot, slot_to_index.pop(slot), reason))
    else:
        raise RuntimeError(f"virtual run did not finish within max_steps={max_steps}")
    result.duration = now
    if now > 0:
        result.mean_waiting = waiting_area / now
        result.mean_running = running_area / now
    return result


def _record(engine: EngineCore, slot: int, index: int, reason: int) -> RequestRecord:
    # read right after complete(): the slot is released but not reused before the next add_request
    return RequestRecord(
        index=index,
        arrival=float(engine.arrival[slot]),
        first_scheduled=float(engine.first_scheduled[slot]),
        first_token=float(engine.first_token[slot]),
        finished=float(engine.last_token[slot]),
        prompt_tokens=int(engine.prompt_len[slot]),
        output_tokens=int(engine.num_output[slot]),
        finish_reason="length" if reason == REASON_LENGTH else "stop",
        preemptions=int(engine.preemptions[slot]),
    )
