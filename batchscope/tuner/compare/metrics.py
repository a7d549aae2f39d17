"""The metrics a comparison reports: how each is read from a finished run and what bootstraps its interval.

A run is compared only when it finished with both sides' figures (client and server); `measured(run)` is that
run's figures, or None for a failed run (listed, not compared).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from batchscope.tuner.results import ClientFigures, RequestSamples, RunResult, ServerSignals


@dataclass(frozen=True)
class Measured:
    """A finished run's figures, every part present."""

    client: ClientFigures
    server: ServerSignals
    samples: RequestSamples


def measured(run: RunResult) -> Measured | None:
    """The run's figures, or None when it failed or left a side without figures."""
    if run.status != "ok" or run.client is None or run.server is None:
        return None
    return Measured(run.client, run.server, run.samples)


@dataclass(frozen=True)
class MetricDef:
    """One compared metric: how to read it from a run, and how to bootstrap it from one run's data."""

    key: str
    label: str
    unit: str  # base unit of the value: s, req/s, tok/s, count, requests, ratio
    better: Literal["lower", "higher"] | None
    read: Callable[[Measured], float | None]
    samples: str | None = None  # RequestSamples field to resample (latency percentiles)
    percentile: float | None = None  # one of bootstrap.Bootstrap.PERCENTILES
    count: Callable[[Measured], float] | None = None  # the Poisson count behind a rate or total


def _latency(name: str, q: int | None) -> MetricDef:
    """A latency's percentile q, or its mean (q None: no percentile to bootstrap across requests)."""
    label = name.upper() if name != "e2e" else "E2E"
    field = "mean" if q is None else f"p{q}"
    return MetricDef(f"{name}_{field}", f"{label} {field}", "s", "lower",
                     lambda r: getattr(getattr(r.client, name), field), f"{name}_s",
                     None if q is None else float(q))


METRICS: tuple[MetricDef, ...] = (
    *(_latency(name, q) for name in ("ttft", "tpot") for q in (None, 50, 99)),
    *(_latency(name, q) for name in ("itl", "e2e") for q in (50, 99)),
    # completed requests whose own TTFT and TPOT met the plan's SLOs, per second (vLLM bench serve's goodput)
    MetricDef("goodput_rps", "goodput", "req/s", "higher", lambda r: r.client.goodput_rps,
              count=lambda r: r.client.good_completed or 0),
    # refused by vLLM's admission check (HTTP 503): not completed, so never good; the share is of every request
    # that ended in the window, the count behind both the rejections
    MetricDef("rejected", "rejected (admission)", "count", "lower", lambda r: r.client.rejected_total,
              count=lambda r: r.client.rejected_total),
    MetricDef("rejected_share", "rejected share", "ratio", "lower", lambda r: r.client.rejected_share,
              count=lambda r: r.client.rejected_total),
    MetricDef("completion_throughput_rps", "completion throughput", "req/s", "higher",
              lambda r: r.client.completion_throughput_rps, count=lambda r: r.client.completed),
    # tokens per completed request scale the count: the tokens arrive with the requests that carry them
    MetricDef("output_tokens_per_s", "output tokens/s", "tok/s", "higher",
              lambda r: r.client.output_tokens_per_s, count=lambda r: r.client.completed),
    MetricDef("preemptions", "preemptions", "count", "lower", lambda r: r.server.preemptions,
              count=lambda r: r.server.preemptions),
    MetricDef("max_waiting", "max waiting", "requests", "lower", lambda r: r.server.max_waiting),
    MetricDef("kv_usage_peak", "KV usage peak", "ratio", None, lambda r: r.server.kv_usage_peak),
    MetricDef("errors", "errors", "count", "lower", lambda r: r.client.errors, count=lambda r: r.client.errors),
)
METRIC_BY_KEY = {m.key: m for m in METRICS}


def mean_present(values: list[float | None]) -> float | None:
    """The mean of the values that exist (a run may lack one, e.g. TPOT of one-token outputs), or None."""
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None
