"""Exporter scrape benchmark: what one scrape of `batchscope exporter` costs against a large vLLM /metrics.

The bench process (pinned to core 1) serves two static stubs from threads on loopback ports:

* a vLLM server: /metrics with vLLM V1's real families (names, HELP, ``model_name``/``engine`` labels, bucket
  boundaries, ``_created`` twins, ``vllm:cache_config_info``, process/python collectors and the fastapi
  instrumentator's ``http_*`` families), replicated over data-parallel engines "0".."N-1" until it holds about
  --series sample lines (2,000 by default); plus /v1/models and /version JSON;
* a load generator: /metrics rendered by loadgen.metrics.ClientMetricsCollector over a ClientStats fed with a
  few thousand synthetic RequestRecords (the ``batchscope_client_*`` histograms and counters).

`batchscope exporter` runs as a child pinned to core 0, alone. The bench scrapes its /metrics --scrapes times in
a row (after a few warm-up scrapes) and reports:

* scrape latency p50/p99/max, ms: client-side wall time of each scrape, connect to last byte;
* exporter CPU per scrape, ms: utime + stime of the exporter process (all its threads, /proc/PID/stat) over
  the timed scrapes, divided by their number;
* exporter memory, MB: the largest VmRSS sampled after each scrape and VmHWM at the end (/proc/PID/status).

Targets: p99 <= 50 ms on one core and RSS <= 100 MB. A sanity check confirms once that the exporter re-exposes
every vllm:* series and every client series of the stubs. Also shown: the exporter's own
batchscope_scrape_duration_seconds (fetch + parse of each target, median), and the CPU other processes took on
either core during the timed scrapes, since it inflates the latencies. Exit status 0 whatever the figures;
non-zero when the exporter does not start or answers wrongly.

    .venv/bin/python bench/exporter_scrape.py [--scrapes N] [--warmup N] [--series N] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
from benchlib import (
    REPO,
    SetupError,
    argument_parser,
    core_busy_seconds,
    free_port,
    log_tail,
    pinned_to,
    proc_cpu_seconds,
    proc_status_mb,
    stop_process,
    write_json,
)
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    Summary,
    generate_latest,
)
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(REPO))  # run as a script: the project's packages come from the checkout

from batchscope.vllm_buckets import (  # noqa: E402
    ITERATION_TOKEN_BUCKETS,
    ITL_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    build_1_2_5_buckets,
)
from loadgen.metrics import ClientMetricsCollector, ClientStats  # noqa: E402
from loadgen.request import RequestRecord  # noqa: E402

EXPORTER_CORE, BENCH_CORE = 0, 1
MAX_P99_MS = 50.0
MAX_RSS_MB = 100.0
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
MAX_MODEL_LEN = 8192
VLLM_VERSION = "0.11.0"
STARTUP_TIMEOUT_S = 20.0
SCRAPE_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
POLL_S = 0.05
MAX_ENGINES = 64
TARGETS = ("vllm", "loadgen")  # the exporter's target label values
CONTENDED_SHARE = 0.10  # others taking this share of the exporter's core make the latencies suspect
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;"
                     "version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")

# vLLM V1 families per engine (vllm/v1/metrics/loggers.py PrometheusStatLogger): name, HELP, buckets
GAUGES = (
    ("vllm:num_requests_running", "Number of requests in model execution batches."),
    ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
    ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
)
COUNTERS = (
    ("vllm:num_preemptions", "Cumulative number of preemption from the engine."),
    ("vllm:prompt_tokens", "Number of prefill tokens processed."),
    ("vllm:generation_tokens", "Number of generation tokens processed."),
    ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
    ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
)
TOKEN_BUCKETS = build_1_2_5_buckets(MAX_MODEL_LEN)
HISTOGRAMS = (
    ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION_TOKEN_BUCKETS),
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS),
    ("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.",
     ITL_BUCKETS),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
     REQUEST_LATENCY_BUCKETS),
    ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
     REQUEST_LATENCY_BUCKETS),
    ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
     REQUEST_LATENCY_BUCKETS),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
     REQUEST_LATENCY_BUCKETS),
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKEN_BUCKETS),
    ("vllm:request_generation_tokens", "Number of generation tokens processed.", TOKEN_BUCKETS),
    ("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.",
     TOKEN_BUCKETS),
    ("vllm:request_params_n", "Histogram of the n request parameter.", (1, 2, 5, 10, 20)),
    ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", TOKEN_BUCKETS),
)
CACHE_CONFIG = {"block_size": "16", "cache_dtype": "auto", "calculate_kv_scales": "False", "cpu_offload_gb": "0",
                "enable_prefix_caching": "True", "gpu_memory_utilization": "0.9", "is_attention_free": "False",
                "num_cpu_blocks": "2048", "num_gpu_blocks": "27876", "num_gpu_blocks_override": "None",
                "prefix_caching_hash_algo": "sha256", "sliding_window": "None", "swap_space": "4",
                "swap_space_bytes": "4294967296"}
HANDLERS = ("/v1/completions", "/v1/chat/completions", "/metrics", "/health", "/v1/models")


# ----- the upstream expositions -----------------------------------------------------------------------------


def _observe_latencies(histogram, buckets: tuple, rng: np.random.Generator, count: int) -> None:
    top = float(buckets[-1])
    for value in rng.lognormal(np.log(top / 200), 1.2, count):
        histogram.observe(float(min(value, top * 2)))


def _add_engine(metrics: dict, engine: str, rng: np.random.Generator) -> None:
    labels = {"model_name": MODEL, "engine": engine}
    for name, _ in GAUGES:
        metrics[name].labels(**labels).set(float(rng.integers(0, 64)))
    for name, _ in COUNTERS:
        metrics[name].labels(**labels).inc(float(rng.integers(0, 10**7)))
    for reason in ("stop", "length", "abort"):
        metrics["vllm:request_success"].labels(finished_reason=reason, **labels).inc(float(rng.integers(0, 10**4)))
    for name, _, buckets in HISTOGRAMS:
        _observe_latencies(metrics[name].labels(**labels), buckets, rng, 40)
    metrics["vllm:cache_config_info"].labels(**CACHE_CONFIG, engine=engine).set(1.0)


def _http_families(registry: CollectorRegistry, rng: np.random.Generator) -> None:
    """prometheus_fastapi_instrumentator's families, which vLLM's /metrics carries and the exporter drops."""
    requests_total = Counter("http_requests", "Total number of requests by method, status and handler.",
                             ["method", "status", "handler"], registry=registry)
    sizes = [Summary(f"http_{kind}_size_bytes", f"Content length of incoming {kind}s by handler.", ["handler"],
                     registry=registry) for kind in ("request", "response")]
    duration = Histogram("http_request_duration_seconds", "Latency with only few buckets by handler.",
                         ["method", "handler"], buckets=(0.1, 0.5, 1.0), registry=registry)
    highr = Histogram("http_request_duration_highr_seconds", "Latency with many buckets but no API specific labels.",
                      buckets=tuple(round(0.01 * 1.5**i, 4) for i in range(27)), registry=registry)
    for handler in HANDLERS:
        method = "POST" if handler.endswith("completions") else "GET"
        requests_total.labels(method, "2xx", handler).inc(float(rng.integers(1, 10**5)))
        for size in sizes:
            size.labels(handler).observe(float(rng.integers(10, 10**4)))
        duration.labels(method, handler).observe(float(rng.exponential(0.3)))
        highr.observe(float(rng.exponential(0.3)))


def render_vllm(engines: int, seed: int = 1) -> bytes:
    """vLLM's /metrics text with ``engines`` data-parallel engines, as vLLM renders it (prometheus_client)."""
    rng = np.random.default_rng(seed)
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    _http_families(registry, rng)
    labels = ["model_name", "engine"]
    metrics: dict = {name: Gauge(name, text, labels, registry=registry) for name, text in GAUGES}
    metrics |= {name: Counter(name, text, labels, registry=registry) for name, text in COUNTERS}
    metrics["vllm:request_success"] = Counter("vllm:request_success", "Count of successfully processed requests.",
                                              ["finished_reason", *labels], registry=registry)
    metrics |= {name: Histogram(name, text, labels, buckets=buckets, registry=registry)
                for name, text, buckets in HISTOGRAMS}
    metrics["vllm:cache_config_info"] = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                              [*CACHE_CONFIG, "engine"], registry=registry)
    for engine in range(engines):
        _add_engine(metrics, str(engine), rng)
    return generate_latest(registry)


