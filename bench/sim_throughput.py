"""Simulator throughput benchmark: how much streaming one core of the real-time simulator sustains.

Each run starts a fresh `batchscope sim serve` pinned alone to core 0 and drives it from this process, pinned
to core 1, with a closed loop of streaming /v1/completions requests (a fixed prompt of token ids, ignore_eos;
a new stream starts as soon as one ends, so exactly N are open). After a warm-up, over a measurement window:

- streamed tokens/s, counted by the client from the SSE token events (cross-checked with /sim/stats);
- server and client CPU use (server: /proc utime+stime), and CPU other processes took on either core,
  to tell which side bottlenecks and whether the machine was quiet;
- the real-time loop's step period and step lag (actual wake-up - modelled step end, p50/p99/max from
  /sim/stats, which covers the server's last 100k steps, warm-up included when fewer);
- the server's peak RSS (VmHWM).

Runs: closed loop at 64, 256 and 1024 streams on the tiny profile (the server's capacity; its KV cache, at
--gpu-memory-utilization 1.0, holds only ~600-800 of the 1024 streams at once: the rest wait), then a paced run at
~5,000 tokens/s on h100-llama-3.1-8b: the stream count is first derived from the profile's step-cost model,
then rescaled from the measured rate until it lands within 10%. Last, in-process, the virtual clock's speed
(simulated seconds per wall second) on a Poisson workload that keeps ~240 of max_num_seqs=256 running.

Targets (from the issue): >= 20,000 streamed tokens/s on one core; step-lag p99 <= 5 ms at 5,000 tokens/s;
peak RSS <= 300 MB at 1024 streams; virtual clock >= 100x. The exit status is 0 whatever the figures, and
non-zero only when a server fails to start.

    .venv/bin/python bench/sim_throughput.py [--warmup S] [--duration S] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import BinaryIO

import aiohttp
import numpy as np
import uvloop
from benchlib import (
    REPO,
    add_json_option,
    argument_parser,
    core_busy_seconds,
    pinned_to,
    proc_cpu_seconds,
    proc_status_mb,
    sim_serve_command,
    sim_server_url,
    stop_process,
    table,
    targets_table,
    write_json,
)

from simulator.config import Deployment, ServeConfig
from simulator.cost import StepCostModel
from simulator.profile import load_profile
from simulator.virtual import poisson_workload, run_virtual

SERVER_CORE, CLIENT_CORE = 0, 1
TOKEN_EVENT = b"data: {"  # one per token; no usage chunk is asked for
STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
STATS_TIMEOUT_S = 15.0
ERROR_PAUSE_S = 0.1
JSON_HEADERS = {"Content-Type": "application/json"}
BUSY_CPU = 0.90  # a side using this share of its core or more is the bottleneck
CONTENDED_CPU = 0.10  # other processes taking this share of a bench core make its figures suspect
LAGGING = 0.20  # a median step lag of this share of the step period or more is what holds the rate back

CLOSED_LOOP_STREAMS = (64, 256, 1024)
PACED_PROFILE = "h100-llama-3.1-8b"
PACED_TOKENS_PER_S = 5_000
PACED_TOLERANCE = 0.10
PACED_ATTEMPTS = 3

MIN_TOKENS_PER_S = 20_000
MAX_PACED_LAG_P99_MS = 5.0
MAX_RSS_MB = 300
MIN_VIRTUAL_SPEEDUP = 100


class ServerStartError(RuntimeError):
    """The simulator did not come up (exited, or never logged its port)."""


@dataclass(frozen=True)
class RunSpec:
    """One server configuration and the closed-loop load put on it."""

    label: str
    profile: str
    streams: int
    prompt_len: int
    max_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float


@dataclass(frozen=True)
class RunResult:
    """What one run measured over its window (rates per wall second, CPU as a share of one core)."""

    spec: RunSpec
    window_s: float
    tokens_per_s: float
    server_tokens_per_s: float
    server_cpu: float
    client_cpu: float
    server_core_other: float  # CPU other processes (and hypervisor steal) took on the server's core
    client_core_other: float
    steps_in_window: int
    lag_p50_ms: float
    lag_p99_ms: float
    lag_max_ms: float
    running: int
    waiting: int
    stream_errors: int
    peak_rss_mb: float

    @property
    def step_ms(self) -> float:
        """Mean wall time between two engine steps over the window."""
        return self.window_s / max(self.steps_in_window, 1) * 1e3

    @property
    def lag_share(self) -> float:
        """Median step lag as a share of the step period: roughly the rate lost to waking late."""
        return self.lag_p50_ms / self.step_ms

    @property
    def bottleneck(self) -> str:
        if self.client_cpu >= BUSY_CPU:
            return "client CPU"
        if self.server_cpu >= BUSY_CPU:
            return "server CPU"
        if self.server_cpu + self.server_core_other >= BUSY_CPU:
            return "core 0 shared"
        if self.lag_share >= LAGGING:
            return "step lag"
        return "modelled steps"


@dataclass(frozen=True)
class VirtualResult:
    """The virtual clock on one workload."""

    workload: str
    requests: int
    steps: int
    simulated_s: float
    wall_s: float
    mean_running: float

    @property
    def speedup(self) -> float:
        return self.simulated_s / self.wall_s


# ----- the server process ------------------------------------------------------------------------------


class Server:
    """A `batchscope sim serve` child pinned to SERVER_CORE, logging to ``log``."""

    def __init__(self, spec: RunSpec, log: BinaryIO) -> None:
        self._log = log
        args = sim_serve_command(
            "--profile", spec.profile,
            "--max-num-seqs", str(spec.max_num_seqs),
            "--max-num-batched-tokens", str(spec.max_num_batched_tokens),
            "--gpu-memory-utilization", str(spec.gpu_memory_utilization),
            "--max-model-len", str(spec.prompt_len + spec.max_tokens),
        )
        self.proc = subprocess.Popen(args, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=log, preexec_fn=pinned_to(SERVER_CORE))
        self.url = ""

    def wait_for_port(self) -> None:
        """Poll the log for the start-up line naming the port, until STARTUP_TIMEOUT_S."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            url = sim_server_url(self._read_log())
            if url:
                self.url = url
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        tail = self._read_log()[-2000:].decode(errors="replace")
        raise ServerStartError(f"simulator did not start (exit status {self.proc.poll()}):\n{tail}")

    def _read_log(self) -> bytes:
        self._log.seek(0)
        return self._log.read()

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.proc.pid)

    def peak_rss_mb(self) -> float:
        return proc_status_mb(self.proc.pid, "VmHWM")

    def stop(self) -> None:
        stop_process(self.proc, STOP_TIMEOUT_S)


