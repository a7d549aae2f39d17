"""The end-of-run summary: exact statistics from the per-request records over the measurement window.

The window and its population are window.py's (the rule the live metrics and the LLM tab share):
every request figure takes the requests that *ended* in the window, whatever their start. Completion throughput =
requests completed ok in the window / the window, as `vllm bench serve` (which has no warm-up) counts it, and
TTFT, TPOT, E2E per such request and ITL pooled over their every gap. A closed
loop then obeys Little's law (throughput x mean E2E = users). Output tokens/s counts the tokens that *arrived*
in the window (by their chunk times, whatever became of their request); total tokens/s adds the prompts of the
requests whose first token came in the window. Figures come from figures.py, folded in as records
arrive: TTFT, TPOT and E2E exact; ITL percentiles from a sketch within 0.5% (its count and mean exact).
"""

from __future__ import annotations

import math
import platform
from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np
from pydantic import BaseModel, Field
from rich.console import Console
from rich.table import Table

from batchscope.loadgen.figures.away import Gap, away_s
from batchscope.loadgen.figures.figures import RunFigures
from batchscope.loadgen.figures.metrics import ClientStats
from batchscope.loadgen.figures.saturation import GeneratorLoad
from batchscope.loadgen.figures.sketch import GapPool
from batchscope.loadgen.figures.window import final_window
from batchscope.loadgen.spec import PoissonLoad, WorkloadSpec
from batchscope.runs.provenance import Provenance

# 2: window = requests that ended in it; offered rate; failure; 3: admission rejections; 4: the server away
SUMMARY_SCHEMA_VERSION = 4


class Distribution(BaseModel):
    """Mean and percentiles of one latency, seconds."""

    count: int = Field(description="Number of observations.")
    mean: float | None = Field(description="Arithmetic mean, seconds.")
    p50: float | None = Field(description="Median, seconds.")
    p90: float | None = Field(description="90th percentile, seconds.")
    p99: float | None = Field(description="99th percentile, seconds.")

    @classmethod
    def of(cls, values: Sequence[float] | np.ndarray) -> Distribution:
        """Exact figures of the values (numpy's linear percentiles)."""
        if len(values) == 0:
            return cls(count=0, mean=None, p50=None, p90=None, p99=None)
        array = np.asarray(values, dtype=float)
        p50, p90, p99 = np.percentile(array, [50, 90, 99])
        return cls(count=array.size, mean=float(array.mean()), p50=float(p50), p90=float(p90), p99=float(p99))

    @classmethod
    def of_sketch(cls, sketch: GapPool) -> Distribution:
        """Exact count and mean; percentiles within the sketch's relative error (sketch.py;
        ExactGaps': exact)."""
        if sketch.count == 0:
            return cls(count=0, mean=None, p50=None, p90=None, p99=None)
        p50, p90, p99 = sketch.quantiles([0.5, 0.9, 0.99])
        return cls(count=sketch.count, mean=sketch.mean, p50=p50, p90=p90, p99=p99)


class AwayGap(BaseModel):
    """One time the server was away (batchscope/loadgen/figures/away.py)."""

    start_s: float = Field(description="The first refused or reset connection, Unix seconds.")
    end_s: float | None = Field(description="The send of the first request after it the server answered, Unix "
                                "seconds; null: the server was not back when the run ended.")
    duration_s: float = Field(description="end_s - start_s (to the run's stop when not back), seconds.")
    connection_errors: int = Field(description="connection_error outcomes in the gap, whole run.")

    @classmethod
    def of(cls, gap: Gap, until_s: float) -> AwayGap:
        end = until_s if gap.end_s is None else gap.end_s
        return cls(start_s=gap.start_s, end_s=gap.end_s, duration_s=end - gap.start_s,
                   connection_errors=gap.connection_errors)


