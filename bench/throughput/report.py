"""The throughput bench's report: the runs' table, notes, contention warnings, targets, and JSON."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from batchscope.testkit.report import table, targets_table
from throughput.results import RunResult, VirtualResult
from throughput.settings import (
    CLIENT_CORE,
    CONTENDED_CPU,
    MAX_PACED_LAG_P99_MS,
    MAX_RSS_MB,
    MIN_TOKENS_PER_S,
    MIN_VIRTUAL_SPEEDUP,
    SERVER_CORE,
)


def runs_table(results: list[RunResult]) -> str:
    header = ["run", "profile", "streams", "running+waiting", "tok/s client", "tok/s server", "server CPU",
              "client CPU", "others c0/c1", "step ms", "lag/step", "lag p50 ms", "lag p99 ms", "lag max ms",
              "peak RSS MB", "errors", "bottleneck"]
    rows = [[r.spec.label, r.spec.profile, str(r.spec.streams), f"{r.running}+{r.waiting}",
             f"{r.tokens_per_s:,.0f}", f"{r.server_tokens_per_s:,.0f}", f"{r.server_cpu:.0%}", f"{r.client_cpu:.0%}",
             f"{r.server_core_other:.0%}/{r.client_core_other:.0%}", f"{r.step_ms:.2f}", f"{r.lag_share:.0%}",
             f"{r.lag_p50_ms:.2f}", f"{r.lag_p99_ms:.2f}", f"{r.lag_max_ms:.2f}", f"{r.peak_rss_mb:.0f}",
             str(r.stream_errors), r.bottleneck] for r in results]
    return table(header, rows)


def checks(closed: list[RunResult], paced: RunResult, virtual: VirtualResult) -> list[tuple[str, str, bool]]:
    """(target, measured, passed) for each target of the issue."""
    out = [(f"tokens/s >= {MIN_TOKENS_PER_S:,} at {r.spec.streams} streams", f"{r.tokens_per_s:,.0f}",
            r.tokens_per_s >= MIN_TOKENS_PER_S) for r in closed]
    out.append((f"step-lag p99 <= {MAX_PACED_LAG_P99_MS:g} ms at {paced.tokens_per_s:,.0f} tok/s",
                f"{paced.lag_p99_ms:.2f} ms", paced.lag_p99_ms <= MAX_PACED_LAG_P99_MS))
    largest = max(closed, key=lambda r: r.spec.streams)
    out.append((f"peak RSS <= {MAX_RSS_MB} MB at {largest.spec.streams} streams", f"{largest.peak_rss_mb:.0f} MB",
                largest.peak_rss_mb <= MAX_RSS_MB))
    out.append((f"virtual clock >= {MIN_VIRTUAL_SPEEDUP}x (~256 streams)", f"{virtual.speedup:,.0f}x",
                virtual.speedup >= MIN_VIRTUAL_SPEEDUP))
    return out


def contention_warnings(results: list[RunResult]) -> list[str]:
    return [f"WARNING: other processes took {r.server_core_other:.0%} of core {SERVER_CORE} and "
            f"{r.client_core_other:.0%} of core {CLIENT_CORE} during '{r.spec.label}'; its figures are suspect."
            for r in results if max(r.server_core_other, r.client_core_other) >= CONTENDED_CPU]


def report(closed: list[RunResult], paced: list[RunResult], virtual: VirtualResult, args: argparse.Namespace) -> str:
    results = [*closed, paced[-1]]
    tries = ", ".join(f"{r.spec.streams} streams -> {r.tokens_per_s:,.0f} tok/s" for r in paced)
    return "\n".join([
        f"Streams: prompt {args.prompt_len} token ids, max_tokens {args.max_tokens}, ignore_eos; server alone on "
        f"core {SERVER_CORE}, client on core {CLIENT_CORE}; warm-up {args.warmup:g} s, window {args.duration:g} s.",
        "",
        runs_table(results),
        "",
        "running+waiting: engine requests at the window's end. others c0/c1: CPU other processes took on the "
        "server's / client's core.",
        "step ms: wall time per engine step; lag/step: median lag / step ms. Step lag: the server's last 100k "
        "steps (warm-up included when fewer).",
        f"Paced run's stream count (from the cost model, then rescaled): {tries}.",
        f"Virtual clock: {virtual.workload}: {virtual.simulated_s:,.1f} simulated s in {virtual.wall_s:.2f} wall s "
        f"({virtual.steps:,} steps, {virtual.requests:,} requests, {virtual.mean_running:.0f} running on average).",
        *contention_warnings(results),
        "",
        targets_table(checks(closed, paced[-1], virtual)),
    ])


def to_json(closed: list[RunResult], paced: list[RunResult], virtual: VirtualResult) -> dict:
    def run_json(r: RunResult) -> dict:
        return {**asdict(r), "step_ms": r.step_ms, "lag_share": r.lag_share, "bottleneck": r.bottleneck}

    return {
        "closed_loop": [run_json(r) for r in closed],
        "paced": [run_json(r) for r in paced],
        "virtual_clock": {**asdict(virtual), "speedup": virtual.speedup},
        "targets": [{"target": n, "measured": v, "pass": ok} for n, v, ok in checks(closed, paced[-1], virtual)],
    }
