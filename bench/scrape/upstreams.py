"""What the bench's stubs serve: vLLM's /metrics (the catalogue's families, vLLM's buckets, replicated over
data-parallel engines, with the process, platform, GC and fastapi families vLLM's server adds), /v1/models and
/version; and a load generator master's /metrics over synthetic finished requests."""

from __future__ import annotations

import json
import random
import time

import numpy as np
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    Summary,
    generate_latest,
)

from batchscope.loadgen.figures.metrics import ClientMetricsCollector, ClientStats
from batchscope.loadgen.stream.request import RequestRecord
from batchscope.vllm import catalogue as vllm
from batchscope.vllm.buckets import (
    ITERATION_TOKEN_BUCKETS,
    ITL_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    build_1_2_5_buckets,
)
from scrape.settings import MAX_ENGINES, MAX_MODEL_LEN, MODEL, VLLM_VERSION

# vLLM V1's families per engine (the catalogue's), with the bucket boundaries vLLM gives each histogram
GAUGES = (vllm.NUM_REQUESTS_RUNNING, vllm.NUM_REQUESTS_WAITING, vllm.KV_CACHE_USAGE)
COUNTERS = (vllm.NUM_PREEMPTIONS, vllm.PROMPT_TOKENS, vllm.GENERATION_TOKENS, vllm.PREFIX_CACHE_QUERIES,
            vllm.PREFIX_CACHE_HITS)
TOKEN_BUCKETS = build_1_2_5_buckets(MAX_MODEL_LEN)
HISTOGRAMS: tuple[tuple[vllm.VllmMetric, tuple[float, ...]], ...] = (
    (vllm.ITERATION_TOKENS, ITERATION_TOKEN_BUCKETS),
    (vllm.TIME_TO_FIRST_TOKEN, TTFT_BUCKETS),
    (vllm.INTER_TOKEN_LATENCY, ITL_BUCKETS),
    (vllm.REQUEST_TIME_PER_OUTPUT_TOKEN, ITL_BUCKETS),
    (vllm.E2E_REQUEST_LATENCY, REQUEST_LATENCY_BUCKETS),
    (vllm.REQUEST_QUEUE_TIME, REQUEST_LATENCY_BUCKETS),
    (vllm.REQUEST_INFERENCE_TIME, REQUEST_LATENCY_BUCKETS),
    (vllm.REQUEST_PREFILL_TIME, REQUEST_LATENCY_BUCKETS),
    (vllm.REQUEST_DECODE_TIME, REQUEST_LATENCY_BUCKETS),
    (vllm.REQUEST_PROMPT_TOKENS, TOKEN_BUCKETS),
    (vllm.REQUEST_GENERATION_TOKENS, TOKEN_BUCKETS),
    (vllm.REQUEST_MAX_NUM_GENERATION_TOKENS, TOKEN_BUCKETS),
    (vllm.REQUEST_PARAMS_N, (1, 2, 5, 10, 20)),
    (vllm.REQUEST_PARAMS_MAX_TOKENS, TOKEN_BUCKETS),
)
CACHE_CONFIG = {"block_size": "16", "cache_dtype": "auto", "calculate_kv_scales": "False", "cpu_offload_gb": "0",
                "enable_prefix_caching": "True", "gpu_memory_utilization": "0.9", "is_attention_free": "False",
                "num_cpu_blocks": "2048", "num_gpu_blocks": "27876", "num_gpu_blocks_override": "None",
                "prefix_caching_hash_algo": "sha256", "sliding_window": "None", "swap_space": "4",
                "swap_space_bytes": "4294967296"}
HANDLERS = ("/v1/completions", "/v1/chat/completions", "/metrics", "/health", "/v1/models")


def _observe_latencies(histogram, buckets: tuple, rng: np.random.Generator, count: int) -> None:
    top = float(buckets[-1])
    for value in rng.lognormal(np.log(top / 200), 1.2, count):
        histogram.observe(float(min(value, top * 2)))


def _add_engine(metrics: dict, engine: str, rng: np.random.Generator) -> None:
    labels = {"model_name": MODEL, "engine": engine}
    for metric in GAUGES:
        metrics[metric.name].labels(**labels).set(float(rng.integers(0, 64)))
    for metric in COUNTERS:
        metrics[metric.name].labels(**labels).inc(float(rng.integers(0, 10**7)))
    for reason in ("stop", "length", "abort"):
        metrics[vllm.REQUEST_SUCCESS.name].labels(finished_reason=reason, **labels).inc(float(rng.integers(0, 10**4)))
    for metric, buckets in HISTOGRAMS:
        _observe_latencies(metrics[metric.name].labels(**labels), buckets, rng, 40)
    metrics[vllm.CACHE_CONFIG_INFO.name].labels(**CACHE_CONFIG, engine=engine).set(1.0)


