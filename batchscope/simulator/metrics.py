"""vLLM's /metrics for the simulator: a collector that reads the engine at scrape time.

Names, types, HELP texts, labels and label values come from batchscope.vllm.catalogue, bucket boundaries from
batchscope.vllm.buckets (both vLLM V1's ``PrometheusStatLogger``, checked against a real 0.32 /metrics); the
values come from ``EngineStats``, which follows vLLM's definitions. Counters and histograms carry ``_created``
series, as prometheus_client gives vLLM's. The server answers with ``generate_latest`` (the classic text, which
keeps the colons) labelled ``catalogue.EXPOSITION_CONTENT_TYPE`` whatever the Accept header, as 0.32 does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from batchscope.simulator.engine import EngineCore
from batchscope.stats.histogram import Histogram
from batchscope.vllm import catalogue as catalogue
from batchscope.vllm.catalogue import VllmMetric

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
    "request_num_preemptions": catalogue.REQUEST_NUM_PREEMPTIONS,
    "request_prefill_kv_computed_tokens": catalogue.REQUEST_PREFILL_KV_COMPUTED_TOKENS,
}


class VllmMetricsCollector(Collector):
    """Yields vLLM's metric families for one engine; ``cache_config`` becomes vllm:cache_config_info labels.

    ``created``: the Unix time the series were created (vLLM creates them all at start-up), default now.
    """

    def __init__(self, engine: EngineCore, model_name: str, cache_config: dict[str, str], engine_index: str = "0",
                 created: float | None = None):
        self._engine = engine
        self._labels = [model_name, engine_index]
        self._cache_config = cache_config
        self._created = time.time() if created is None else created

    def collect(self) -> Iterator[Metric]:
        engine, stats = self._engine, self._engine.stats
        yield self._gauge(catalogue.NUM_REQUESTS_RUNNING, engine.num_running)
        yield self._gauge(catalogue.NUM_REQUESTS_WAITING, engine.num_waiting)
        # every waiting request waits for capacity: nothing in the simulator defers one (no LoRA, no KV transfer)
        yield self._gauge(catalogue.NUM_REQUESTS_WAITING_BY_REASON, by={"capacity": engine.num_waiting, "deferred": 0})
        yield self._gauge(catalogue.KV_CACHE_USAGE, engine.kv_cache_usage)
        yield self._counter(catalogue.NUM_PREEMPTIONS, stats.num_preemptions)
        yield self._counter(catalogue.PROMPT_TOKENS, stats.prompt_tokens)
        yield self._counter(catalogue.PROMPT_TOKENS_BY_SOURCE, by=stats.prompt_tokens_by_source())
        yield self._counter(catalogue.PROMPT_TOKENS_CACHED, stats.prompt_tokens_cached)
        # every hit is the local prefix cache's (no offloading tier, no KV connector), counted at each lookup
        yield self._counter(catalogue.PROMPT_TOKENS_CACHED_BY_SOURCE,
                            by={source: stats.prefix_cache_hits if source == "device" else 0
                                for source in catalogue.CACHED_TOKEN_SOURCES})
        # the API server's counter: both reasons from start-up, 0 until a refusal, with or without a limit (0.32)
        yield self._counter(catalogue.ADMISSION_REJECTIONS, labels=[self._labels[0]], by=engine.admission.rejections)
        yield self._counter(catalogue.GENERATION_TOKENS, stats.generation_tokens)
        yield self._counter(catalogue.PREFIX_CACHE_QUERIES, stats.prefix_cache_queries)
        yield self._counter(catalogue.PREFIX_CACHE_HITS, stats.prefix_cache_hits)
        yield self._counter(catalogue.REQUEST_SUCCESS, by=stats.request_success)
        for attribute, metric in _HISTOGRAMS.items():
            yield self._histogram(metric, getattr(stats, attribute))
        info = GaugeMetricFamily(catalogue.CACHE_CONFIG_INFO.name, catalogue.CACHE_CONFIG_INFO.help,
                                 labels=[*self._cache_config, *catalogue.CACHE_CONFIG_INFO.labels])
        info.add_metric([*self._cache_config.values(), self._labels[1]], 1.0)
        yield info

    def _series(self, value: float, by: Mapping[str, float] | None, labels: list[str] | None = None
                ) -> list[tuple[list[str], float]]:
        """The family's (label values, value) pairs: one series, or one per value of its first label (``by``);
        ``labels``: the values after that label, when not (model_name, engine)."""
        rest = self._labels if labels is None else labels
        if by is None:
            return [(rest, value)]
        return [([key, *rest], count) for key, count in by.items()]

    def _gauge(self, metric: VllmMetric, value: float = 0.0, by: Mapping[str, float] | None = None
               ) -> GaugeMetricFamily:
        family = GaugeMetricFamily(metric.name, metric.help, labels=list(metric.labels))
        for labels, count in self._series(value, by):
            family.add_metric(labels, count)
        return family

    def _counter(self, metric: VllmMetric, value: float = 0.0, by: Mapping[str, float] | None = None,
                 labels: list[str] | None = None) -> CounterMetricFamily:
        family = CounterMetricFamily(metric.name, metric.help, labels=list(metric.labels))
        for values, count in self._series(value, by, labels):
            family.add_metric(values, count, created=self._created)
        return family

    def _histogram(self, metric: VllmMetric, histogram: Histogram) -> HistogramMetricFamily:
        family = HistogramMetricFamily(metric.name, metric.help, labels=LABELS)
        family.add_metric(self._labels, histogram.cumulative(), sum_value=histogram.sum)
        # HistogramMetricFamily takes no created time; its _created sample is what prometheus_client's own adds
        family.samples.append(Sample(metric.name + "_created", dict(zip(LABELS, self._labels, strict=True)),
                                     self._created))
        return family
