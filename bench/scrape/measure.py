"""The exporter scrape bench's measurement: stubs up, the exporter started and checked once, then timed scrapes
with the exporter's CPU and memory around them, summed up as a Result."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from batchscope.testkit.processes import SetupError
from batchscope.testkit.procfs import core_busy_seconds, cpu_seconds, status_mb
from batchscope.vllm import catalogue
from batchscope.wire.listen import free_port
from scrape.exporter import scrape, start_exporter, wait_ready
from scrape.settings import BENCH_CORE, EXPORTER_CORE, MAX_P99_MS, MAX_RSS_MB, STOP_TIMEOUT_S, TARGETS
from scrape.stubs import base_url, start_stub
from scrape.upstreams import client_exposition, sample_lines, vllm_exposition, vllm_json_routes


@dataclass
class Result:
    vllm_series: int
    vllm_prefixed_series: int
    engines: int
    vllm_kb: float
    client_series: int
    exporter_series: int
    exporter_kb: float
    scrapes: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    cpu_ms_per_scrape: float
    upstream_vllm_p50_ms: float
    upstream_loadgen_p50_ms: float
    rss_mb: float
    hwm_mb: float
    other_load_exporter_core: float
    other_load_bench_core: float
    duration_s: float
    sanity: str

    @property
    def p99_ok(self) -> bool:
        return self.p99_ms <= MAX_P99_MS

    @property
    def rss_ok(self) -> bool:
        return max(self.rss_mb, self.hwm_mb) <= MAX_RSS_MB


@dataclass
class Window:
    """What the timed scrapes measured."""

    latencies_s: list[float]
    upstream_s: dict[str, list[float]]
    exporter_cpu_s: float
    bench_cpu_s: float
    rss_mb: float
    core_busy_s: dict[int, float]
    wall_s: float
    last_body: bytes


def series_keys(text: bytes, prefix: str) -> set[tuple]:
    """(sample name, sorted labels) of every sample whose family name starts with ``prefix``."""
    return {(s.name, tuple(sorted(s.labels.items()))) for f in text_string_to_metric_families(text.decode())
            if f.name.startswith(prefix) for s in f.samples}


def target_values(body: bytes, family: str) -> dict[str, float]:
    """A per-target family of the exporter's answer (batchscope_up, ..._scrape_duration_seconds): target -> value.

    Read from the text directly (cheap enough for every scrape): lines ``family{target="NAME"} VALUE``.
    """
    values = {}
    for target in TARGETS:
        prefix = f'{family}{{target="{target}"}} '.encode()
        start = body.find(prefix)
        if start >= 0:
            end = body.find(b"\n", start)
            values[target] = float(body[start + len(prefix):end if end >= 0 else None])
    return values


def check_output(body: bytes, vllm_text: bytes, client_text: bytes) -> list[str]:
    """What is wrong with the exporter's answer; empty when it carries every upstream series and both are up."""
    problems = []
    expected_vllm, got_vllm = sample_lines(vllm_text, catalogue.PREFIX), sample_lines(body, catalogue.PREFIX)
    if got_vllm != expected_vllm:
        problems.append(f"vllm:* series: {got_vllm} exposed, {expected_vllm} upstream")
    client = series_keys(client_text, "batchscope_client_")
    if missing := client - series_keys(body, "batchscope_client_"):
        problems.append(f"{len(missing)} of {len(client)} client series missing, e.g. {sorted(missing)[0][0]}")
    up = target_values(body, "batchscope_up")
    if up != dict.fromkeys(TARGETS, 1.0):
        problems.append(f"batchscope_up is {up or 'absent'}")
    return problems