@contextmanager
def serving(spec: RunSpec) -> Iterator[Server]:
    """A started server for the duration of the block; always stopped after it."""
    with tempfile.TemporaryFile() as log:
        server = Server(spec, log)
        try:
            server.wait_for_port()
            yield server
        finally:
            server.stop()


# ----- the closed-loop client --------------------------------------------------------------------------


class StreamLoad:
    """Workers each streaming one completion after another, counting token events as they arrive."""

    def __init__(self, session: aiohttp.ClientSession, url: str, spec: RunSpec) -> None:
        self._session = session
        self._url = url + "/v1/completions"
        prompt = [1000 + i for i in range(spec.prompt_len)]
        self._body = json.dumps({"prompt": prompt, "max_tokens": spec.max_tokens, "ignore_eos": True,
                                 "stream": True}).encode()
        self.tokens = 0
        self.errors = 0

    async def worker(self) -> None:
        """Runs until cancelled; a failed request is counted and retried after ERROR_PAUSE_S."""
        while True:
            try:
                await self._stream()
            except (aiohttp.ClientError, TimeoutError):
                self.errors += 1
                await asyncio.sleep(ERROR_PAUSE_S)

    async def _stream(self) -> None:
        keep = len(TOKEN_EVENT) - 1  # a marker split across chunks is counted once, in the later one
        async with self._session.post(self._url, data=self._body, headers=JSON_HEADERS) as resp:
            resp.raise_for_status()
            tail = b""
            async for chunk in resp.content.iter_any():
                data = tail + chunk
                self.tokens += data.count(TOKEN_EVENT)
                tail = data[-keep:]


