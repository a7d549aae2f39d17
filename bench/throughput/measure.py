"""One run of the throughput bench: a fresh simulator pinned to SERVER_CORE (the testkit launcher), a closed loop
of reference clients on this process's core, and the counters of both sides at a window's edges."""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import uvloop

from batchscope.testkit.procfs import core_busy_seconds, status_mb
from batchscope.testkit.reference_client import EVENT, ReferenceClient
from batchscope.testkit.simulator import SimProcess, start_simulator
from throughput.results import RunResult, RunSpec
from throughput.settings import (
    CLIENT_CORE,
    ERROR_PAUSE_S,
    SERVER_CORE,
    STARTUP_TIMEOUT_S,
    STATS_TIMEOUT_S,
    STOP_TIMEOUT_S,
)


@contextmanager
def serving(spec: RunSpec) -> Iterator[SimProcess]:
    """A started server for the duration of the block; always stopped after it."""
    flags = ("--profile", spec.profile, "--max-num-seqs", str(spec.max_num_seqs),
             "--max-num-batched-tokens", str(spec.max_num_batched_tokens),
             "--gpu-memory-utilization", str(spec.gpu_memory_utilization),
             "--max-model-len", str(spec.prompt_len + spec.max_tokens))
    with tempfile.TemporaryDirectory(prefix="sim_throughput-") as workdir:
        server = start_simulator(Path(workdir), *flags, model="bench-model", deadline_s=STARTUP_TIMEOUT_S,
                                 core=SERVER_CORE, log_name="simulator.log")
        try:
            yield server
        finally:
            server.stop(STOP_TIMEOUT_S)


def request_body(spec: RunSpec) -> bytes:
    """A fixed prompt of token ids, streamed to max_tokens; no usage chunk, so one SSE event per token."""
    prompt = [1000 + i for i in range(spec.prompt_len)]
    return json.dumps({"prompt": prompt, "max_tokens": spec.max_tokens, "ignore_eos": True, "stream": True}).encode()


@dataclass(frozen=True)
class Snapshot:
    """Counters on both sides at one instant."""

    wall: float
    client_tokens: int
    client_cpu: float
    server_cpu: float
    cores: dict[int, float]
    stats: dict


async def snapshot(session: aiohttp.ClientSession, server: SimProcess, load: ReferenceClient) -> Snapshot:
    wall, tokens, client_cpu, server_cpu = time.perf_counter(), load.tokens, time.process_time(), server.cpu_seconds()
    cores = core_busy_seconds()
    async with session.get(server.url + "/sim/stats", timeout=aiohttp.ClientTimeout(total=STATS_TIMEOUT_S)) as resp:
        resp.raise_for_status()
        stats = await resp.json()
    return Snapshot(wall, tokens, client_cpu, server_cpu, cores, stats)


async def measure(server: SimProcess, spec: RunSpec, warmup_s: float, duration_s: float) -> RunResult:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=STATS_TIMEOUT_S, sock_read=STATS_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        # each worker streams one completion after another; a failed one is counted and retried after a pause
        load = ReferenceClient(session, server.url + "/v1/completions", request_body(spec), marker=EVENT,
                               error_pause_s=ERROR_PAUSE_S)
        workers = [asyncio.create_task(load.user(i)) for i in range(spec.streams)]
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
    return result_of(spec, before, after, load.errors, status_mb(server.process.pid, "VmHWM"))


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
