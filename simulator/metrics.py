"""vLLM's /metrics for the simulator: a collector that reads the engine at scrape time.

Names, types, HELP texts, labels (``model_name``, ``engine``) and bucket boundaries are those of vLLM V1's
``PrometheusStatLogger``; the values come from ``EngineStats``, which follows vLLM's definitions. Serve it
with ``generate_latest`` as text format 0.0.4 whatever the Accept header, so Prometheus 2.x keeps the colons.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from simulator.engine import EngineCore
from simulator.finish import FINISH_REASONS

LABELS = ["model_name", "engine"]

_HISTOGRAMS = {
    # EngineStats attribute: (vLLM family name, vLLM HELP text)
    "iteration_tokens": ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step."),
    "time_to_first_token": (
        "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."),
    "inter_token_latency": ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."),
    "request_time_per_output_token": (
        "vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request."),
    "e2e_request_latency": ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
    "request_queue_time": (
        "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."),
    "request_inference_time": (
        "vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request."),
    "request_prefill_time": (
        "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."),
    "request_decode_time": (
        "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request."),
    "request_prompt_tokens": ("vllm:request_prompt_tokens", "Number of prefill tokens processed."),
    "request_generation_tokens": ("vllm:request_generation_tokens", "Number of generation tokens processed."),
    "request_params_max_tokens": (
        "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter."),
}


class VllmMetricsCollector(Collector):
    """Yields vLLM's metric families for one engine; ``cache_config`` becomes vllm:cache_config_info labels."""

    def __init__(self, engine: EngineCore, model_name: str, cache_config: dict[str, str], engine_index: str = "0"):
        self._engine = engine
        self._labels = [model_name, engine_index]
        self._cache_config = cache_config

    def collect(self) -> Iterator[Metric]:
        engine, stats, labels = self._engine, self._engine.stats, self._labels
        yield self._gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                          engine.num_running)
        yield self._gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                          engine.num_waiting)
        yield self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                          engine.kv_cache_usage)
        yield self._counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                            stats.num_preemptions)
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens)
        yield self._counter("vllm:generation_tokens", "Number of generation tokens processed.",
                            stats.generation_tokens)
        success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                      labels=["finished_reason", *LABELS])
        for reason in FINISH_REASONS:
            success.add_metric([reason, *labels], stats.request_success[reason])
        yield success
        for attribute, (name, help_text) in _HISTOGRAMS.items():
            histogram = getattr(stats, attribute)
            family = HistogramMetricFamily(name, help_text, labels=LABELS)
            family.add_metric(labels, histogram.cumulative(), sum_value=histogram.sum)
            yield family
        info = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                 labels=[*self._cache_config, "engine"])
        info.add_metric([*self._cache_config.values(), labels[1]], 1.0)
        yield info

    def _gauge(self, name: str, help_text: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, help_text, labels=LABELS)
        family.add_metric(self._labels, value)
        return family

    def _counter(self, name: str, help_text: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, help_text, labels=LABELS)
        family.add_metric(self._labels, value)
        return family