@dataclass(frozen=True)
class Snapshot:
    """Counters on both sides at one instant."""

    wall: float
    client_tokens: int
    client_cpu: float
    server_cpu: float
    cores: dict[int, float]
    stats: dict


async def snapshot(session: aiohttp.ClientSession, server: Server, load: StreamLoad) -> Snapshot:
    wall, tokens, client_cpu, server_cpu = time.perf_counter(), load.tokens, time.process_time(), server.cpu_seconds()
    cores = core_busy_seconds()
    async with session.get(server.url + "/sim/stats", timeout=aiohttp.ClientTimeout(total=STATS_TIMEOUT_S)) as resp:
        resp.raise_for_status()
        stats = await resp.json()
    return Snapshot(wall, tokens, client_cpu, server_cpu, cores, stats)


async def measure(server: Server, spec: RunSpec, warmup_s: float, duration_s: float) -> RunResult:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=STATS_TIMEOUT_S, sock_read=STATS_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        load = StreamLoad(session, server.url, spec)
        workers = [asyncio.create_task(load.worker()) for _ in range(spec.streams)]
        try:
            await asyncio.sleep(warmup_s)
            before = await snapshot(session, server, load)
            await asyncio.sleep(duration_s)
            after = await snapshot(session, server, load)
        finally:
            for task in workers:
                task.cancel()
            outcomes = await asyncio.gather(*workers, return_exceptions=True)
    failures = [o for o in outcomes if not isinstance(o, asyncio.CancelledError)]
    if failures:  # anything but a request error is a bug of the benchmark
        raise RuntimeError(f"{len(failures)} stream workers crashed, first: {failures[0]!r}")
    return result_of(spec, before, after, load.errors, server.peak_rss_mb())


def result_of(spec: RunSpec, before: Snapshot, after: Snapshot, errors: int, peak_rss_mb: float) -> RunResult:
    window = after.wall - before.wall
    server_cpu = (after.server_cpu - before.server_cpu) / window
    client_cpu = (after.client_cpu - before.client_cpu) / window
    core_busy = {core: (after.cores[core] - before.cores[core]) / window for core in (SERVER_CORE, CLIENT_CORE)}
    lag = after.stats["step_lag_seconds"]
    return RunResult(
        spec=spec,
        window_s=window,
        tokens_per_s=(after.client_tokens - before.client_tokens) / window,
        server_tokens_per_s=(after.stats["tokens"] - before.stats["tokens"]) / window,
        server_cpu=server_cpu,
        client_cpu=client_cpu,
        server_core_other=max(core_busy[SERVER_CORE] - server_cpu, 0.0),
        client_core_other=max(core_busy[CLIENT_CORE] - client_cpu, 0.0),
        steps_in_window=after.stats["steps"] - before.stats["steps"],
        lag_p50_ms=lag["p50"] * 1e3,
        lag_p99_ms=lag["p99"] * 1e3,
        lag_max_ms=lag["max"] * 1e3,
        running=after.stats["num_requests_running"],
        waiting=after.stats["num_requests_waiting"],
        stream_errors=errors,
        peak_rss_mb=peak_rss_mb,
    )


def run(spec: RunSpec, warmup_s: float, duration_s: float) -> RunResult:
    print(f"{spec.label}: {spec.streams} streams on {spec.profile} ...", file=sys.stderr, flush=True)
    budget = warmup_s + duration_s + 2 * STATS_TIMEOUT_S + STOP_TIMEOUT_S
    with serving(spec) as server:
        return uvloop.run(asyncio.wait_for(measure(server, spec, warmup_s, duration_s), budget))