def sample_lines(text: bytes, prefix: str = "") -> int:
    """Series in an exposition: sample lines (not comments, not blank) whose name starts with ``prefix``."""
    needle = prefix.encode()
    return sum(1 for line in text.splitlines() if line and not line.startswith(b"#") and line.startswith(needle))


def vllm_exposition(target_series: int) -> tuple[bytes, int]:
    """(text, engines): the engine count whose exposition comes closest to ``target_series`` sample lines."""
    one, two = sample_lines(render_vllm(1)), sample_lines(render_vllm(2))
    per_engine = two - one
    engines = min(max(1, round(1 + (target_series - one) / per_engine)), MAX_ENGINES)
    return render_vllm(engines), engines


def synthetic_records(count: int, seed: int = 2) -> list[RequestRecord]:
    """Finished requests with plausible timings (a few failures), as the load generator records them."""
    rnd = random.Random(seed)
    outcomes = ["ok"] * 96 + ["http_error", "timeout", "truncated", "connection_error"]
    records = []
    start = time.time() - 600
    for index in range(count):
        scheduled = start + index * 0.2
        sent = scheduled + rnd.expovariate(2000)
        ttft = rnd.lognormvariate(-2.5, 0.6)
        gaps = [rnd.lognormvariate(-4.0, 0.4) for _ in range(rnd.randint(20, 60))]
        e2e = ttft + sum(gaps)
        records.append(RequestRecord(
            request_id=f"r{index}", worker=index % 2, scheduled_s=scheduled, sent_s=sent,
            first_token_s=scheduled + ttft, last_token_s=scheduled + e2e, end_s=scheduled + e2e, ttft_s=ttft,
            tpot_s=sum(gaps) / len(gaps), e2e_s=e2e, itl_s=gaps, prompt_tokens=rnd.randint(200, 2000),
            output_tokens=len(gaps) + 1, outcome=rnd.choice(outcomes), status=200))
    return records