def measure(port: int, pid: int, scrapes: int, warmup: int) -> Window:
    """Untimed warm-up scrapes, then ``scrapes`` timed ones with the exporter's CPU and memory around them."""
    for _ in range(warmup):
        scrape(port)
    latencies: list[float] = []
    upstream: dict[str, list[float]] = {target: [] for target in TARGETS}
    rss, body = 0.0, b""
    cores = (EXPORTER_CORE, BENCH_CORE)
    busy_before = core_busy_seconds()
    cpu_before, bench_before, started = cpu_seconds(pid), cpu_seconds(os.getpid()), time.monotonic()
    for _ in range(scrapes):
        elapsed, body = scrape(port)
        latencies.append(elapsed)
        for target, seconds in target_values(body, "batchscope_scrape_duration_seconds").items():
            upstream[target].append(seconds)
        rss = max(rss, status_mb(pid, "VmRSS"))
    exporter_cpu, bench_cpu, busy = cpu_seconds(pid), cpu_seconds(os.getpid()), core_busy_seconds()
    return Window(latencies_s=latencies, upstream_s=upstream, exporter_cpu_s=exporter_cpu - cpu_before,
                  bench_cpu_s=bench_cpu - bench_before, rss_mb=rss,
                  core_busy_s={core: busy[core] - busy_before[core] for core in cores},
                  wall_s=time.monotonic() - started, last_body=body)


def median_ms(values: list[float]) -> float:
    return float(np.median(values)) * 1000 if values else float("nan")


def summarize(window: Window, hwm_mb: float, vllm_text: bytes, client_text: bytes, engines: int,
              sanity: str, started: float) -> Result:
    ms = np.asarray(window.latencies_s) * 1000
    wall = max(window.wall_s, 1e-9)
    return Result(
        vllm_series=sample_lines(vllm_text), vllm_prefixed_series=sample_lines(vllm_text, catalogue.PREFIX),
        engines=engines,
        vllm_kb=len(vllm_text) / 1024, client_series=sample_lines(client_text),
        exporter_series=sample_lines(window.last_body), exporter_kb=len(window.last_body) / 1024,
        scrapes=len(ms), p50_ms=float(np.percentile(ms, 50)), p99_ms=float(np.percentile(ms, 99)),
        max_ms=float(ms.max()), cpu_ms_per_scrape=window.exporter_cpu_s * 1000 / len(ms),
        upstream_vllm_p50_ms=median_ms(window.upstream_s["vllm"]),
        upstream_loadgen_p50_ms=median_ms(window.upstream_s["loadgen"]), rss_mb=window.rss_mb, hwm_mb=hwm_mb,
        other_load_exporter_core=max(window.core_busy_s[EXPORTER_CORE] - window.exporter_cpu_s, 0.0) / wall,
        other_load_bench_core=max(window.core_busy_s[BENCH_CORE] - window.bench_cpu_s, 0.0) / wall,
        duration_s=time.monotonic() - started, sanity=sanity)


def run(args: argparse.Namespace) -> Result:
    started = time.monotonic()
    vllm_text, engines = vllm_exposition(args.series)
    client_text = client_exposition(args.records)
    vllm_stub = start_stub({"/metrics": vllm_text, **vllm_json_routes()})
    loadgen_stub = start_stub({"/metrics": client_text})
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="exporter-scrape-") as workdir:
        log_path = Path(workdir) / "exporter.log"
        exporter = start_exporter(base_url(vllm_stub), base_url(loadgen_stub), port, log_path)
        try:
            wait_ready(exporter, port)
            body = scrape(port)[1]
            if problems := check_output(body, vllm_text, client_text):
                raise SetupError("exporter output is wrong: " + "; ".join(problems))
            exposed, upstream = sample_lines(body, catalogue.PREFIX), sample_lines(vllm_text, catalogue.PREFIX)
            sanity = (f"{exposed} of {upstream} vllm:* series and all "
                      f"{len(series_keys(client_text, 'batchscope_client_'))} client series exposed, "
                      f"batchscope_up vllm=1 loadgen=1")
            window = measure(port, exporter.pid, args.scrapes, args.warmup)
            hwm = status_mb(exporter.pid, "VmHWM")
        finally:
            exporter.stop(STOP_TIMEOUT_S)
            vllm_stub.shutdown()
            loadgen_stub.shutdown()
    return summarize(window, hwm, vllm_text, client_text, engines, sanity, started)
