"""vLLM's /metrics for the simulator: a collector that reads the engine at scrape time.

Names, types, HELP texts and labels come from batchscope.vllm_catalogue, bucket boundaries from
batchscope.vllm_buckets (both vLLM V1's ``PrometheusStatLogger``); the values come from ``EngineStats``, which
follows vLLM's definitions. Serve it with ``generate_latest`` as text format 0.0.4 whatever the Accept header,
so Prometheus 2.x keeps the colons.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from batchscope import vllm_catalogue as catalogue
from batchscope.vllm_catalogue import VllmMetric
from simulator.engine import EngineCore
from simulator.finish import FINISH_REASONS

LABELS = list(catalogue.ENGINE_LABELS)

_HISTOGRAMS = {  # EngineStats attribute: vLLM family
    "iteration_tokens": catalogue.ITERATION_TOKENS,
    "time_to_first_token": catalogue.TIME_TO_FIRST_TOKEN,
    "inter_token_latency": catalogue.INTER_TOKEN_LATENCY,
    "request_time_per_output_token": catalogue.REQUEST_TIME_PER_OUTPUT_TOKEN,
    "e2e_request_latency": catalogue.E2E_REQUEST_LATENCY,
    "request_queue_time": catalogue.REQUEST_QUEUE_TIME,
    "request_inference_time": catalogue.REQUEST_INFERENCE_TIME,
    "request_prefill_time": catalogue.REQUEST_PREFILL_TIME,
    "request_decode_time": catalogue.REQUEST_DECODE_TIME,
    "request_prompt_tokens": catalogue.REQUEST_PROMPT_TOKENS,
    "request_generation_tokens": catalogue.REQUEST_GENERATION_TOKENS,
    "request_params_max_tokens": catalogue.REQUEST_PARAMS_MAX_TOKENS,
}


class VllmMetricsCollector(Collector):
    """Yields vLLM's metric families for one engine; ``cache_config`` becomes vllm:cache_config_info labels."""

    def __init__(self, engine: EngineCore, model_name: str, cache_config: dict[str, str], engine_index: str = "0"):
        self._engine = engine
        self._labels = [model_name, engine_index]
        self._cache_config = cache_config

    def collect(self) -> Iterator[Metric]:
        engine, stats, labels = self._engine, self._engine.stats, self._labels
        yield self._gauge(catalogue.NUM_REQUESTS_RUNNING, engine.num_running)
        yield self._gauge(catalogue.NUM_REQUESTS_WAITING, engine.num_waiting)
        yield self._gauge(catalogue.KV_CACHE_USAGE, engine.kv_cache_usage)
        yield self._counter(catalogue.NUM_PREEMPTIONS, stats.num_preemptions)
        yield self._counter(catalogue.PROMPT_TOKENS, stats.prompt_tokens)
        yield self._counter(catalogue.GENERATION_TOKENS, stats.generation_tokens)
        yield self._counter(catalogue.PREFIX_CACHE_QUERIES, stats.prefix_cache_queries)
        yield self._counter(catalogue.PREFIX_CACHE_HITS, stats.prefix_cache_hits)
        success = CounterMetricFamily(catalogue.REQUEST_SUCCESS.name, catalogue.REQUEST_SUCCESS.help,
                                      labels=list(catalogue.REQUEST_SUCCESS.labels))
        for reason in FINISH_REASONS:
            success.add_metric([reason, *labels], stats.request_success[reason])
        yield success
        for attribute, metric in _HISTOGRAMS.items():
            histogram = getattr(stats, attribute)
            family = HistogramMetricFamily(metric.name, metric.help, labels=LABELS)
            family.add_metric(labels, histogram.cumulative(), sum_value=histogram.sum)
            yield family
        info = GaugeMetricFamily(catalogue.CACHE_CONFIG_INFO.name, catalogue.CACHE_CONFIG_INFO.help,
                                 labels=[*self._cache_config, *catalogue.CACHE_CONFIG_INFO.labels])
        info.add_metric([*self._cache_config.values(), labels[1]], 1.0)
        yield info

    def _gauge(self, metric: VllmMetric, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(metric.name, metric.help, labels=LABELS)
        family.add_metric(self._labels, value)
        return family

    def _counter(self, metric: VllmMetric, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(metric.name, metric.help, labels=LABELS)
        family.add_metric(self._labels, value)
        return family
