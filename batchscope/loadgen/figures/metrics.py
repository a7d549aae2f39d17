"""Client-side metrics: accumulators fed with every finished request (on the master, every worker's) and their
collector: ``batchscope_client_<what>_<unit>``, labelled ``run_id`` and ``scenario`` (and ``metric`` on the SLO
targets).

Histogram boundaries are vLLM's for the same quantity plus finer low-latency ones, so client and server
quantiles compare. The latency histograms and the goodput counter hold the window's requests completed ok
(window.py), the counters and the lag histograms the whole run; the saturation gauges are live (saturation.py).
Populations in full: docs/loadgen.md, "Client metrics".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from batchscope.loadgen.figures.saturation import GeneratorLoad
from batchscope.loadgen.spec import SloTargets, WorkloadSpec
from batchscope.loadgen.stream import OUTCOMES, RequestRecord
from batchscope.stats.histogram import Histogram, merged_bounds
from batchscope.vllm.buckets import ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS
from batchscope.vllm.catalogue import ADMISSION_REJECTION_REASONS, ADMISSION_REJECTIONS

DEFAULT_METRICS_PORT = 9646  # where the master (or local process) serves the merged client metrics
FINE_LATENCY = (0.0025, 0.0075, 0.015, 0.03, 0.05, 0.15, 0.2, 0.3, 0.4)
FINE_TOKEN_GAP = (0.001, 0.0025, 0.005, 0.0075, 0.015, 0.02, 0.03, 0.04, 0.06, 0.08)
FINE_E2E = (0.05, 0.1, 0.2, 0.4, 0.6, 0.7, 0.9, 1.25, 3.0, 4.0, 7.5)
DISPATCH_LAG = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

HISTOGRAMS = {
    # attribute: (metric name, HELP, bounds)
    "ttft": ("batchscope_client_time_to_first_token_seconds",
             "Client TTFT of the requests completed in the measurement window: first streamed token chunk minus "
             "the scheduled send time (vllm bench serve's TTFT; open-loop modes count from the scheduled arrival), "
             "seconds.",
             merged_bounds(TTFT_BUCKETS, FINE_LATENCY)),
    "tpot": ("batchscope_client_time_per_output_token_seconds",
             "Client TPOT per request completed in the measurement window: (E2E - TTFT) / (output tokens - 1), "
             "as vllm bench serve, seconds.",
             merged_bounds(ITL_BUCKETS, FINE_TOKEN_GAP)),
    "itl": ("batchscope_client_inter_token_latency_seconds",
            "Client ITL: every gap between consecutive token chunks of the requests completed in the "
            "measurement window, as vllm bench serve, seconds.",
            merged_bounds(ITL_BUCKETS, FINE_TOKEN_GAP)),
    "e2e": ("batchscope_client_e2e_request_latency_seconds",
            "Client E2E of the requests completed in the measurement window: last token chunk minus the "
            "scheduled send time, seconds.",
            merged_bounds(REQUEST_LATENCY_BUCKETS, FINE_E2E)),
    "dispatch_lag": ("batchscope_client_dispatch_lag_seconds",
                     "Actual minus scheduled send time of each request: the load generator's own delay, seconds.",
                     DISPATCH_LAG),
    "read_lag": ("batchscope_client_read_lag_seconds",
                 "Time each request's token chunks waited in the socket before the load generator read them (a "
                 "read minus the kernel's receive time, the request's mean over its reads): its own delay, seconds.",
                 DISPATCH_LAG),
}


class ClientStats:
    """Counts over the requests the controller has received (on a master: from every worker); ``slo`` judges
    which are good (goodput)."""

    def __init__(self, slo: SloTargets | None = None) -> None:
        self.slo = slo or SloTargets()
        self.good = 0  # completed ok in the window within both SLO targets
        self.histograms = {name: Histogram(bounds) for name, (_, _, bounds) in HISTOGRAMS.items()}
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.started = 0
        self.refused = 0
        self.not_sent: dict[str, int] = {}  # the refused arrivals by reason (run/sender.py's NOT_SENT)
        self.away_s = 0.0  # seconds the server was away so far (figures/away.py), as of the latest scrape's refresh
        self.away_now = False
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.admission_rejections = dict.fromkeys(ADMISSION_REJECTION_REASONS, 0)  # rejected_busy by reason
        self.prefill_backlog_tokens = 0  # live, as the senders last reported it

    def observe(self, record: RequestRecord, in_window: bool = True) -> None:
        """Account one finished request; its latencies only if it is ok and ``in_window`` (summary.in_window)."""
        self.outcomes[record.outcome] += 1
        if record.outcome == "rejected_busy" and record.reject_reason is not None:
            reason = record.reject_reason
            self.admission_rejections[reason] = self.admission_rejections.get(reason, 0) + 1
        self.prompt_tokens += record.prompt_tokens or 0
        self.output_tokens += record.output_tokens or 0
        if record.dispatch_lag_s is not None:
            self.histograms["dispatch_lag"].observe(record.dispatch_lag_s)
        if record.read_lag_s is not None:
            self.histograms["read_lag"].observe(record.read_lag_s)
        if record.outcome != "ok" or not in_window:
            return
        for name in ("ttft", "tpot", "e2e"):
            value = getattr(record, f"{name}_s")
            if value is not None:
                self.histograms[name].observe(value)
        if record.ttft_s is not None and self.slo.met_by(record.ttft_s, record.tpot_s):
            self.good += 1
        self.histograms["itl"].observe_many(np.asarray(record.itl_s, dtype=float))

    @property
    def finished(self) -> int:
        return sum(self.outcomes.values())


class ClientMetricsCollector(Collector):
    """Exposes a ClientStats at scrape time; ``refresh``, ``in_flight``, ``spec_labels`` and ``generator`` (the
    live saturation verdict, saturation.py) are callables."""

    def __init__(self, stats: ClientStats, in_flight, run_id: str, scenario: str, spec_labels, refresh,
                 generator: Callable[[], GeneratorLoad] | None = None) -> None:
        self._refresh = refresh
        self._generator = generator
        self._stats = stats
        self._in_flight = in_flight
        self._labels = [run_id, scenario]
        self._spec_labels = spec_labels

    def collect(self) -> Iterator[Metric]:
        self._refresh()
        stats, labels, names = self._stats, self._labels, ["run_id", "scenario"]
        for attribute, (name, help_text, _) in HISTOGRAMS.items():
            family = HistogramMetricFamily(name, help_text, labels=names)
            histogram = stats.histograms[attribute]
            family.add_metric(labels, histogram.cumulative(), sum_value=histogram.sum)
            yield family
        outcomes = CounterMetricFamily("batchscope_client_requests",
                                       f"Finished requests by outcome ({', '.join(OUTCOMES)}); rejected_busy: "
                                       "refused by vLLM's admission check (HTTP 503), no error of the server's.",
                                       labels=[*names, "outcome"])
        for outcome, count in stats.outcomes.items():
            outcomes.add_metric([*labels, outcome], count)
        yield outcomes
        yield from _admission(stats, names, labels)
        yield _counter("batchscope_client_requests_started", "Requests started (sent or about to be sent).",
                       names, labels, stats.started)
        yield from _not_sent(stats, names, labels)
        yield _counter("batchscope_client_prompt_tokens", "Prompt tokens of finished requests, from usage.",
                       names, labels, stats.prompt_tokens)
        yield _counter("batchscope_client_output_tokens", "Output tokens of finished requests, from usage.",
                       names, labels, stats.output_tokens)
        yield _counter("batchscope_client_goodput_requests", "Requests completed ok in the measurement window whose "
                       "own TTFT and own TPOT both met the SLO targets (batchscope_client_slo_target_seconds): vllm "
                       "bench serve's goodput rule, TTFT <= target and TPOT <= target, a one-token request passing "
                       "TPOT.", names, labels, stats.good)
        yield _slo_targets(stats.slo, names, labels)
        in_flight = GaugeMetricFamily("batchscope_client_requests_in_flight", "Requests in flight now.",
                                      labels=names)
        in_flight.add_metric(labels, self._in_flight())
        yield in_flight
        spec = self._spec_labels()
        info = GaugeMetricFamily("batchscope_client_workload_info", "The workload spec in force (value 1).",
                                 labels=[*names, *spec])
        info.add_metric([*labels, *spec.values()], 1)
        yield info
        if self._generator is not None:
            yield from _saturation(self._generator(), names, labels)


def _admission(stats: ClientStats, names: list[str], labels: list[str]) -> Iterator[Metric]:
    rejected = CounterMetricFamily("batchscope_client_admission_rejections", "Requests refused by vLLM's admission "
                                   "check (an HTTP 503 with its body: outcome rejected_busy), by reason, as "
                                   f"{ADMISSION_REJECTIONS.name}_total counts them.", labels=[*names, "reason"])
    for reason, count in stats.admission_rejections.items():
        rejected.add_metric([*labels, reason], count)
    yield rejected
    backlog = GaugeMetricFamily("batchscope_client_prefill_backlog_tokens", "Prompt tokens of the requests sent "
                                "that have no first token yet: the client's view of what vLLM's "
                                "--max-num-queued-tokens caps (every prompt still in prefill, whole).", labels=names)
    backlog.add_metric(labels, stats.prefill_backlog_tokens)
    yield backlog


def _not_sent(stats: ClientStats, names: list[str], labels: list[str]) -> Iterator[Metric]:
    refused = CounterMetricFamily("batchscope_client_arrivals_refused", "Open-loop arrivals not sent, by reason: "
                                  "in_flight_cap (at the spec's max_in_flight), backing_off (after non-retryable "
                                  "HTTP errors, 429s or 503s), server_away (connections refused or reset).",
                                  labels=[*names, "reason"])
    for reason, count in stats.not_sent.items():
        refused.add_metric([*labels, reason], count)
    yield refused
    away = GaugeMetricFamily("batchscope_client_server_away", "1 while the server is away: the latest connection "
                             "error has no answered request after it.", labels=names)
    away.add_metric(labels, float(stats.away_now))
    yield away
    seconds = GaugeMetricFamily("batchscope_client_server_away_seconds", "Seconds the server was away so far: the "
                                "gaps from a refused or reset connection to its next answer, 1 s or longer.",
                                labels=names)
    seconds.add_metric(labels, stats.away_s)
    yield seconds


def _saturation(generator: GeneratorLoad, names: list[str], labels: list[str]) -> Iterator[Metric]:
    saturated = GaugeMetricFamily("batchscope_client_saturated", "1 when the load generator itself is the "
                                  "bottleneck (a sender's CPU >= 90% of its core, or the median dispatch or "
                                  "read lag over the last 10 s above 5 ms): its latencies then include its "
                                  "own delay; run more workers.", labels=names)
    saturated.add_metric(labels, float(generator.saturated))
    yield saturated
    cpu = GaugeMetricFamily("batchscope_client_cpu_ratio", "CPU of the busiest sender process over its latest "
                            "report interval, as a ratio of one core.", labels=names)
    cpu.add_metric(labels, generator.cpu_share if generator.cpu_share is not None else float("nan"))
    yield cpu


def _slo_targets(slo: SloTargets, names: list[str], labels: list[str]) -> GaugeMetricFamily:
    family = GaugeMetricFamily("batchscope_client_slo_target_seconds", "The latency target a good request meets, "
                               "per metric (ttft, tpot), from the workload spec's slo; +Inf: no target.",
                               labels=[*names, "metric"])
    for metric, target in (("ttft", slo.ttft_s), ("tpot", slo.tpot_s)):
        family.add_metric([*labels, metric], math.inf if target is None else target)
    return family


def _counter(name: str, help_text: str, names: list[str], labels: list[str], value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, help_text, labels=names)
    family.add_metric(labels, value)
    return family


def workload_labels(spec: WorkloadSpec) -> dict[str, str]:
    """The labels of batchscope_client_workload_info: the spec's shape (never its key)."""
    load = spec.load
    level = {"concurrency": "concurrency", "poisson": "rate", "offline": "requests"}[load.mode]
    return {"mode": load.mode, "endpoint": spec.endpoint, "input_tokens": str(spec.input_tokens),
            "output_tokens": str(spec.output_tokens), "stream": str(spec.stream).lower(),
            "load_level": str(getattr(load, level))}
