"""The virtual clock and the real-time server agree on the same workload (issue 11): TTFT, ITL and E2E means.

The real-time server runs the h100-llama-3.1-8b profile, front-end latencies included; a Poisson load of
distinct streaming prompts is sent to it and its ground-truth log gives each request's server-side arrival,
first and last token write. The same requests (same arrival offsets, prompt ids and lengths) then run on the
virtual clock. Prompts are long so that the real-time server's own event-loop jitter (a millisecond or so on
a loaded machine) stays a small part of TTFT; the load is modest so that the loop keeps up on two busy cores.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import numpy as np
import pytest

from batchscope.simulator.config import Deployment, ServeConfig
from batchscope.simulator.virtual import RequestSpec, run_virtual
from batchscope.testkit.simulator import start_simulator

RATE, COUNT, PROMPT, OUTPUT = 6.0, 36, 1500, 64
FLAGS = {"max_num_seqs": 128, "max_num_batched_tokens": 2048, "gpu_memory_utilization": 0.9, "max_model_len": 8192}
TOLERANCE = 0.05


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(11)
    return [rng.integers(1, 120_000, size=PROMPT).tolist() for _ in range(COUNT)]


async def send_all(url: str, bodies: list[list[int]]) -> None:
    gaps = np.random.default_rng(5).exponential(1 / RATE, size=COUNT)

    async def one(session: aiohttp.ClientSession, index: int, delay: float) -> None:
        await asyncio.sleep(delay)
        body = {"prompt": bodies[index], "max_tokens": OUTPUT, "ignore_eos": True, "stream": True}
        async with session.post(url + "/v1/completions", json=body, headers={"X-Request-Id": str(index)}) as reply:
            assert reply.status == 200
            await reply.read()

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session, i, float(t)) for i, t in enumerate(np.cumsum(gaps))))


def means(ttft: list[float], itl: list[float], e2e: list[float]) -> dict[str, float]:
    return {"ttft": float(np.mean(ttft)), "itl": float(np.mean(itl)), "e2e": float(np.mean(e2e))}


@pytest.mark.e2e
def test_virtual_clock_and_real_time_server_agree_within_5_percent(tmp_path):
    bodies = prompts()
    truth = tmp_path / "truth.jsonl"
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in FLAGS.items()]
    sim = start_simulator(tmp_path, *flags, "--ground-truth-log", str(truth))
    try:
        asyncio.run(send_all(sim.url, bodies))
    finally:
        sim.stop()
    records = sorted((json.loads(line) for line in truth.read_text().splitlines()), key=lambda r: r["arrival_s"])
    assert len(records) == COUNT and all(r["outcome"] == "ok" for r in records)
    real = means([r["first_token_s"] - r["arrival_s"] for r in records],
                 [(r["last_token_s"] - r["first_token_s"]) / (OUTPUT - 1) for r in records],
                 [r["last_token_s"] - r["arrival_s"] for r in records])

    start = records[0]["arrival_s"]
    # the server's prompts get BOS only from text; token-id prompts are taken as given
    workload = [RequestSpec(r["arrival_s"] - start, PROMPT, OUTPUT, prompt_ids=tuple(bodies[int(r["request_id"])]))
                for r in records]
    engine = Deployment(ServeConfig(model="m", **FLAGS)).new_engine()
    virtual = run_virtual(engine, workload).records
    modelled = means([v.first_token - v.arrival for v in virtual],
                     [(v.finished - v.first_token) / (OUTPUT - 1) for v in virtual],
                     [v.finished - v.arrival for v in virtual])

    errors = {name: real[name] / modelled[name] - 1 for name in real}
    assert all(abs(error) <= TOLERANCE for error in errors.values()), (real, modelled, errors)
    assert modelled["ttft"] > 0.02, "front-end latencies and a long prefill make TTFT tens of milliseconds"