class Summary(Provenance):
    """One run's result, with the spec that produced it."""

    schema_version: int = Field(SUMMARY_SCHEMA_VERSION, description="Bumped on any breaking change of this model.")
    python: str = Field(platform.python_version(), description="Python version of the load generator.")
    run_id: str = Field(description="Run identifier (label run_id in metrics, file names).")
    host: str = Field(description="Base URL of the server under test.")
    started_at: str = Field(description="Run start, ISO 8601 UTC.")
    spec: WorkloadSpec = Field(description="The workload spec in force.")
    started: int = Field(description="Requests started (warm-up included).")
    outcomes: dict[str, int] = Field(description="Finished requests by outcome (warm-up included).")
    balanced: bool = Field(description="started == sum of outcomes: every request ended in exactly one outcome.")
    refused_arrivals: int = Field(description="Open-loop arrivals not sent (warm-up included), each counted once: "
                                  "started + refused_arrivals = the schedule's arrivals due before the stop.")
    refused_arrivals_by_reason: dict[str, int] = Field(default_factory=dict, description=(
        "Those by reason: in_flight_cap (at the spec's max_in_flight), backing_off (after non-retryable HTTP "
        "errors, 429s or 503s; vLLM's admission 503s never back off), server_away (connections refused or reset)."))
    server_away: list[AwayGap] = Field(default_factory=list, description=(
        "The times the server was away (at least 1 s from a refused or reset connection to the next answered "
        "request), in order, whole run."))
    server_away_s: float = Field(0.0, description="Their total duration, seconds.")
    failed_while_away: int = Field(0, description=(
        "connection_error outcomes that ended in the window inside a gap the server came back from: in failed, "
        "but not in the failure rule (a restart is not the server failing requests)."))
    window_start_s: float = Field(description="Measurement window start (the end of warm-up), Unix seconds.")
    completed: int = Field(description="Requests with outcome ok that ended in the measurement window.")
    failed: dict[str, int] = Field(description="Requests that ended in the window, by non-ok outcome (aborted "
                                   "excluded: the run's end cut them; rejected_busy excluded: admission_rejections).")
    admission_rejections: dict[str, int] = Field(default_factory=dict, description=(
        "Requests vLLM's admission check refused (outcome rejected_busy, HTTP 503 with vLLM's admission body) "
        "that ended in the window, by reason (max_num_queued_reqs, max_num_queued_tokens): the server's policy "
        "at work, so neither in failed nor in the failure rule."))
    rejected_share: float | None = Field(None, description=(
        "Those rejections / every request that ended in the window (completed + failed + rejected), 0-1; null "
        "when none ended in it."))
    effective_duration_s: float = Field(description="Measurement window length, seconds.")
    completion_throughput_rps: float = Field(description="completed / effective_duration_s, requests/s.")
    target_rate_rps: float | None = Field(description="Poisson: the spec's arrival rate λ, requests/s.")
    offered_rate_rps: float | None = Field(description="Poisson: arrivals scheduled in the window (sent or "
                                           "refused) / effective_duration_s, requests/s.")
    output_tokens_per_s: float = Field(description="Output tokens that arrived in the window / duration.")
    total_tokens_per_s: float = Field(description="Those plus the prompts first answered in the window / duration.")
    ttft: Distribution = Field(description="Time to first token (from the scheduled send), completed requests.")
    tpot: Distribution = Field(description="Time per output token, (E2E - TTFT) / (n - 1), completed requests.")
    itl: Distribution = Field(description="Inter-token latency, every gap of the completed requests pooled "
                              "(percentiles within 0.5% relative error, batchscope/loadgen/figures/sketch.py).")
    e2e: Distribution = Field(description="End-to-end latency (from the scheduled send), completed requests.")
    peak_concurrency: int = Field(description="Most requests in flight at once (sweep over send..end, whole run).")
    dispatch_lag_p99_s: float | None = Field(description="p99 of actual - scheduled send over every request sent "
                                             "(warm-up included: it measures the generator), seconds.")
    failure: str | None = Field(description="Why the run failed (exit status 4): no request completed in the "
                                "window, or more than spec.max_failed_fraction of those that ended in it failed; "
                                "null when it did not.")
    generator: GeneratorLoad | None = Field(None, description="Whether the load generator itself was the "
                                            "bottleneck (batchscope/loadgen/figures/saturation.py); null in "
                                            "summaries written before it was measured.")


