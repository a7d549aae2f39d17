"""vLLM's metrics as vLLM publishes them: names, types, HELP texts, label names and values, defined once.

From vLLM V1's ``PrometheusStatLogger`` (vllm/v1/metrics/loggers.py),
checked against captured /metrics in tests/fixtures/vllm-metrics-sample.txt and, for the release the project
follows, a real vLLM 0.32.0 /metrics under load (tests/fixtures/vllm-0.32-cpu-metrics.txt). The simulator serves
these, the exporter's tests and the exporter bench expect them. Names are vLLM's code names: prometheus_client
exposes a counter ``vllm:prompt_tokens`` as ``vllm:prompt_tokens_total`` (``exposed_name``). Bucket boundaries
live in batchscope.vllm.buckets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

PREFIX: Final = "vllm:"  # every vLLM family's name starts so
ENGINE_LABELS = ("model_name", "engine")  # served model name, data-parallel engine index ("0", "1", ...)

# /metrics' Content-Type in 0.32, whatever the Accept header (the body is the classic text, `_created` series and
# all). Prometheus 2.x reads any text/plain as the classic format; batchscope's own servers answer 0.0.4
# (batchscope.exporter.exposition) because prometheus-client would otherwise negotiate escaped names
EXPOSITION_CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"

# label values, in vLLM 0.32's order (every one is exposed, at 0 until it happens)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
# 'capacity': in the scheduler's waiting queue, for budget, max_num_seqs or KV room; 'deferred': in its
# skipped-waiting queue, held by a transient constraint (LoRA slots, a KV transfer, a blocked request)
WAITING_REASONS = ("capacity", "deferred")
PROMPT_TOKEN_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
# the cache tier a prefix-cache hit came from (0.32's order); 'device' is the local prefix cache
CACHED_TOKEN_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
# the queue limit (--max-num-queued-reqs, --max-num-queued-tokens) that refused an admission
ADMISSION_REJECTION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")


@dataclass(frozen=True)
class VllmMetric:
    """One vLLM metric family."""

    name: str
    kind: Literal["gauge", "counter", "histogram"]
    help: str
    labels: tuple[str, ...] = ENGINE_LABELS

    @property
    def exposed_name(self) -> str:
        """The family's name in a text exposition (prometheus_client appends ``_total`` to counters)."""
        return self.name + "_total" if self.kind == "counter" else self.name

    def sample(self, suffix: str) -> str:
        """A sample's name of the family: ``_sum``, ``_count``, ``_bucket`` of a histogram, ``_total`` of a counter."""
        return self.name + suffix


def _gauge(name: str, help_text: str, labels: tuple[str, ...] = ENGINE_LABELS) -> VllmMetric:
    return VllmMetric(name, "gauge", help_text, labels)


def _counter(name: str, help_text: str, labels: tuple[str, ...] = ENGINE_LABELS) -> VllmMetric:
    return VllmMetric(name, "counter", help_text, labels)


def _histogram(name: str, help_text: str) -> VllmMetric:
    return VllmMetric(name, "histogram", help_text)


NUM_REQUESTS_RUNNING = _gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
NUM_REQUESTS_WAITING = _gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
NUM_REQUESTS_WAITING_BY_REASON = _gauge(
    "vllm:num_requests_waiting_by_reason",
    "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; 'deferred' "
    "= deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all reasons equals "
    "vllm:num_requests_waiting.",
    ("reason", *ENGINE_LABELS),
)
KV_CACHE_USAGE = _gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
# labels: every CacheConfig field vLLM has (they vary by version) and the engine index, value 1
CACHE_CONFIG_INFO = _gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", ("engine",))

NUM_PREEMPTIONS = _counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
PROMPT_TOKENS = _counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
# the prompt tokens again, split by where their KV came from; counted with prompt_tokens (at the first token)
PROMPT_TOKENS_BY_SOURCE = _counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
                                   ("source", *ENGINE_LABELS))
PROMPT_TOKENS_CACHED = _counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).")
PROMPT_TOKENS_CACHED_BY_SOURCE = _counter(
    "vllm:prompt_tokens_cached_by_source",
    "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to DRAM), "
    "disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at admission; sums to "
    "vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.", ("source", *ENGINE_LABELS))
# the API server counts these, so they carry the model's name but no engine index
ADMISSION_REJECTIONS = _counter("vllm:admission_rejections",
                                "Number of admission attempts rejected by a queue limit, by reason.",
                                ("reason", "model_name"))
GENERATION_TOKENS = _counter("vllm:generation_tokens", "Number of generation tokens processed.")
PREFIX_CACHE_QUERIES = _counter("vllm:prefix_cache_queries",
                                "Prefix cache queries, in terms of number of queried tokens.")
PREFIX_CACHE_HITS = _counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
REQUEST_SUCCESS = _counter("vllm:request_success", "Count of successfully processed requests.",
                           ("finished_reason", *ENGINE_LABELS))

