"""The end-of-run summary: exact statistics from the per-request records, warm-up excluded.

Definitions as `vllm bench serve`: completion throughput = completed requests / effective measurement
duration; TTFT, TPOT, E2E per completed request and ITL pooled over every gap of every completed request;
percentiles exact (numpy), not from buckets. Output tokens/s counts the tokens that *arrived* in the window (by
their chunk times, whatever became of their request), so a fixed-duration run is not undercounted by the
requests still streaming at its end; total tokens/s adds the prompts of the requests whose first token came in
the window.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np
from pydantic import BaseModel, Field
from rich.console import Console
from rich.table import Table

import batchscope
from loadgen.request import OUTCOMES, RequestRecord
from loadgen.spec import SCHEMA_VERSION, OfflineLoad, WorkloadSpec


class Distribution(BaseModel):
    """Mean and percentiles of one latency, seconds."""

    count: int = Field(description="Number of observations.")
    mean: float | None = Field(description="Arithmetic mean, seconds.")
    p50: float | None = Field(description="Median, seconds.")
    p90: float | None = Field(description="90th percentile, seconds.")
    p99: float | None = Field(description="99th percentile, seconds.")

    @classmethod
    def of(cls, values: Sequence[float] | np.ndarray) -> Distribution:
        if len(values) == 0:
            return cls(count=0, mean=None, p50=None, p90=None, p99=None)
        array = np.asarray(values, dtype=float)
        p50, p90, p99 = np.percentile(array, [50, 90, 99])
        return cls(count=array.size, mean=float(array.mean()), p50=float(p50), p90=float(p90), p99=float(p99))


class Summary(BaseModel):
    """One run's result, with the spec that produced it."""

    schema_version: int = Field(SCHEMA_VERSION, description="Bumped on any breaking change of this model.")
    tool_version: str = Field(batchscope.__version__, description="batchscope version that wrote it.")
    python: str = Field(platform.python_version(), description="Python version of the load generator.")
    run_id: str = Field(description="Run identifier (label run_id in metrics, file names).")
    host: str = Field(description="Base URL of the server under test.")
    started_at: str = Field(description="Run start, ISO 8601 UTC.")
    spec: WorkloadSpec = Field(description="The workload spec in force.")
    started: int = Field(description="Requests started (warm-up included).")
    outcomes: dict[str, int] = Field(description="Finished requests by outcome (warm-up included).")
    balanced: bool = Field(description="started == sum of outcomes: every request ended in exactly one outcome.")
    refused_arrivals: int = Field(description="Open-loop arrivals refused at the in-flight cap.")
    completed: int = Field(description="Requests with outcome ok in the measurement window.")
    failed: dict[str, int] = Field(description="Non-ok, non-aborted outcomes in the measurement window.")
    effective_duration_s: float = Field(description="Measurement window length, seconds.")
    completion_throughput_rps: float = Field(description="completed / effective_duration_s, requests/s.")
    output_tokens_per_s: float = Field(description="Output tokens that arrived in the window / duration.")
    total_tokens_per_s: float = Field(description="Those plus the prompts first answered in the window / duration.")
    ttft: Distribution = Field(description="Time to first token (from the scheduled send).")
    tpot: Distribution = Field(description="Time per output token, (E2E - TTFT) / (n - 1).")
    itl: Distribution = Field(description="Inter-token latency, every gap pooled.")
    e2e: Distribution = Field(description="End-to-end latency (from the scheduled send).")
    peak_concurrency: int = Field(description="Most requests in flight at once (sweep over send..end).")
    dispatch_lag_p99_s: float | None = Field(description="p99 of actual - scheduled send, seconds.")