def summarize(spec: WorkloadSpec, figures: RunFigures, stats: ClientStats, generator: GeneratorLoad, *,
              run_id: str, host: str, start_s: float, stop_s: float, refused_s: Sequence[float] = ()) -> Summary:
    """Build the summary from the run's figures (figures.py) and counters
    (metrics.py). The window starts after warm-up and lasts duration_s, or less if the run stopped
    sooner (offline: until the last end); Locust's shape ticks once a second, so the stop itself comes late.

    ``refused_s`` holds the scheduled times of the refused arrivals, for the offered rate.
    """
    ends = [figures.last_end_s] if math.isfinite(figures.last_end_s) else []
    window = final_window(spec, start_s, stop_s, ends)
    duration = window.duration_s
    target_rate = offered = None
    if isinstance(spec.load, PoissonLoad):
        target_rate = spec.load.rate
        refused_in_window = sum(1 for moment in refused_s if window.start_s <= moment < window.end_s)
        offered = (figures.scheduled_in_window + refused_in_window) / duration
    lags = np.asarray(figures.dispatch_lags)
    outcomes = dict(stats.outcomes)
    gaps = figures.away.gaps(stop_s)
    return Summary(
        run_id=run_id, host=host, started_at=datetime.fromtimestamp(start_s, UTC).isoformat(), spec=spec,
        started=stats.started, outcomes=outcomes, balanced=stats.started == sum(outcomes.values()),
        refused_arrivals=stats.refused, refused_arrivals_by_reason=dict(stats.not_sent),
        server_away=[AwayGap.of(gap, stop_s) for gap in gaps], server_away_s=away_s(gaps, stop_s),
        failed_while_away=while_away(gaps), window_start_s=window.start_s, completed=figures.completed,
        failed=dict(figures.failed), admission_rejections=dict(figures.rejected),
        rejected_share=figures.rejected_share(), effective_duration_s=duration,
        completion_throughput_rps=figures.completed / duration, target_rate_rps=target_rate,
        offered_rate_rps=offered, output_tokens_per_s=figures.output_tokens / duration,
        total_tokens_per_s=(figures.output_tokens + figures.prompt_tokens) / duration,
        **latencies(figures), peak_concurrency=figures.peak_concurrency(),
        dispatch_lag_p99_s=float(np.percentile(lags, 99)) if lags.size else None,
        failure=failure_reason(spec, figures, while_away(gaps)), generator=generator,
    )


def latencies(figures: RunFigures) -> dict[str, Distribution]:
    """TTFT, TPOT, ITL and E2E of the requests the figures counted (completed ok in the window)."""
    return {"ttft": Distribution.of(figures.ttft), "tpot": Distribution.of(figures.tpot),
            "itl": Distribution.of_sketch(figures.itl), "e2e": Distribution.of(figures.e2e)}


def while_away(gaps: list[Gap]) -> int:
    """Connection errors that ended in the window inside the gaps the server came back from."""
    return sum(gap.in_window for gap in gaps if gap.end_s is not None)


