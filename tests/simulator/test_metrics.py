"""vLLM's /metrics as the simulator exposes it: names, types, labels, buckets, and values equal to events."""

from __future__ import annotations

import pytest
import requests
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from batchscope.vllm_buckets import ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS, build_1_2_5_buckets
from simulator.config import Deployment, ServeConfig
from simulator.metrics import VllmMetricsCollector
from simulator.virtual import RequestSpec, run_virtual

LABELS = {"model_name": "m", "engine": "0"}
REQUIRED = {
    "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge", "vllm:kv_cache_usage_perc": "gauge",
    "vllm:num_preemptions": "counter", "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter", "vllm:iteration_tokens_total": "histogram",
    "vllm:time_to_first_token_seconds": "histogram", "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram", "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram", "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram", "vllm:request_inference_time_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram", "vllm:request_generation_tokens": "histogram",
    "vllm:cache_config_info": "gauge",
}


def run_engine(workload=None, **overrides):
    deployment = Deployment(ServeConfig(model="m", profile="tiny", **overrides))
    engine = deployment.new_engine()
    workload = workload or [RequestSpec(arrival=0.01 * i, prompt_len=300 + i, max_tokens=50 + i) for i in range(40)]
    run_virtual(engine, workload)
    registry = CollectorRegistry()
    registry.register(VllmMetricsCollector(engine, "m", {"block_size": "16", "num_gpu_blocks": "99"}))
    return engine, workload, registry


def bucket_bounds(registry, name):
    return [float(s.labels["le"]) for f in registry.collect() for s in f.samples
            if s.name == name + "_bucket" and s.labels["le"] != "+Inf"]


def test_every_required_family_is_exposed_with_vllms_type_and_labels():
    _, _, registry = run_engine()
    families = {f.name: f for f in registry.collect()}
    for name, kind in REQUIRED.items():
        assert families[name].type == kind, name
        # vLLM labels cache_config_info with the CacheConfig fields and engine only
        expected = {"engine"} if name == "vllm:cache_config_info" else {"model_name", "engine"}
        assert all(expected <= set(s.labels) for s in families[name].samples), name


def test_bucket_boundaries_are_vllms():
    _, _, registry = run_engine()
    assert bucket_bounds(registry, "vllm:time_to_first_token_seconds") == list(TTFT_BUCKETS)
    assert TTFT_BUCKETS[:3] == (0.001, 0.005, 0.01) and TTFT_BUCKETS[-1] == 2560.0
    assert bucket_bounds(registry, "vllm:inter_token_latency_seconds") == list(ITL_BUCKETS)
    assert bucket_bounds(registry, "vllm:e2e_request_latency_seconds") == list(REQUEST_LATENCY_BUCKETS)
    assert bucket_bounds(registry, "vllm:iteration_tokens_total") == [
        1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
    assert bucket_bounds(registry, "vllm:request_prompt_tokens") == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]
    assert build_1_2_5_buckets(100) == (1, 2, 5, 10, 20, 50, 100)


def test_counters_and_histograms_equal_the_simulated_events():
    engine, workload, registry = run_engine()
    get = lambda name, **extra: registry.get_sample_value(name, {**LABELS, **extra})  # noqa: E731
    outputs = sum(r.max_tokens for r in workload)
    prompts = sum(r.prompt_len for r in workload)
    assert get("vllm:generation_tokens_total") == outputs
    assert get("vllm:prompt_tokens_total") == prompts
    assert get("vllm:request_success_total", finished_reason="length") == len(workload)
    assert get("vllm:request_success_total", finished_reason="abort") == 0
    assert get("vllm:time_to_first_token_seconds_count") == len(workload)
    assert get("vllm:inter_token_latency_seconds_count") == outputs - len(workload)
    assert get("vllm:e2e_request_latency_seconds_count") == len(workload)
    assert get("vllm:request_generation_tokens_sum") == outputs
    assert get("vllm:iteration_tokens_total_sum") == prompts + outputs
    assert get("vllm:num_requests_running") == 0 and get("vllm:kv_cache_usage_perc") == 0
    # the TTFT histogram's sum is the sum of per-request TTFTs
    assert get("vllm:time_to_first_token_seconds_sum") == pytest.approx(engine.stats.time_to_first_token.sum)
    assert registry.get_sample_value("vllm:cache_config_info", {"block_size": "16", "num_gpu_blocks": "99",
                                                                "engine": "0"}) == 1


def test_preemptions_are_counted_when_the_cache_is_small():
    burst = [RequestSpec(arrival=0.0, prompt_len=300, max_tokens=500) for _ in range(40)]
    engine, _, registry = run_engine(burst, gpu_memory_utilization=0.28, max_model_len=2048)
    assert engine.stats.num_preemptions > 0
    assert registry.get_sample_value("vllm:num_preemptions_total", LABELS) == engine.stats.num_preemptions


@pytest.mark.e2e
def test_http_metrics_are_classic_text_with_colons_whatever_accept_says(simulator):
    sim = simulator("--profile", "tiny")
    for _ in range(3):
        requests.post(sim.url + "/v1/completions", json={"prompt": [1] * 100, "max_tokens": 10, "ignore_eos": True},
                      timeout=10).raise_for_status()
    reply = requests.get(sim.url + "/metrics", timeout=5,
                         headers={"Accept": "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"})
    assert reply.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "vllm:generation_tokens_total{" in reply.text and "vllm_" not in reply.text
    samples = {(s.name, s.labels.get("finished_reason")): s.value
               for f in text_string_to_metric_families(reply.text) for s in f.samples}
    assert samples[("vllm:generation_tokens_total", None)] == 30
    assert samples[("vllm:prompt_tokens_total", None)] == 300
    assert samples[("vllm:request_success_total", "length")] == 3
    assert samples[("vllm:inter_token_latency_seconds_count", None)] == 27
    assert samples[("http_requests_total", None)] >= 3
