"""The simulator's queue knobs over HTTP (tests/simulator/admission_scenarios.py's loads): the RUNNING cap, the
bursts over each admission limit (refused exactly past the limit, vLLM's 503 body, the counter by reason), and the
long-prefill cap's steps; the same loads run against real vLLM in tests/real_vllm."""

from __future__ import annotations

import json
import math

import pytest
import requests

from batchscope.testkit.burst import Burst
from batchscope.vllm import admission, catalogue
from tests.conftest import wait_until
from tests.simulator.admission_scenarios import (
    ACTIVE,
    LIMIT_FLAGS,
    LONG_PROMPT,
    QUEUE_FLAGS,
    RUNS,
    THRESHOLD,
    body,
    burst_over,
    hold_running,
    long_prefills,
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


@pytest.mark.parametrize(("flags", "steps"), [
    (QUEUE_FLAGS, math.ceil(LONG_PROMPT / THRESHOLD)),  # 64 a step: 16 steps
    ((*QUEUE_FLAGS, "--long-prefill-token-threshold-adaptive"), 2),  # max(64, 1024 // (1 running + 1 waiting)) = 512
    (LIMIT_FLAGS, 1),  # no cap: 1000 prompt tokens + the decode's 1 fit in 1024
])
def test_a_long_prefill_beside_a_decode_takes_its_capped_number_of_steps(simulator, flags, steps):
    figures = long_prefills(simulator(*flags).url, MODEL)
    assert steps - 1 <= figures.median <= steps + 3, figures
    # each prompt is observed once, in the step its prefill ends: 1000 + its token + the decode's = 1002
    assert {bound: n for bound, n in figures.iteration_tokens.items() if n} == {1024.0: RUNS}