def failure_reason(spec: WorkloadSpec, figures: RunFigures, away: int = 0) -> str | None:
    """One line saying why the run failed, or None: nothing completed in the window, or too large a share of
    the requests that ended in it failed (aborted ones excluded: the run's end cut them, not the server;
    admission rejections: the server's policy, reported on their own; and the ``away`` connection errors of a
    restart the server came back from)."""
    completed, failed = figures.completed, figures.failed
    status = figures.rejected_throughout()
    if completed == 0 and figures.finished and status is not None:
        # the commonest failure by far (a wrong key, model name or length): name the answer the server gave
        detail = " ".join((figures.rejection_detail[status] or "no detail").split())[:80]
        return f"all {figures.finished} finished requests were rejected with HTTP {status} ({detail})"
    failures = sum(failed.values()) - away
    breakdown = ", ".join(f"{outcome} {count}" for outcome, count in failed.items() if count)
    breakdown += f" ({away} connection errors while the server was away not counted)" if away else ""
    if completed == 0:
        rejected = sum(figures.rejected.values())
        ended = ", ".join(part for part in (breakdown, f"rejected_busy {rejected}" if rejected else "") if part)
        return f"no request completed in the measurement window ({ended or 'none ended in it'})"
    fraction = failures / (completed + failures)
    if fraction > spec.max_failed_fraction:
        return (f"{failures} of {completed + failures} requests that ended in the window failed ({fraction:.0%} > "
                f"max_failed_fraction {spec.max_failed_fraction:.0%}): {breakdown}")
    return None


def print_summary(summary: Summary, console: Console | None = None) -> None:
    """The human table: counts, throughput, and latencies in ms (labelled)."""
    console = console or Console()
    head = Table(title=f"batchscope load {summary.run_id}: {summary.spec.scenario}", show_header=False)
    head.add_row("completed (ok, in window)", str(summary.completed))
    head.add_row("failed (ended in window)", ", ".join(f"{k} {v}" for k, v in summary.failed.items() if v) or "0")
    head.add_row("rejected by vLLM's admission (in window)", rejections_line(summary))
    head.add_row("aborted at end", str(summary.outcomes["aborted"]))
    if summary.server_away:
        head.add_row("server away (s)", away_line(summary))
    if summary.refused_arrivals:
        head.add_row("arrivals not sent", ", ".join(f"{reason} {count}" for reason, count
                                                    in summary.refused_arrivals_by_reason.items() if count))
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
    if summary.generator is not None:
        head.add_row("generator", generator_line(summary.generator))
    console.print(head)
    latencies = Table(title="latency (ms)")
    for column in ("metric", "count", "mean", "p50", "p90", "p99"):
        latencies.add_column(column, justify="right")
    for name in ("ttft", "tpot", "itl", "e2e"):
        dist: Distribution = getattr(summary, name)
        cells = [getattr(dist, k) for k in ("mean", "p50", "p90", "p99")]
        latencies.add_row(name.upper(), str(dist.count), *("-" if v is None else f"{v * 1000:.2f}" for v in cells))
    console.print(latencies)


def away_line(summary: Summary) -> str:
    """The total and each gap: its start into the run, its duration, its connection errors."""
    start = datetime.fromisoformat(summary.started_at).timestamp()
    gaps = "; ".join(f"at {gap.start_s - start:.1f} s for {gap.duration_s:.2f} s"
                     f"{'' if gap.end_s is not None else ' (not back)'}, {gap.connection_errors} connection errors"
                     for gap in summary.server_away)
    return f"{summary.server_away_s:.2f}: {gaps}"


def rejections_line(summary: Summary) -> str:
    """The admission rejections by reason and their share of the requests that ended in the window."""
    total = sum(summary.admission_rejections.values())
    if not total:
        return "0"
    reasons = ", ".join(f"{reason} {count}" for reason, count in summary.admission_rejections.items() if count)
    return f"{total} ({summary.rejected_share:.1%} of those ended): {reasons}"


def generator_line(generator: GeneratorLoad) -> str:
    """The verdict in one line: the advice when saturated, the measures otherwise."""
    if generator.advice:
        return f"SATURATED: {generator.advice}"
    cpu = "-" if generator.cpu_share is None else f"{generator.cpu_share:.0%}"
    lag = "-" if generator.read_lag_p50_s is None else f"{generator.read_lag_p50_s * 1e3:.2f} ms"
    return f"kept up (sender CPU {cpu} of a core, read lag median {lag})"
