"""A shared-prefix load against the simulator: the server's prefix cache serves exactly the shared tokens.

On chat the prefix is a system prompt of exactly the shared tokens (template included) and each user message is
the request's own, so the cache serves the same tokens as on completions and nothing past them.

That a cache hit also cuts TTFT is shown on the virtual clock (tests/simulator/test_prefix_cache.py), free of
this machine's timing noise.
"""

from __future__ import annotations

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import run_load

pytestmark = pytest.mark.e2e

PREFIX, DISTINCT, INPUT = 256, 2, 528  # the prefix is 16 whole blocks of 16 tokens


def counter(url: str, name: str) -> float:
    text = requests.get(url + "/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_a_shared_prefix_load_hits_the_cache_for_the_shared_tokens_only(simulator, tmp_path, endpoint):
    sim = simulator("--profile", "tiny")
    spec = {"endpoint": endpoint, "input_tokens": INPUT, "output_tokens": 8, "timeout_s": 30, "seed": 5,
            "duration_s": 2, "shared_prefix": {"tokens": PREFIX, "distinct": DISTINCT},
            "load": {"mode": "concurrency", "concurrency": 1}}  # one user: each request comes after the last
    result = run_load(tmp_path, spec, sim.url)
    assert result.returncode == 0, result.output[-3000:]
    ok = [r for r in result.records if r["outcome"] == "ok"]
    assert len(ok) > 2 * DISTINCT and all(r["prompt_tokens"] == INPUT for r in ok)
    # a completions run's pre-flight probes the vocabulary with a prompt of one token (no block to hit)
    queries = counter(sim.url, "vllm:prefix_cache_queries_total") - (endpoint == "completions")
    hits = counter(sim.url, "vllm:prefix_cache_hits_total")
    scheduled, rest = divmod(queries, INPUT)  # every prompt is queried once (the one the stop cut, if scheduled)
    assert rest == 0 and scheduled >= len(ok)
    # each prefix is computed once, by its first request; every later request hits its prefix and nothing else
    assert hits == (scheduled - DISTINCT) * PREFIX
