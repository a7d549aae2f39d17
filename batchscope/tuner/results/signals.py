"""The server's and the client's figures of one run, from what the run left on disk (pure, no network).

vLLM's /metrics is read as points: a time and every sample summed over its label sets (buckets left out). The
window's counters are differences between the last point at or before the window's start and the first at or
after its end; its gauges are the points inside it. The client side is the load generator's summary.json (read,
not recomputed) and the per-request values of the same requests from records.jsonl (the summary's window rule).
What a server chose at its start (`server_report`) comes from the same /metrics text, its /version and
/v1/models answers and its start-up log.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from batchscope.loadgen import MeasurementWindow, RequestRecord, Summary, counted
from batchscope.tuner.plan import Slos
from batchscope.tuner.results.record import ClientFigures, RequestSamples, ServerReport, ServerSignals, hit_rate
from batchscope.vllm import catalogue as vllm_metrics
from batchscope.vllm import scrape
from batchscope.vllm.catalogue import CACHE_CONFIG_INFO, VllmMetric, current_sample_name
from batchscope.vllm.log import parse_capacity


class MetricsPoint(BaseModel):
    """One read of vLLM's /metrics."""

    t: float = Field(description="When it was read, Unix seconds.")
    values: dict[str, float] = Field(description="Sample name -> value summed over label sets (no buckets).")


def parse_metrics(text: str, t: float) -> MetricsPoint:
    """A text exposition as one point: samples summed over their labels, so several engines add up, under
    today's names (an older vLLM's renamed families mapped; when a server exposes both, the new name wins)."""
    raw = scrape.sample_sums(text, skip_suffixes=("_bucket", "_created"))
    values = {}
    for name, value in raw.items():
        current = current_sample_name(name)
        if current == name or current not in raw:
            values[current] = value
    return MetricsPoint(t=t, values=values)


def cache_config(text: str) -> dict[str, str]:
    """cache_config_info's labels in a /metrics text (the first engine's), {} when it is not there or the text is
    not an exposition."""
    return scrape.info_labels(text, CACHE_CONFIG_INFO.name) or {}


def server_report(metrics_text: str, version: dict | None, models: dict | None, log_text: str) -> ServerReport:
    """What a server chose, from its /metrics text (cache_config_info's labels), the /version and /v1/models
    answers (None when they did not answer) and its start-up log (the KV capacity line)."""
    labels = cache_config(metrics_text)
    blocks, block_size = _number(int, labels.get("num_gpu_blocks")), _number(int, labels.get("block_size"))
    tokens, _ = parse_capacity(log_text)
    if tokens is None:
        tokens = _number(int, labels.get("kv_cache_size_tokens"))
    if tokens is None and blocks is not None and block_size is not None:
        tokens = blocks * block_size
    card = ((models or {}).get("data") or [{}])[0]
    utilization = _number(float, labels.get("gpu_memory_utilization"))
    return ServerReport(vllm_version=_text((version or {}).get("version")), block_size=block_size,
                        num_gpu_blocks=blocks, gpu_memory_utilization=utilization,
                        max_model_len=_number(int, card.get("max_model_len")) if isinstance(card, dict) else None,
                        kv_capacity_tokens=tokens)


