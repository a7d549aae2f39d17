"""The end-of-run summary: exact statistics from the per-request records over the measurement window.

The window and its population are loadgen/window.py's (the rule the live metrics and the LLM tab share): every
request figure takes the requests that *ended* in the window, whatever their start. Completion throughput =
requests completed ok in the window / the window, as `vllm bench serve` (which has no warm-up) counts it, and
TTFT, TPOT, E2E per such request and ITL pooled over their every gap, with exact percentiles (numpy). A closed
loop then obeys Little's law (throughput x mean E2E = users). Output tokens/s counts the tokens that *arrived*
in the window (by their chunk times, whatever became of their request); total tokens/s adds the prompts of the
requests whose first token came in the window.
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
from loadgen.request import OUTCOMES, RequestRecord, rejected
from loadgen.spec import PoissonLoad, WorkloadSpec
from loadgen.window import final_window, in_window  # noqa: F401 (in_window: tuner/signals.py reads it here)

SUMMARY_SCHEMA_VERSION = 2  # 2: window = requests that ended in it; offered rate; failure


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

    schema_version: int = Field(SUMMARY_SCHEMA_VERSION, description="Bumped on any breaking change of this model.")
    tool_version: str = Field(batchscope.__version__, description="batchscope version that wrote it.")
    python: str = Field(platform.python_version(), description="Python version of the load generator.")
    run_id: str = Field(description="Run identifier (label run_id in metrics, file names).")
    host: str = Field(description="Base URL of the server under test.")
    started_at: str = Field(description="Run start, ISO 8601 UTC.")
    spec: WorkloadSpec = Field(description="The workload spec in force.")
    started: int = Field(description="Requests started (warm-up included).")
    outcomes: dict[str, int] = Field(description="Finished requests by outcome (warm-up included).")
    balanced: bool = Field(description="started == sum of outcomes: every request ended in exactly one outcome.")
    refused_arrivals: int = Field(description="Open-loop arrivals not sent (warm-up included): at the in-flight "
                                  "cap, or while backing off after non-retryable HTTP errors.")
    window_start_s: float = Field(description="Measurement window start (the end of warm-up), Unix seconds.")
    completed: int = Field(description="Requests with outcome ok that ended in the measurement window.")
    failed: dict[str, int] = Field(description="Requests that ended in the window, by non-ok outcome (aborted "
                                   "excluded: the run's end cut them).")
    effective_duration_s: float = Field(description="Measurement window length, seconds.")
    completion_throughput_rps: float = Field(description="completed / effective_duration_s, requests/s.")
    target_rate_rps: float | None = Field(description="Poisson: the spec's arrival rate λ, requests/s.")
    offered_rate_rps: float | None = Field(description="Poisson: arrivals scheduled in the window (sent or "
                                           "refused) / effective_duration_s, requests/s.")
    output_tokens_per_s: float = Field(description="Output tokens that arrived in the window / duration.")
    total_tokens_per_s: float = Field(description="Those plus the prompts first answered in the window / duration.")
    ttft: Distribution = Field(description="Time to first token (from the scheduled send), completed requests.")
    tpot: Distribution = Field(description="Time per output token, (E2E - TTFT) / (n - 1), completed requests.")
    itl: Distribution = Field(description="Inter-token latency, every gap of the completed requests pooled.")
    e2e: Distribution = Field(description="End-to-end latency (from the scheduled send), completed requests.")
    peak_concurrency: int = Field(description="Most requests in flight at once (sweep over send..end, whole run).")
    dispatch_lag_p99_s: float | None = Field(description="p99 of actual - scheduled send over every request sent "
                                             "(warm-up included: it measures the generator), seconds.")
    failure: str | None = Field(description="Why the run failed (exit status 4): no request completed in the "
                                "window, or more than spec.max_failed_fraction of those that ended in it failed; "
                                "null when it did not.")


def summarize(spec: WorkloadSpec, records: list[RequestRecord], *, run_id: str, host: str, start_s: float,
              stop_s: float, started: int, refused: int, refused_s: Sequence[float] = ()) -> Summary:
    """Build the summary. The window starts after warm-up and lasts duration_s, or less if the run stopped
    sooner (offline: until the last end); Locust's shape ticks once a second, so the stop itself comes late.

    ``refused_s`` holds the scheduled times of the refused arrivals, for the offered rate.
    """
    window = final_window(spec, start_s, stop_s, (r.end_s for r in records if r.end_s is not None))
    window_start, window_end, duration = window.start_s, window.end_s, window.duration_s
    ended = [r for r in records if window.holds(r)]
    ok = [r for r in ended if r.outcome == "ok"]
    outcomes = dict.fromkeys(OUTCOMES, 0)
    for record in records:
        outcomes[record.outcome] += 1
    failed = dict.fromkeys((o for o in OUTCOMES if o not in ("ok", "aborted")), 0)
    for record in ended:
        if record.outcome in failed:
            failed[record.outcome] += 1
    output = tokens_in_window(records, window_start, window_end)
    prompt = sum(r.prompt_tokens or 0 for r in records
                 if r.first_token_s is not None and window_start <= r.first_token_s <= window_end)
    lags = [r.dispatch_lag_s for r in records if r.dispatch_lag_s is not None]
    target_rate = offered = None
    if isinstance(spec.load, PoissonLoad):
        target_rate = spec.load.rate
        arrivals = sum(1 for r in records if window_start <= r.scheduled_s < window_end)
        arrivals += sum(1 for moment in refused_s if window_start <= moment < window_end)
        offered = arrivals / duration
    return Summary(
        run_id=run_id, host=host, started_at=datetime.fromtimestamp(start_s, UTC).isoformat(), spec=spec,
        started=started, outcomes=outcomes, balanced=started == sum(outcomes.values()), refused_arrivals=refused,
        window_start_s=window_start, completed=len(ok), failed=failed, effective_duration_s=duration,
        completion_throughput_rps=len(ok) / duration, target_rate_rps=target_rate, offered_rate_rps=offered,
        output_tokens_per_s=output / duration, total_tokens_per_s=(output + prompt) / duration,
        ttft=Distribution.of([r.ttft_s for r in ok if r.ttft_s is not None]),
        tpot=Distribution.of([r.tpot_s for r in ok if r.tpot_s]),
        itl=Distribution.of(np.concatenate([np.asarray(r.itl_s, dtype=float) for r in ok]) if ok else []),
        e2e=Distribution.of([r.e2e_s for r in ok if r.e2e_s is not None]),
        peak_concurrency=peak_concurrency(records),
        dispatch_lag_p99_s=float(np.percentile(lags, 99)) if lags else None,
        failure=failure_reason(spec, len(ok), failed, records),
    )


def failure_reason(spec: WorkloadSpec, completed: int, failed: dict[str, int], records: list[RequestRecord]
                   ) -> str | None:
    """One line saying why the run failed, or None: nothing completed in the window, or too large a share of
    the requests that ended in it failed (aborted ones excluded: the run's end cut them, not the server)."""
    finished = [r for r in records if r.outcome != "aborted"]
    if completed == 0 and finished and all(rejected(r) and r.status == finished[0].status for r in finished):
        # the commonest failure by far (a wrong key, model name or length): name the answer the server gave
        detail = " ".join((finished[0].error or "no detail").split())[:80]
        return f"all {len(finished)} finished requests were rejected with HTTP {finished[0].status} ({detail})"
    failures = sum(failed.values())
    breakdown = ", ".join(f"{outcome} {count}" for outcome, count in failed.items() if count)
    if completed == 0:
        return f"no request completed in the measurement window ({breakdown or 'none ended in it'})"
    fraction = failures / (completed + failures)
    if fraction > spec.max_failed_fraction:
        return (f"{failures} of {completed + failures} requests that ended in the window failed ({fraction:.0%} > "
                f"max_failed_fraction {spec.max_failed_fraction:.0%}): {breakdown}")
    return None


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
    head.add_row("failed (ended in window)", ", ".join(f"{k} {v}" for k, v in summary.failed.items() if v) or "0")
    head.add_row("aborted at end", str(summary.outcomes["aborted"]))
    head.add_row("started / balanced", f"{summary.started} / {'yes' if summary.balanced else 'NO'}")
    head.add_row("effective duration (s)", f"{summary.effective_duration_s:.2f}")
    head.add_row("completion throughput (req/s)", f"{summary.completion_throughput_rps:.3f}")
    if summary.offered_rate_rps is not None:
        head.add_row("offered rate (req/s)", f"{summary.offered_rate_rps:.3f} (target {summary.target_rate_rps:g})")
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