def client_exposition(records: int) -> bytes:
    """The load generator master's /metrics over ``records`` finished requests."""
    stats = ClientStats()
    for record in synthetic_records(records):
        stats.observe(record)
    stats.started = records + 12
    spec = {"mode": "poisson", "rate_rps": "5", "prompt_tokens": "1000", "output_tokens": "40", "duration_s": "600"}
    collector = ClientMetricsCollector(stats, lambda: 12, "bench-exporter-scrape", "chat-1k", lambda: spec,
                                       lambda: None)
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry)


def vllm_json_routes() -> dict[str, bytes]:
    card = {"id": MODEL, "object": "model", "created": int(time.time()), "owned_by": "vllm", "root": MODEL,
            "parent": None, "max_model_len": MAX_MODEL_LEN, "permission": []}
    return {"/v1/models": json.dumps({"object": "list", "data": [card]}).encode(),
            "/version": json.dumps({"version": VLLM_VERSION}).encode()}


# ----- stub servers ------------------------------------------------------------------------------------------


class StaticHandler(BaseHTTPRequestHandler):
    """Answers GET with the server's static bytes for the path (keep-alive and TCP_NODELAY, as uvicorn does)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else each small body waits ~40 ms for the delayed ACK of its headers

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        body = self.server.routes.get(self.path.split("?")[0])  # type: ignore[attr-defined]
        status = 200 if body is not None else 404
        body = body if body is not None else b"not found\n"
        kind = "application/json" if body.startswith(b"{") else "text/plain; version=0.0.4; charset=utf-8"
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args) -> None:
        pass


def start_stub(routes: dict[str, bytes]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), StaticHandler)
    server.daemon_threads = True
    server.routes = routes  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, name="stub", daemon=True).start()
    return server


def base_url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


# ----- the exporter process ----------------------------------------------------------------------------------


def start_exporter(vllm_url: str, loadgen_url: str, port: int, log_path: Path) -> subprocess.Popen:
    env = {key: value for key, value in os.environ.items() if not key.startswith("BATCHSCOPE_")}
    args = [sys.executable, "-m", "batchscope.cli", "exporter", "--vllm-url", vllm_url, "--loadgen-url",
            loadgen_url, "--host", "127.0.0.1", "--port", str(port)]
    with open(log_path, "wb") as log:
        return subprocess.Popen(args, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, preexec_fn=pinned_to(EXPORTER_CORE))


def scrape(port: int) -> tuple[float, bytes]:
    """One scrape as Prometheus does it (new connection, its Accept header): (wall seconds, body)."""
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=SCRAPE_TIMEOUT_S)
    try:
        connection.request("GET", "/metrics", headers={"Accept": PROMETHEUS_ACCEPT})
        reply = connection.getresponse()
        body = reply.read()
    finally:
        connection.close()
    elapsed = time.perf_counter() - started
    if reply.status != 200:
        raise SetupError(f"exporter answered {reply.status}: {body[:200]!r}")
    return elapsed, body


def wait_ready(proc: subprocess.Popen, port: int, log_path: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SetupError(f"exporter exited early (status {proc.returncode}):\n{log_tail(log_path)}")
        with contextlib.suppress(OSError, http.client.HTTPException):
            scrape(port)
            return
        time.sleep(POLL_S)
    raise SetupError(f"exporter did not answer within {STARTUP_TIMEOUT_S:.0f} s:\n{log_tail(log_path)}")


# ----- measuring ---------------------------------------------------------------------------------------------


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
    expected_vllm, got_vllm = sample_lines(vllm_text, "vllm:"), sample_lines(body, "vllm:")
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
    latencies, upstream, rss, body = [], {target: [] for target in TARGETS}, 0.0, b""
    cores = (EXPORTER_CORE, BENCH_CORE)
    busy_before = core_busy_seconds()
    cpu_before, bench_before, started = proc_cpu_seconds(pid), proc_cpu_seconds(os.getpid()), time.monotonic()
    for _ in range(scrapes):
        elapsed, body = scrape(port)
        latencies.append(elapsed)
        for target, seconds in target_values(body, "batchscope_scrape_duration_seconds").items():
            upstream[target].append(seconds)
        rss = max(rss, proc_status_mb(pid, "VmRSS"))
    exporter_cpu, bench_cpu, busy = proc_cpu_seconds(pid), proc_cpu_seconds(os.getpid()), core_busy_seconds()
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
        vllm_series=sample_lines(vllm_text), vllm_prefixed_series=sample_lines(vllm_text, "vllm:"), engines=engines,
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
        proc = start_exporter(base_url(vllm_stub), base_url(loadgen_stub), port, log_path)
        try:
            wait_ready(proc, port, log_path)
            body = scrape(port)[1]
            if problems := check_output(body, vllm_text, client_text):
                raise SetupError("exporter output is wrong: " + "; ".join(problems))
            sanity = (f"{sample_lines(body, 'vllm:')} of {sample_lines(vllm_text, 'vllm:')} vllm:* series and all "
                      f"{len(series_keys(client_text, 'batchscope_client_'))} client series exposed, "
                      f"batchscope_up vllm=1 loadgen=1")
            window = measure(port, proc.pid, args.scrapes, args.warmup)
            hwm = proc_status_mb(proc.pid, "VmHWM")
        finally:
            stop_process(proc, STOP_TIMEOUT_S)
            vllm_stub.shutdown()
            loadgen_stub.shutdown()
    return summarize(window, hwm, vllm_text, client_text, engines, sanity, started)


# ----- report ------------------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def contention(share: float) -> str:
    return "contended: latencies inflated" if share >= CONTENDED_SHARE else ""


def report(result: Result) -> str:
    r = result
    rows = [
        ("scrape latency p50 (ms)", f"{r.p50_ms:.1f}", ""),
        ("scrape latency p99 (ms)", f"{r.p99_ms:.1f}", f"{verdict(r.p99_ok)} (target <= {MAX_P99_MS:.0f} ms)"),
        ("scrape latency max (ms)", f"{r.max_ms:.1f}", ""),
        ("exporter CPU per scrape (ms)", f"{r.cpu_ms_per_scrape:.1f}", "all threads"),
        ("vLLM fetch + parse, p50 (ms)", f"{r.upstream_vllm_p50_ms:.1f}", "exporter's own scrape_duration, wall"),
        ("loadgen fetch + parse, p50 (ms)", f"{r.upstream_loadgen_p50_ms:.1f}",
         "exporter's own scrape_duration, wall"),
        ("exporter VmRSS, max sampled (MB)", f"{r.rss_mb:.1f}", f"{verdict(r.rss_ok)} (target <= {MAX_RSS_MB:.0f} MB)"),
        ("exporter VmHWM (MB)", f"{r.hwm_mb:.1f}", ""),
        (f"other load on core {EXPORTER_CORE} (exporter)", f"{r.other_load_exporter_core:.0%}",
         contention(r.other_load_exporter_core)),
        (f"other load on core {BENCH_CORE} (bench)", f"{r.other_load_bench_core:.0%}",
         contention(r.other_load_bench_core)),
    ]
    width = max(len(name) for name, _, _ in rows)
    value_width = max(len(value) for _, value, _ in rows)
    lines = [
        f"batchscope exporter scrape benchmark: exporter alone on core {EXPORTER_CORE}, bench + stubs on core "
        f"{BENCH_CORE}",
        f"  vLLM stub      {r.vllm_series} series ({r.vllm_prefixed_series} vllm:*, {r.engines} DP engines), "
        f"{r.vllm_kb:.0f} KB",
        f"  loadgen stub   {r.client_series} series",
        f"  exporter       {r.exporter_series} series, {r.exporter_kb:.0f} KB per scrape; {r.scrapes} timed scrapes",
        f"  sanity         {r.sanity}",
        "",
    ]
    lines += [f"  {name:<{width}}  {value:>{value_width}}  {note}".rstrip() for name, value, note in rows]
    lines += ["", f"  bench duration {r.duration_s:.1f} s"]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argument_parser(__doc__)
    parser.add_argument("--scrapes", type=int, default=300, help="timed scrapes (default 300)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed scrapes first (default 10)")
    parser.add_argument("--series", type=int, default=2000, help="sample lines of the vLLM stub (default 2000)")
    parser.add_argument("--records", type=int, default=3000, help="requests behind the client histograms")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.scrapes < 1 or args.warmup < 0 or args.series < 1 or args.records < 1:
        parser.error("--scrapes, --series and --records must be positive, --warmup not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cores = os.sched_getaffinity(0)
    if not {EXPORTER_CORE, BENCH_CORE} <= cores:
        print(f"exporter_scrape: needs cores {EXPORTER_CORE} and {BENCH_CORE}, have {sorted(cores)}",
              file=sys.stderr)
        return 2
    os.sched_setaffinity(0, {BENCH_CORE})
    try:
        result = run(args)
    except (SetupError, OSError, http.client.HTTPException) as exc:
        print(f"exporter_scrape: setup failed: {exc}", file=sys.stderr)
        return 1
    print(report(result))
    if args.json:
        figures = asdict(result) | {"p99_pass": result.p99_ok, "rss_pass": result.rss_ok,
                                    "targets": {"p99_ms": MAX_P99_MS, "rss_mb": MAX_RSS_MB}}
        write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
