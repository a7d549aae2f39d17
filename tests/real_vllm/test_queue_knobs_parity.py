"""vLLM 0.32's queue knobs, real and simulated: one vLLM and one simulator started with the same queue flags
(tests/simulator/admission_scenarios.py's QUEUE_FLAGS) take the same deterministic loads, and must agree exactly
on who was refused, with which body, the counter's increase, the RUNNING cap, and a long prefill's steps."""

from __future__ import annotations

import json
import math

import pytest
import requests

from batchscope.testkit.simulator import start_simulator
from batchscope.vllm import admission
from tests.real_vllm.support import SERVED_NAME, tier
from tests.simulator.admission_scenarios import (
    ACTIVE,
    LONG_PROMPT,
    QUEUE_FLAGS,
    RUNS,
    THRESHOLD,
    body,
    burst_over,
    long_prefills,
)

# opt-in (`make test-queue-parity`): a burst on the CPU build timed out once on a loaded CI machine
pytestmark = pytest.mark.queue_parity


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """(real vLLM, simulator), both with QUEUE_FLAGS; the simulator speaks as the tier's model."""
    folder = tmp_path_factory.mktemp("queue-knobs")
    real = tier().start(folder, *QUEUE_FLAGS)
    sim = start_simulator(folder, *QUEUE_FLAGS, "--served-model-name", SERVED_NAME, "--vocab-size",
                          str(tier().model_facts()["vocab_size"]))
    for server in (real, sim):  # a real vLLM's first request is slow (seconds): not inside a burst's window
        requests.post(server.url + "/v1/completions", json=body(SERVED_NAME, 50, 10, 4), timeout=60).raise_for_status()
    yield real, sim
    sim.stop()
    real.stop()


def parsed(bodies: set[str]) -> list[dict]:
    return [json.loads(text) for text in bodies]


@pytest.mark.parametrize(("count", "prompt_len", "reason", "refused"), [
    (5, 1000, "max_num_queued_tokens", 2),  # queued prompts 0, 1000, 2000 < 2500 pass; at 3000 refused
    (8, 10, "max_num_queued_reqs", 4),  # 2 running + 4 queued = 6 = the limit
])
def test_a_burst_over_an_admission_limit_is_refused_alike(servers, count, prompt_len, reason, refused):
    real, sim = (burst_over(server.url, SERVED_NAME, count, prompt_len) for server in servers)
    for figures in (real, sim):
        assert figures.refused == {reason: refused}
        assert figures.counter_increase[reason] == refused and sum(figures.counter_increase.values()) == refused
        assert (figures.running, figures.waiting) == (ACTIVE, count - refused), "RUNNING held at the active cap"
        assert all(body == admission.error_body(reason) for body in parsed(figures.bodies))
    assert set(parsed(real.bodies)[0]) == set(parsed(sim.bodies)[0])


def test_a_long_prefill_beside_a_decode_takes_the_capped_number_of_steps_alike(servers):
    """ceil(1000 / 64) = 16 steps of prefill beside one decode, counted by the decode's tokens meanwhile (the band:
    docs/simulator.md); iteration_tokens observes the prompt once, whole, on both (1000 + 2 tokens)."""
    steps = math.ceil(LONG_PROMPT / THRESHOLD)
    real, sim = (long_prefills(server.url, SERVED_NAME) for server in servers)
    print(f"\nthe decode's tokens during the prefill: vLLM {real.decode_tokens}, simulator {sim.decode_tokens}")
    for figures in (real, sim):
        assert steps - 1 <= figures.median <= steps + 3, (real, sim)
        assert {bound: n for bound, n in figures.iteration_tokens.items() if n} == {1024.0: RUNS}, (real, sim)
