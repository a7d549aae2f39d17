"""Soak mode of the capacity bench: one `batchscope load` at the full closed-loop rate for many minutes, its RSS
and throughput sampled as it runs; RSS must stay flat after the first minute, and the summary's ITL percentiles
(from the load generator's sketch) must match the exact ones from records.jsonl within the sketch's error."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import requests

from batchscope.loadgen.figures.sketch import ALPHA
from batchscope.testkit.processes import SetupError
from batchscope.testkit.procfs import status_mb
from batchscope.testkit.report import table, targets_table
from capacity.loadgen_runs import LoadGenerator, loadgen_spec
from capacity.server import Server
from capacity.settings import HTTP_TIMEOUT_S, LOCUST_FINAL_S, STOP_TIMEOUT_S, progress
from capacity.windows import Load

SAMPLE_S = 10.0
SETTLE_S = 60.0  # RSS growth is judged after the first minute (allocator arenas, caches, Locust's own tables)
MAX_GROWTH_MB_PER_MIN = 2.0


@dataclass
class Soak:
    minutes: float
    samples: list[tuple[float, float, float, float]] = field(default_factory=list)  # (s, RSS MB, tokens, CPU s)
    summary: dict = field(default_factory=dict)
    exact_itl: dict[str, float] = field(default_factory=dict)

    def growth_mb_per_min(self) -> float:
        """Slope of a least-squares line through the RSS samples after SETTLE_S."""
        later = [(t, rss) for t, rss, _, _ in self.samples if t >= SETTLE_S]
        if len(later) < 2:
            return float("nan")
        t, rss = np.asarray(later).T
        return float(np.polyfit(t / 60, rss, 1)[0])


def client_output_tokens(metrics_url: str) -> float:
    text = requests.get(metrics_url, timeout=HTTP_TIMEOUT_S).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("batchscope_client_output_tokens_total"))


def run_soak(args: argparse.Namespace, workdir: Path) -> Soak:
    soak = Soak(args.soak)
    server = Server.start(workdir, args.profile)
    try:
        spec = loadgen_spec(args, Load(args.streams), warmup=args.warmup, tail=0.0)
        spec["duration_s"] = args.soak * 60
        progress(f"soak: batchscope load, closed loop, {args.streams} streams, {args.soak:g} min")
        gen = LoadGenerator(server, workdir, "soak", spec)
        try:
            gen.wait_streaming(server, args.streams)
            pid, start = gen.locust_pid(), time.monotonic()
            while gen.child.alive():
                soak.samples.append((time.monotonic() - start, status_mb(pid, "VmRSS"),
                                     client_output_tokens(gen.metrics_url), gen.child.cpu_seconds()))
                if time.monotonic() - start > args.warmup + args.soak * 60 - SAMPLE_S:
                    break
                time.sleep(SAMPLE_S)  # the sampling period
            gen.child.wait(LOCUST_FINAL_S + STOP_TIMEOUT_S + args.warmup + SAMPLE_S)
        finally:
            gen.child.stop()
    finally:
        server.sim.stop()
    summary_path = gen.out / "summary.json"
    if not summary_path.exists():
        raise SetupError(f"the soak's batchscope load wrote no summary:\n{gen.child.log_tail()}")
    soak.summary = json.loads(summary_path.read_text())
    soak.exact_itl = exact_itl(gen.out / "records.jsonl", soak.summary)
    return soak


def exact_itl(records_path: Path, summary: dict) -> dict[str, float]:
    """ITL p50/p90/p99 over every gap of the requests completed ok in the summary's window, from the records."""
    start = summary["window_start_s"]
    end = start + summary["effective_duration_s"]
    parts = []
    with open(records_path) as lines:
        for line in lines:
            record = json.loads(line)
            if record["outcome"] == "ok" and start <= record["end_s"] <= end:
                parts.append(np.asarray(record["itl_s"]))
    gaps = np.concatenate(parts) if parts else np.zeros(0)
    p50, p90, p99 = np.percentile(gaps, [50, 90, 99]) if gaps.size else (np.nan,) * 3
    return {"count": float(gaps.size), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def soak_report(soak: Soak) -> str:
    rows, previous = [], None
    for t, rss, tokens, cpu in soak.samples:
        rate = "-" if previous is None else f"{(tokens - previous[2]) / (t - previous[0]):,.0f}"
        busy = "-" if previous is None else f"{(cpu - previous[3]) / (t - previous[0]):.0%}"
        rows.append([f"{t:.0f}", f"{rss:.1f}", rate, busy])
        previous = (t, rss, tokens, cpu)
    itl, exact = soak.summary["itl"], soak.exact_itl
    errors = {p: abs(itl[p] - exact[p]) / exact[p] if exact[p] else abs(itl[p]) for p in ("p50", "p90", "p99")}
    growth = soak.growth_mb_per_min()
    lines = [
        f"Soak: {soak.minutes:g} min at the full closed-loop rate; samples every {SAMPLE_S:g} s:",
        table(["s", "RSS MB", "tok/s (completed)", "client CPU"], rows),
        "",
        f"summary.json: {soak.summary['output_tokens_per_s']:,.0f} output tok/s over "
        f"{soak.summary['effective_duration_s']:.0f} s, {soak.summary['completed']} completed, ITL count "
        f"{itl['count']:,} (exact {exact['count']:,.0f}); generator: "
        f"{soak.summary['generator']['advice'] or 'kept up'}",
        "ITL ms, summary (sketch) vs exact from records.jsonl: " + ", ".join(
            f"{p} {itl[p] * 1e3:.3f} vs {exact[p] * 1e3:.3f} ({errors[p]:.2%})" for p in ("p50", "p90", "p99")),
        "",
        targets_table([
            (f"RSS growth after the first minute <= {MAX_GROWTH_MB_PER_MIN:g} MB/min", f"{growth:+.2f} MB/min",
             bool(growth <= MAX_GROWTH_MB_PER_MIN)),
            (f"ITL p50/p90/p99 within {ALPHA:.1%} of exact", f"max {max(errors.values()):.2%}",
             max(errors.values()) <= ALPHA),
        ]),
    ]
    return "\n".join(lines)