def summarize(spec: WorkloadSpec, records: list[RequestRecord], *, run_id: str, host: str, start_s: float,
              stop_s: float, started: int, refused: int) -> Summary:
    """Build the summary; the window starts after warm-up and ends at the stop (offline: the last end)."""
    window_start = start_s + spec.warmup_s
    measured = [r for r in records if r.scheduled_s >= window_start]
    ends = [r.end_s for r in measured if r.end_s is not None]
    window_end = max(ends, default=window_start) if isinstance(spec.load, OfflineLoad) else stop_s
    duration = max(window_end - window_start, 1e-9)
    ok = [r for r in measured if r.outcome == "ok" and r.end_s is not None and r.end_s <= window_end]
    outcomes = dict.fromkeys(OUTCOMES, 0)
    for record in records:
        outcomes[record.outcome] += 1
    failed = dict.fromkeys((o for o in OUTCOMES if o not in ("ok", "aborted")), 0)
    for record in measured:
        if record.outcome in failed:
            failed[record.outcome] += 1
    output = tokens_in_window(records, window_start, window_end)
    prompt = sum(r.prompt_tokens or 0 for r in records
                 if r.first_token_s is not None and window_start <= r.first_token_s <= window_end)
    lags = [r.dispatch_lag_s for r in records if r.dispatch_lag_s is not None]
    return Summary(
        run_id=run_id, host=host, started_at=datetime.fromtimestamp(start_s, UTC).isoformat(), spec=spec,
        started=started, outcomes=outcomes, balanced=started == sum(outcomes.values()), refused_arrivals=refused,
        completed=len(ok), failed=failed, effective_duration_s=duration,
        completion_throughput_rps=len(ok) / duration, output_tokens_per_s=output / duration,
        total_tokens_per_s=(output + prompt) / duration,
        ttft=Distribution.of([r.ttft_s for r in ok]), tpot=Distribution.of([r.tpot_s for r in ok if r.tpot_s]),
        itl=Distribution.of(np.concatenate([np.asarray(r.itl_s, dtype=float) for r in ok]) if ok else []),
        e2e=Distribution.of([r.e2e_s for r in ok]),
        peak_concurrency=peak_concurrency(records),
        dispatch_lag_p99_s=float(np.percentile(lags, 99)) if lags else None,
    )


def tokens_in_window(records: list[RequestRecord], start: float, end: float) -> float:
    """Output tokens whose chunk arrived within [start, end]: the first token, then one per ITL gap."""
    total = 0.0
    for record in records:
        if record.first_token_s is None:
            continue
        events = record.first_token_s + np.concatenate(([0.0], np.cumsum(np.asarray(record.itl_s, dtype=float))))
        inside = int(np.count_nonzero((events >= start) & (events <= end)))
        # a server may pack several tokens in one chunk: weight by what usage says, when it says
        per_event = record.output_tokens / events.size if record.outcome == "ok" and record.output_tokens else 1.0
        total += inside * per_event
    return total


def peak_concurrency(records: list[RequestRecord]) -> int:
    """Largest number of requests between send and end at one moment (sweep line)."""
    events = [(r.sent_s, 1) for r in records if r.sent_s is not None and r.end_s is not None]
    events += [(r.end_s, -1) for r in records if r.sent_s is not None and r.end_s is not None]
    level = peak = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        level += step
        peak = max(peak, level)
    return peak


def print_summary(summary: Summary, console: Console | None = None) -> None:
    """The human table: counts, throughput, and latencies in ms (labelled)."""
    console = console or Console()
    head = Table(title=f"batchscope load {summary.run_id}: {summary.spec.scenario}", show_header=False)
    head.add_row("completed (ok, in window)", str(summary.completed))
    head.add_row("failed", ", ".join(f"{k} {v}" for k, v in summary.failed.items() if v) or "0")
    head.add_row("aborted at end", str(summary.outcomes["aborted"]))
    head.add_row("started / balanced", f"{summary.started} / {'yes' if summary.balanced else 'NO'}")
    head.add_row("effective duration (s)", f"{summary.effective_duration_s:.2f}")
    head.add_row("completion throughput (req/s)", f"{summary.completion_throughput_rps:.3f}")
    head.add_row("output tokens/s", f"{summary.output_tokens_per_s:.1f}")
    head.add_row("total tokens/s", f"{summary.total_tokens_per_s:.1f}")
    head.add_row("peak concurrency", str(summary.peak_concurrency))
    lag = summary.dispatch_lag_p99_s
    head.add_row("dispatch lag p99 (ms)", "-" if lag is None else f"{lag * 1000:.2f}")
    console.print(head)
    latencies = Table(title="latency (ms)")
    for column in ("metric", "count", "mean", "p50", "p90", "p99"):
        latencies.add_column(column, justify="right")
    for name in ("ttft", "tpot", "itl", "e2e"):
        dist: Distribution = getattr(summary, name)
        cells = [getattr(dist, k) for k in ("mean", "p50", "p90", "p99")]
        latencies.add_row(name.upper(), str(dist.count), *("-" if v is None else f"{v * 1000:.2f}" for v in cells))
    console.print(latencies)