# ----- the runs ----------------------------------------------------------------------------------------


def closed_loop_specs(prompt_len: int, max_tokens: int) -> list[RunSpec]:
    return [RunSpec(f"closed loop {n}", "tiny", n, prompt_len, max_tokens, max_num_seqs=1024,
                    max_num_batched_tokens=8192, gpu_memory_utilization=1.0) for n in CLOSED_LOOP_STREAMS]


def modelled_streams(tokens_per_s: float, prompt_len: int, max_tokens: int) -> int:
    """The stream count whose decode steps, priced by the paced profile's cost model, stream tokens_per_s."""
    cost = StepCostModel(load_profile(PACED_PROFILE))
    context = prompt_len + max_tokens / 2  # a stream's mean context over its life
    counts = np.arange(1, 1025)
    rates = [n / cost.step_seconds(np.ones(n), np.full(n, context)) for n in counts]
    return int(counts[np.argmin(np.abs(np.array(rates) - tokens_per_s))])


def paced_run(prompt_len: int, max_tokens: int, warmup_s: float, duration_s: float) -> list[RunResult]:
    """Runs at ~PACED_TOKENS_PER_S, rescaling the stream count from each measured rate; the last one counts."""
    streams = modelled_streams(PACED_TOKENS_PER_S, prompt_len, max_tokens)
    attempts: list[RunResult] = []
    for _ in range(PACED_ATTEMPTS):
        spec = RunSpec(f"paced ~{PACED_TOKENS_PER_S:,} tok/s", PACED_PROFILE, streams, prompt_len, max_tokens,
                       max_num_seqs=256, max_num_batched_tokens=8192, gpu_memory_utilization=0.92)
        attempts.append(run(spec, warmup_s, duration_s))
        rate = attempts[-1].tokens_per_s
        if abs(rate / PACED_TOKENS_PER_S - 1) <= PACED_TOLERANCE or rate <= 0:
            break
        streams = max(1, round(streams * PACED_TOKENS_PER_S / rate))
    return attempts


def virtual_clock() -> VirtualResult:
    config = ServeConfig(model="m", profile="h100-llama-3.1-8b", max_model_len=8192, max_num_seqs=256)
    engine = Deployment(config).new_engine()
    workload = poisson_workload(rate=12, count=3000, prompt_len=1000, max_tokens=1000, seed=1)
    start = time.perf_counter()
    result = run_virtual(engine, workload)
    wall = time.perf_counter() - start
    return VirtualResult("Poisson 12 req/s x 3000 requests of 1000+1000 tokens, h100-llama-3.1-8b, max_num_seqs "
                         "256", len(result.records), result.steps, result.duration, wall, result.mean_running)


# ----- report ------------------------------------------------------------------------------------------


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argument_parser(__doc__)
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load before each window")
    parser.add_argument("--duration", type=float, default=10.0, help="measurement window of each run, seconds")
    parser.add_argument("--prompt-len", type=int, default=128, help="prompt token ids per stream")
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens streamed per request")
    add_json_option(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.sched_setaffinity(0, {CLIENT_CORE})
    started = time.perf_counter()
    try:
        closed = [run(spec, args.warmup, args.duration) for spec in closed_loop_specs(args.prompt_len,
                                                                                       args.max_tokens)]
        paced = paced_run(args.prompt_len, args.max_tokens, args.warmup, args.duration)
    except ServerStartError as exc:
        print(exc, file=sys.stderr)
        return 1
    virtual = virtual_clock()
    print(report(closed, paced, virtual, args))
    print(f"\nTook {time.perf_counter() - started:.0f} s.")
    if args.json:
        write_json(args.json, to_json(closed, paced, virtual))
    return 0


if __name__ == "__main__":
    sys.exit(main())