def _http_families(registry: CollectorRegistry, rng: np.random.Generator) -> None:
    """prometheus_fastapi_instrumentator's families, which vLLM's /metrics carries and the exporter drops."""
    requests_total = Counter("http_requests", "Total number of requests by method, status and handler.",
                             ["method", "status", "handler"], registry=registry)
    sizes = [Summary(f"http_{kind}_size_bytes", f"Content length of incoming {kind}s by handler.", ["handler"],
                     registry=registry) for kind in ("request", "response")]
    duration = Histogram("http_request_duration_seconds", "Latency with only few buckets by handler.",
                         ["method", "handler"], buckets=(0.1, 0.5, 1.0), registry=registry)
    highr = Histogram("http_request_duration_highr_seconds", "Latency with many buckets but no API specific labels.",
                      buckets=tuple(round(0.01 * 1.5**i, 4) for i in range(27)), registry=registry)
    for handler in HANDLERS:
        method = "POST" if handler.endswith("completions") else "GET"
        requests_total.labels(method, "2xx", handler).inc(float(rng.integers(1, 10**5)))
        for size in sizes:
            size.labels(handler).observe(float(rng.integers(10, 10**4)))
        duration.labels(method, handler).observe(float(rng.exponential(0.3)))
        highr.observe(float(rng.exponential(0.3)))


def render_vllm(engines: int, seed: int = 1) -> bytes:
    """vLLM's /metrics text with ``engines`` data-parallel engines, as vLLM renders it (prometheus_client)."""
    rng = np.random.default_rng(seed)
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    _http_families(registry, rng)
    metrics: dict = {m.name: Gauge(m.name, m.help, m.labels, registry=registry) for m in GAUGES}
    metrics |= {m.name: Counter(m.name, m.help, m.labels, registry=registry) for m in COUNTERS}
    success = vllm.REQUEST_SUCCESS
    metrics[success.name] = Counter(success.name, success.help, success.labels, registry=registry)
    metrics |= {m.name: Histogram(m.name, m.help, m.labels, buckets=buckets, registry=registry)
                for m, buckets in HISTOGRAMS}
    info = vllm.CACHE_CONFIG_INFO
    metrics[info.name] = Gauge(info.name, info.help, [*CACHE_CONFIG, *info.labels], registry=registry)
    for engine in range(engines):
        _add_engine(metrics, str(engine), rng)
    return generate_latest(registry)


def sample_lines(text: bytes, prefix: str = "") -> int:
    """Series in an exposition: sample lines (not comments, not blank) whose name starts with ``prefix``."""
    needle = prefix.encode()
    return sum(1 for line in text.splitlines() if line and not line.startswith(b"#") and line.startswith(needle))


def vllm_exposition(target_series: int) -> tuple[bytes, int]:
    """(text, engines): the engine count whose exposition comes closest to ``target_series`` sample lines."""
    one, two = sample_lines(render_vllm(1)), sample_lines(render_vllm(2))
    per_engine = two - one
    engines = min(max(1, round(1 + (target_series - one) / per_engine)), MAX_ENGINES)
    return render_vllm(engines), engines


def synthetic_records(count: int, seed: int = 2) -> list[RequestRecord]:
    """Finished requests with plausible timings (a few failures), as the load generator records them."""
    rnd = random.Random(seed)
    outcomes = ["ok"] * 96 + ["http_error", "timeout", "truncated", "connection_error"]
    records = []
    start = time.time() - 600
    for index in range(count):
        scheduled = start + index * 0.2
        sent = scheduled + rnd.expovariate(2000)
        ttft = rnd.lognormvariate(-2.5, 0.6)
        gaps = [rnd.lognormvariate(-4.0, 0.4) for _ in range(rnd.randint(20, 60))]
        e2e = ttft + sum(gaps)
        records.append(RequestRecord(
            request_id=f"r{index}", worker=index % 2, scheduled_s=scheduled, sent_s=sent,
            first_token_s=scheduled + ttft, last_token_s=scheduled + e2e, end_s=scheduled + e2e, ttft_s=ttft,
            tpot_s=sum(gaps) / len(gaps), e2e_s=e2e, itl_s=gaps, prompt_tokens=rnd.randint(200, 2000),
            output_tokens=len(gaps) + 1, outcome=rnd.choice(outcomes), status=200))
    return records


def client_exposition(records: int) -> bytes:
    """The load generator master's /metrics over ``records`` finished requests."""
    stats = ClientStats()
    for record in synthetic_records(records):
        stats.observe(record)
    stats.started = records + 12
    spec = {"mode": "poisson", "rate_rps": "5", "prompt_tokens": "1000", "output_tokens": "40", "duration_s": "600"}
    collector = ClientMetricsCollector(stats, lambda: 12, "bench-exporter-scrape", "chat-1k", lambda: spec,
                                       lambda: None)
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry)


def vllm_json_routes() -> dict[str, bytes]:
    card = {"id": MODEL, "object": "model", "created": int(time.time()), "owned_by": "vllm", "root": MODEL,
            "parent": None, "max_model_len": MAX_MODEL_LEN, "permission": []}
    return {"/v1/models": json.dumps({"object": "list", "data": [card]}).encode(),
            "/version": json.dumps({"version": VLLM_VERSION}).encode()}