def _number(kind: type[int] | type[float], value: Any) -> Any:
    """A label's or a JSON field's number; None for a missing one, vLLM's 'None' label or anything else."""
    try:
        return None if value is None else kind(value)
    except (TypeError, ValueError):
        return None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def server_signals(points: list[MetricsPoint], window_start: float, window_end: float,
                   kv_capacity_tokens: int | None) -> ServerSignals:
    """ServerSignals of the window from points read before, during and after it (sorted by time)."""
    points = sorted(points, key=lambda p: p.t)
    first = next((p for p in reversed(points) if p.t <= window_start), points[0])
    last = next((p for p in points if p.t >= window_end), points[-1])
    inside = [p for p in points if window_start <= p.t <= window_end] or [last]

    def change(sample: str) -> float:
        return max(last.values.get(sample, 0.0) - first.values.get(sample, 0.0), 0.0)

    def delta(counter: VllmMetric) -> float:
        return change(counter.exposed_name)

    def counted(counter: VllmMetric) -> float | None:
        """The delta of a counter the server may not expose (older vLLM): None rather than a made-up 0."""
        return delta(counter) if counter.exposed_name in last.values else None

    def mean(histogram: VllmMetric) -> float | None:
        count = change(histogram.sample("_count"))
        return change(histogram.sample("_sum")) / count if count else None

    def gauge(metric: VllmMetric) -> list[float]:
        return [p.values.get(metric.name, 0.0) for p in inside]

    kv = gauge(vllm_metrics.KV_CACHE_USAGE)
    queries, hits = counted(vllm_metrics.PREFIX_CACHE_QUERIES), counted(vllm_metrics.PREFIX_CACHE_HITS)
    return ServerSignals(
        preemptions=delta(vllm_metrics.NUM_PREEMPTIONS),
        prompt_tokens=delta(vllm_metrics.PROMPT_TOKENS),
        generation_tokens=delta(vllm_metrics.GENERATION_TOKENS),
        requests_finished=delta(vllm_metrics.REQUEST_SUCCESS),
        queue_time_mean_s=mean(vllm_metrics.REQUEST_QUEUE_TIME),
        prefill_time_mean_s=mean(vllm_metrics.REQUEST_PREFILL_TIME),
        decode_time_mean_s=mean(vllm_metrics.REQUEST_DECODE_TIME),
        tokens_per_step_mean=mean(vllm_metrics.ITERATION_TOKENS),
        max_waiting=max(gauge(vllm_metrics.NUM_REQUESTS_WAITING)),
        max_running=max(gauge(vllm_metrics.NUM_REQUESTS_RUNNING)),
        kv_usage_peak=max(kv),
        kv_usage_mean=sum(kv) / len(kv),
        kv_capacity_tokens=kv_capacity_tokens,
        prefix_cache_queries=queries, prefix_cache_hits=hits, prefix_cache_hit_rate=hit_rate(queries, hits),
        admission_rejections=counted(vllm_metrics.ADMISSION_REJECTIONS),
    )


def read_summary(load_dir: Path) -> Summary | None:
    path = load_dir / "summary.json"
    return Summary.model_validate_json(path.read_text()) if path.exists() else None


def client_figures(summary: Summary, good: int | None = None) -> ClientFigures:
    """The summary's own figures (its window rule, its percentiles, its admission rejections, its prompt tokens
    first answered in the window: total minus output tokens), and goodput from `good`, the window's completed
    requests that met the SLOs (good_count)."""
    window = summary.effective_duration_s
    return ClientFigures(
        ttft=summary.ttft, tpot=summary.tpot, itl=summary.itl, e2e=summary.e2e,
        completion_throughput_rps=summary.completion_throughput_rps,
        output_tokens_per_s=summary.output_tokens_per_s, completed=summary.completed,
        errors=sum(summary.failed.values()), window_s=window, good_completed=good,
        goodput_rps=None if good is None else good / window if window else 0.0,
        rejected={reason: n for reason, n in summary.admission_rejections.items() if n},
        rejected_share=summary.rejected_share,
        prefill_tokens_per_s=summary.total_tokens_per_s - summary.output_tokens_per_s,
    )


def measured_client(records_path: Path, summary: Summary, slos: Slos) -> tuple[ClientFigures, RequestSamples]:
    """A real-time run's client figures and per-request values: the summary's figures, and from its records
    (read once) goodput and the values of the requests the summary's figures count."""
    window = MeasurementWindow(summary.window_start_s, summary.window_start_s + summary.effective_duration_s)
    counted_records = [record for record in read_records(records_path) if counted(record, window)]
    return client_figures(summary, good_count(counted_records, slos)), samples_of(counted_records)


def read_records(records_path: Path) -> list[RequestRecord]:
    """Every record of records.jsonl (none when the file is missing)."""
    if not records_path.exists():
        return []
    records = []
    for line in records_path.read_text().splitlines():
        if not line.strip():
            continue
        fields = json.loads(line)
        records.append(RequestRecord(**{k: v for k, v in fields.items() if k in RequestRecord.__dataclass_fields__}))
    return records


def good_count(records: list[RequestRecord], slos: Slos) -> int:
    """How many of the counted ``records`` met both SLOs, each by its own TTFT and TPOT (Slos.count_met)."""
    return slos.count_met([(r.ttft_s, r.tpot_s) for r in records if r.ttft_s is not None])


def samples_of(records: list[RequestRecord]) -> RequestSamples:
    """Per-request values of the counted ``records``."""
    samples = RequestSamples()
    for record in records:
        if record.ttft_s is None or record.e2e_s is None:  # never for a window record; tells the type checker
            continue
        samples.ttft_s.append(record.ttft_s)
        samples.e2e_s.append(record.e2e_s)
        if record.tpot_s is not None:  # None for a one-token request; 0.0 (every token in one read) counts
            samples.tpot_s.append(record.tpot_s)
        if record.itl_s:
            samples.itl_s.append(sum(record.itl_s) / len(record.itl_s))
    return samples
