"""The simulator's queue knobs over HTTP (tests/simulator/admission_scenarios.py's loads): the RUNNING cap, the
bursts over each admission limit (refused exactly past the limit, vLLM's 503 body, the counter by reason), and the
long-prefill cap's iteration_tokens; the same loads run against real vLLM in tests/real_vllm."""

from __future__ import annotations

import json

import pytest
import requests

from batchscope.testkit.burst import Burst
from batchscope.vllm import admission, catalogue
from tests.conftest import wait_until
from tests.simulator.admission_scenarios import (
    ACTIVE,
    QUEUE_FLAGS,
    body,
    burst_over,
    hold_running,
    prefill_beside_a_decode,
    samples,
    value,
)

pytestmark = pytest.mark.e2e
MODEL = "sim-model"


@pytest.fixture
def queue_sim(simulator):
    return simulator(*QUEUE_FLAGS)  # the default profile: a decode step of ~7 ms keeps the holders running


def test_a_burst_over_the_request_limit_is_refused_past_it_and_running_stays_at_the_active_cap(queue_sim):
    figures = burst_over(queue_sim.url, MODEL, 8, 10)
    # 2 running + 4 admitted = 6 = max_num_queued_reqs; the other 4 refused
    assert figures.refused == {"max_num_queued_reqs": 4}
    assert figures.counter_increase == {"max_num_queued_reqs": 4, "max_num_queued_tokens": 0}
    assert (figures.running, figures.waiting) == (ACTIVE, 4)
    # a plain 503 (refused before its stream began) or a stream's error event: vLLM's body either way
    assert figures.bodies and all(json.loads(text) == admission.error_body("max_num_queued_reqs")
                                  for text in figures.bodies)


def test_a_burst_over_the_token_limit_is_refused_once_the_backlog_reaches_it(queue_sim):
    figures = burst_over(queue_sim.url, MODEL, 5, 1000)
    # waiting prompts of 1000 tokens: 0, 1000, 2000 < 2500 admitted, then 3000 >= 2500 refused
    assert figures.refused == {"max_num_queued_tokens": 2}
    assert figures.counter_increase == {"max_num_queued_reqs": 0, "max_num_queued_tokens": 2}
    assert (figures.running, figures.waiting) == (ACTIVE, 3)


def test_a_preflight_refusal_is_a_plain_503_counted_by_the_api_server(queue_sim):
    with Burst(queue_sim.url) as burst:
        hold_running(burst, MODEL)
        burst.send([body(MODEL, 500 + 10 * index, 10, 100) for index in range(4)])
        wait_until(lambda: value(samples(queue_sim.url), catalogue.NUM_REQUESTS_WAITING.name) == 4, 30)
        before = samples(queue_sim.url)
        refused = requests.post(queue_sim.url + "/v1/completions", json={**body(MODEL, 600, 10, 5), "stream": True},
                                timeout=10)
        after = samples(queue_sim.url)
    assert refused.status_code == 503 and refused.headers["Content-Type"].startswith("application/json")
    assert refused.json() == admission.error_body("max_num_queued_reqs")
    key = ("http_requests_total", (("handler", "/v1/completions"), ("method", "POST"), ("status", "5xx")))
    assert after[key] - before.get(key, 0.0) == 1


def test_long_prompts_beside_a_decode_are_observed_once_each_when_their_prefill_ends(queue_sim):
    # each 1000-token prompt, capped at 256 a step, observed once: 1000 + its token + the decode's = 1002
    assert prefill_beside_a_decode(queue_sim.url, MODEL) == {16.0: 0, 32.0: 0, 64.0: 0, 128.0: 0, 256.0: 0,
                                                              512.0: 0, 1024.0: 2, 2048.0: 0, 4096.0: 0, 8192.0: 0,
                                                              16384.0: 0, float("inf"): 0}