ITERATION_TOKENS = _histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.")
TIME_TO_FIRST_TOKEN = _histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.")
INTER_TOKEN_LATENCY = _histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.")
REQUEST_TIME_PER_OUTPUT_TOKEN = _histogram("vllm:request_time_per_output_token_seconds",
                                           "Histogram of time_per_output_token_seconds per request.")
E2E_REQUEST_LATENCY = _histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.")
REQUEST_QUEUE_TIME = _histogram("vllm:request_queue_time_seconds",
                                "Histogram of time spent in WAITING phase for request.")
REQUEST_INFERENCE_TIME = _histogram("vllm:request_inference_time_seconds",
                                    "Histogram of time spent in RUNNING phase for request.")
REQUEST_PREFILL_TIME = _histogram("vllm:request_prefill_time_seconds",
                                  "Histogram of time spent in PREFILL phase for request.")
REQUEST_DECODE_TIME = _histogram("vllm:request_decode_time_seconds",
                                 "Histogram of time spent in DECODE phase for request.")
REQUEST_PROMPT_TOKENS = _histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.")
REQUEST_GENERATION_TOKENS = _histogram("vllm:request_generation_tokens", "Number of generation tokens processed.")
REQUEST_MAX_NUM_GENERATION_TOKENS = _histogram("vllm:request_max_num_generation_tokens",
                                               "Histogram of maximum number of requested generation tokens.")
REQUEST_PARAMS_N = _histogram("vllm:request_params_n", "Histogram of the n request parameter.")
REQUEST_PARAMS_MAX_TOKENS = _histogram("vllm:request_params_max_tokens",
                                       "Histogram of the max_tokens request parameter.")
# one observation per finished request: its preemptions (0 included), and its prompt tokens not found cached
REQUEST_NUM_PREEMPTIONS = _histogram("vllm:request_num_preemptions",
                                     "Histogram of the number of times a request was preempted.")
REQUEST_PREFILL_KV_COMPUTED_TOKENS = _histogram(
    "vllm:request_prefill_kv_computed_tokens",
    "Histogram of new KV tokens computed during prefill (excluding cached tokens).")

CATALOGUE: tuple[VllmMetric, ...] = (
    NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING, NUM_REQUESTS_WAITING_BY_REASON, KV_CACHE_USAGE, CACHE_CONFIG_INFO,
    NUM_PREEMPTIONS, PROMPT_TOKENS, PROMPT_TOKENS_BY_SOURCE, PROMPT_TOKENS_CACHED, PROMPT_TOKENS_CACHED_BY_SOURCE,
    ADMISSION_REJECTIONS, GENERATION_TOKENS,
    PREFIX_CACHE_QUERIES, PREFIX_CACHE_HITS, REQUEST_SUCCESS,
    ITERATION_TOKENS, TIME_TO_FIRST_TOKEN, INTER_TOKEN_LATENCY, REQUEST_TIME_PER_OUTPUT_TOKEN, E2E_REQUEST_LATENCY,
    REQUEST_QUEUE_TIME, REQUEST_INFERENCE_TIME, REQUEST_PREFILL_TIME, REQUEST_DECODE_TIME, REQUEST_PROMPT_TOKENS,
    REQUEST_GENERATION_TOKENS, REQUEST_MAX_NUM_GENERATION_TOKENS, REQUEST_PARAMS_N, REQUEST_PARAMS_MAX_TOKENS,
    REQUEST_NUM_PREEMPTIONS, REQUEST_PREFILL_KV_COMPUTED_TOKENS,
)


# vLLM renamed three metric groups between 0.8 and 0.12 (vllm.md §1): the old family name -> today's. The prefix
# cache counters counted blocks in 0.8 and tokens later, so only their ratio (the hit rate) carries over.
RENAMES: Final = {
    "vllm:gpu_cache_usage_perc": KV_CACHE_USAGE.name,
    "vllm:gpu_prefix_cache_queries": PREFIX_CACHE_QUERIES.name,
    "vllm:gpu_prefix_cache_hits": PREFIX_CACHE_HITS.name,
    "vllm:time_per_output_token_seconds": INTER_TOKEN_LATENCY.name,
}
SAMPLE_SUFFIXES: Final = ("", "_total", "_sum", "_count", "_bucket", "_created")


def current_sample_name(name: str) -> str:
    """A sample's name as today's vLLM spells it: an old release's renamed family under its new name (the
    sample's suffix kept); every other name unchanged."""
    for old, new in RENAMES.items():
        if name.startswith(old) and name[len(old):] in SAMPLE_SUFFIXES:
            return new + name[len(old):]
    return name


def sample_aliases(name: str) -> tuple[str, ...]:
    """A sample name as today's vLLM spells it, then as older releases did (a reader looks them up in order)."""
    return (name, *(old + name[len(new):] for old, new in RENAMES.items()
                    if name.startswith(new) and name[len(new):] in SAMPLE_SUFFIXES))

