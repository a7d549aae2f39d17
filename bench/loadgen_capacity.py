"""Load generator capacity benchmark: what one `batchscope load` worker process sustains, and how exactly it times.

One `batchscope sim serve` (tiny profile, max_num_seqs 1024, max_num_batched_tokens 8192, a ground-truth log)
runs alone on core 0 for the whole benchmark; every client runs on core 1, one at a time, against it:

1. Capacity at N = 256 closed-loop streams (`--streams`), after a warm-up, over a window (`--duration`),
   twice for each client, alternating (`--repeat`), figures pooled over the runs:
   - a minimal asyncio + aiohttp streaming client (this file, run as a child process so that its CPU is its
     own) sending the load generator's exact request body (token-id prompt, max_tokens, ignore_eos, stream,
     stream_options.include_usage) and counting token events cheaply;
   - `batchscope load --workers 0` (Locust's local runner: one process).
   For each: streamed tokens/s as the client received them (the reference's own count; for the load generator
   the token chunk times in records.jsonl, beside summary.json's output_tokens_per_s and the server's
   /sim/stats count), the client's CPU from /proc (its whole process tree), hence tokens per CPU-second, i.e.
   per core, and the server's CPU and step time, to tell which side set the rate.
   Target: the load generator's tokens per core >= 70% of the reference's.
2. Bias against the ground truth, from the same runs: records joined with the server's log by request id;
   TTFT bias = client (first token - send) - server (first token - arrival), E2E bias likewise, split into
   send -> arrival and server first write -> client first read. Target: TTFT bias p99 <= 2 ms at 256 streams.
   The reference's bias is the floor any client pays on this machine. Both clients start their closed-loop
   users evenly over `--ramp-s` (about one request's duration; the load generator's `ramp_up_s`): started at
   once, a closed loop with a fixed output length runs in lockstep (all streams end and restart together),
   and each TTFT is then taken in a burst of N sends that the server itself queues (`--ramp-s 0` shows it).
   A second pair of runs at the same request rate with Poisson arrivals shows the bias of an open loop
   (`--no-poisson` skips them).
3. Memory: `batchscope load` with 1,000 closed-loop streams of long outputs; the Locust process's VmRSS is
   sampled while all 1,000 are in flight (client /metrics and the server's running + waiting both say so),
   and its VmHWM read at the end. Target: <= 250 MB. The RSS growth per streamed token over the capacity
   window is reported too.

When neither client saturates core 1 (here the simulator's step pacing, or a saturated core 0, sets the rate),
the ratio compares CPU per token at the same delivered rate rather than two saturated capacities; the report
says which side bound each run, and how much CPU other processes took on either core.

The exit status is 0 whatever the figures, non-zero only when a process fails to start, ramp up or finish.

    .venv/bin/python bench/loadgen_capacity.py [--streams N] [--warmup S] [--duration S] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import aiohttp
import numpy as np
import requests
import yaml
from benchlib import (
    CLK_TCK,
    REPO,
    SetupError,
    add_json_option,
    argument_parser,
    core_busy_seconds,
    free_port,
    log_tail,
    pinned_to,
    proc_cpu_ticks,
    proc_stat_fields,
    proc_status_mb,
    sim_serve_command,
    sim_server_url,
    table,
    targets_table,
    write_json,
)

sys.path.insert(0, str(REPO))  # run as a script: the project's packages come from the checkout

SERVER_CORE, CLIENT_CORE = 0, 1
TOKEN_MARKER = b'"text":"'  # once per token event of a completions stream; the usage chunk has none
POLL_S = 0.05
HTTP_TIMEOUT_S = 5.0
STARTUP_TIMEOUT_S = 40.0
RAMP_TIMEOUT_S = 40.0
STOP_TIMEOUT_S = 15.0
DRAIN_TIMEOUT_S = 20.0
LOCUST_FINAL_S = 35.0  # the load generator waits up to 30 s for its senders' last reports
BUSY_CPU = 0.90  # a process using this share of its core or more is the bottleneck
CONTENDED_CPU = 0.10  # other processes taking this share of a bench core make the absolute rates suspect

SERVER_FLAGS = ("--profile", "tiny", "--max-num-seqs", "1024", "--max-num-batched-tokens", "8192",
                "--gpu-memory-utilization", "0.98")
MIN_RATIO = 0.70
MAX_TTFT_BIAS_P99_MS = 2.0
MAX_RSS_MB = 250.0


# ----- processes -----------------------------------------------------------------------------------------


def group_members(pgid: int) -> list[int]:
    """Live processes of one process group (our children run in their own sessions)."""
    members = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                fields = proc_stat_fields(int(entry.name))
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the given processes (those that exited meanwhile count as 0)."""
    ticks = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            ticks += proc_cpu_ticks(pid)
    return ticks / CLK_TCK


class Child:
    """A child process in a session of its own, pinned to one core; its whole tree is stopped with it."""

    def __init__(self, name: str, args: list[str], core: int, log_path: Path, pipe_stdout: bool = False) -> None:
        self.name = name
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                args, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if pipe_stdout else log,
                stderr=log, start_new_session=True, preexec_fn=pinned_to(core))
        self._buffer = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def members(self) -> list[int]:
        return group_members(self.proc.pid)

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.members())

    def log_tail(self, size: int = 3000) -> str:
        return log_tail(self.log_path, size)

    def check_alive(self) -> None:
        if not self.alive():
            raise SetupError(f"{self.name} exited early (status {self.proc.returncode}):\n{self.log_tail()}")

    def read_line(self, deadline: float) -> bytes:
        """The next line the child prints on its piped stdout, waiting at most until ``deadline``."""
        stream = self.proc.stdout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SetupError(f"{self.name} printed nothing in time:\n{self.log_tail()}")
            ready, _, _ = select.select([stream], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(stream.fileno(), 65536)
                if not chunk:
                    raise SetupError(f"{self.name} closed its output (status {self.proc.poll()}):\n"
                                     f"{self.log_tail()}")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def wait(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise SetupError(f"{self.name} did not finish within {timeout_s:.0f} s:\n{self.log_tail()}") from None

    def stop(self) -> None:
        """SIGTERM to every process of the group, SIGKILL to what is left after STOP_TIMEOUT_S."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            members = self.members()
            if not members and not self.alive():
                break
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while (self.alive() or self.members()) and time.monotonic() < deadline:
                time.sleep(POLL_S)
        if self.proc.stdout:
            self.proc.stdout.close()


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str,
               alive: Callable[[], None] = lambda: None) -> object:
    """Poll ``predicate`` until it is truthy; ``alive`` raises when a process we wait on died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        alive()
        time.sleep(POLL_S)
    raise SetupError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def hold(seconds: float, alive: Callable[[], None]) -> None:
    """Let a measurement run for ``seconds`` (a timed window, not synchronisation), checking liveness."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        alive()
        time.sleep(min(left, 0.25))


# ----- the server --------------------------------------------------------------------------------------


class Server:
    """The simulator on SERVER_CORE, with its ground-truth log."""

    def __init__(self, workdir: Path) -> None:
        self.truth_path = workdir / "ground_truth.jsonl"
        args = sim_serve_command(*SERVER_FLAGS, "--ground-truth-log", str(self.truth_path))
        self.child = Child("simulator", args, SERVER_CORE, workdir / "simulator.log")
        self.url = ""

    def wait_ready(self) -> None:
        def up() -> bool:
            url = sim_server_url(self.child.log_path.read_bytes())
            if url is None:
                return False
            self.url = url
            try:
                return requests.get(self.url + "/health", timeout=HTTP_TIMEOUT_S).status_code == 200
            except requests.RequestException:
                return False

        wait_until(up, STARTUP_TIMEOUT_S, "the simulator to serve", self.child.check_alive)

    def stats(self) -> dict:
        reply = requests.get(self.url + "/sim/stats", timeout=HTTP_TIMEOUT_S)
        reply.raise_for_status()
        return reply.json()

    def open_requests(self) -> int:
        stats = self.stats()
        return stats["num_requests_running"] + stats["num_requests_waiting"]

    def wait_idle(self) -> None:
        """Until the previous phase's streams are gone, so phases never overlap."""
        wait_until(lambda: self.open_requests() == 0, DRAIN_TIMEOUT_S, "the server to drain", self.child.check_alive)

    def truth_offset(self) -> int:
        return self.truth_path.stat().st_size if self.truth_path.exists() else 0

    def truth_since(self, offset: int) -> dict[str, dict]:
        """Ground-truth lines written since ``offset``, by request id (completed requests only)."""
        with open(self.truth_path, "rb") as log:
            log.seek(offset)
            lines = log.read().splitlines()
        rows = (json.loads(line) for line in lines if line.endswith(b"}"))
        return {r["request_id"]: r for r in rows if r.get("outcome") == "ok" and r.get("request_id")}


# ----- measurement windows ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    """What a phase sends: a closed loop of ``streams`` users, or Poisson arrivals at ``rate`` per second."""

    streams: int
    rate: float | None = None

    @property
    def label(self) -> str:
        return "closed loop" if self.rate is None else f"Poisson {self.rate:.0f}/s"


@dataclass(frozen=True)
class Snapshot:
    """Counters at one instant of a window."""

    wall: float
    client_cpu_s: float
    server_cpu_s: float
    own_cpu_s: float
    server_tokens: int
    server_steps: int
    server_open: int
    cores: dict[int, float]


def snapshot(server: Server, client: Child) -> Snapshot:
    wall, own = time.time(), time.process_time()
    client_cpu, server_cpu, stats = client.cpu_seconds(), server.child.cpu_seconds(), server.stats()
    return Snapshot(wall, client_cpu, server_cpu, own, stats["tokens"], stats["steps"],
                    stats["num_requests_running"] + stats["num_requests_waiting"], core_busy_seconds())


@dataclass
class Window:
    """One client's figures over its measurement window (rates per wall second, CPU as a share of a core)."""

    client: str
    load: str
    in_flight: float  # closed loop: the streams; Poisson: mean of the server's open requests at the window's edges
    start: float
    seconds: float
    client_tokens: int
    server_tokens: int
    server_steps: int
    client_cpu: float
    server_cpu: float
    core0_other: float
    core1_other: float
    errors: int
    run: str = "1"
    notes: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.client}, {self.load}"

    @property
    def streams_label(self) -> str:
        return f"{self.load}, {self.in_flight:.0f} streams"

    @property
    def end(self) -> float:
        return self.start + self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.client_tokens / self.seconds

    @property
    def server_tokens_per_s(self) -> float:
        return self.server_tokens / self.seconds

    @property
    def tokens_per_cpu_s(self) -> float:
        """Streamed tokens per CPU-second of the client: its rate per core, were it CPU-bound."""
        return self.tokens_per_s / max(self.client_cpu, 1e-9)

    @property
    def step_ms(self) -> float:
        return self.seconds / max(self.server_steps, 1) * 1e3

    @property
    def bound(self) -> str:
        if self.server_cpu >= BUSY_CPU:
            return "server CPU"
        if self.client_cpu >= BUSY_CPU:
            return "client CPU"
        if self.server_cpu + self.core0_other >= BUSY_CPU:
            return "core 0 shared"
        if self.client_cpu + self.core1_other >= BUSY_CPU:
            return "core 1 shared"
        return "server steps"  # the modelled step times (and their lag) set the rate


def window_of(client: str, load: Load, before: Snapshot, after: Snapshot, client_tokens: int,
              errors: int) -> Window:
    seconds = after.wall - before.wall
    client_cpu = (after.client_cpu_s - before.client_cpu_s) / seconds
    server_cpu = (after.server_cpu_s - before.server_cpu_s) / seconds
    own_cpu = (after.own_cpu_s - before.own_cpu_s) / seconds
    busy = {core: (after.cores[core] - before.cores[core]) / seconds for core in (SERVER_CORE, CLIENT_CORE)}
    in_flight = load.streams if load.rate is None else (before.server_open + after.server_open) / 2
    return Window(client, load.label, in_flight, before.wall, seconds,
                  client_tokens, after.server_tokens - before.server_tokens, after.server_steps - before.server_steps,
                  client_cpu, server_cpu, max(busy[SERVER_CORE] - server_cpu, 0.0),
                  max(busy[CLIENT_CORE] - client_cpu - own_cpu, 0.0), errors)


def pooled(windows: list[Window]) -> Window:
    """Several runs of one client as one window: totals over the summed time, CPU shares weighted by time."""
    seconds = sum(w.seconds for w in windows)

    def total(name: str) -> int:
        return sum(getattr(w, name) for w in windows)

    def share(name: str) -> float:
        return sum(getattr(w, name) * w.seconds for w in windows) / seconds

    first = windows[0]
    return Window(first.client, first.load, share("in_flight"), first.start, seconds, total("client_tokens"),
                  total("server_tokens"), total("server_steps"), share("client_cpu"), share("server_cpu"),
                  share("core0_other"), share("core1_other"), total("errors"),
                  run="all" if len(windows) > 1 else first.run)


# ----- the reference client (a child process running this file) ---------------------------------------------


def reference_child_main(argv: list[str]) -> int:
    """Entry point of the child: stream, announce the window's start and end on stdout, write the timings."""
    parser = argparse.ArgumentParser(prog="loadgen_capacity.py _reference")
    parser.add_argument("--url", required=True)
    parser.add_argument("--body", required=True, help="request body JSON file")
    parser.add_argument("--streams", type=int, required=True)
    parser.add_argument("--rate", type=float, default=0.0, help="Poisson arrivals per second (0: closed loop)")
    parser.add_argument("--warmup", type=float, required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--timings", required=True, help="where to write per-request timings (JSON)")
    parser.add_argument("--ramp-s", type=float, default=0.0, help="start the closed-loop users over this time")
    args = parser.parse_args(argv)
    return asyncio.run(reference_run(args))


class ReferenceLoad:
    """Streams of completions, counting token events (one marker each) without parsing JSON."""

    def __init__(self, session, url: str, body: bytes, expected_tokens: int) -> None:
        self.session, self.url, self.body, self.expected = session, url, body, expected_tokens
        self.tokens = 0
        self.errors = 0
        self.users_ready = 0  # closed-loop users whose first request completed
        self.timings: list[tuple[str, float, float | None, float | None, int]] = []

    async def one(self, request_id: str) -> bool:
        """Send one request and read it to the end; False when it failed."""
        keep = len(TOKEN_MARKER) - 1  # a marker split across two reads is counted once, in the later one
        headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
        first = last = None
        count = 0
        sent = time.time()
        try:
            async with self.session.post(self.url, data=self.body, headers=headers) as response:
                if response.status != 200:
                    await response.read()
                    raise aiohttp.ClientError(f"HTTP {response.status}")
                tail = b""
                async for chunk in response.content.iter_any():
                    data = tail + chunk
                    found = data.count(TOKEN_MARKER)
                    if found:
                        last = time.time()
                        first = first or last
                        count += found
                        self.tokens += found
                    tail = data[-keep:]
        except (aiohttp.ClientError, TimeoutError):
            self.errors += 1
            return False
        self.timings.append((request_id, sent, first, last, count))
        self.errors += count != self.expected
        return count == self.expected

    async def user(self, index: int, start_delay: float) -> None:
        """Closed loop: request after request until cancelled (started after ``start_delay``, as ramped)."""
        await asyncio.sleep(start_delay)
        for sequence in range(10**9):
            ok = await self.one(f"ref{index}-{sequence}")
            if sequence == 0 and ok:
                self.users_ready += 1

    async def arrivals(self, rate: float) -> None:
        """Open loop: a request at each Poisson arrival, whatever is in flight, until cancelled."""
        loop = asyncio.get_running_loop()
        pending: set[asyncio.Task] = set()
        moment = loop.time()
        gaps = np.random.default_rng(1).exponential(1 / rate, size=10**6)
        try:
            for index, gap in enumerate(gaps):
                moment += gap
                await asyncio.sleep(max(moment - loop.time(), 0.0))
                task = asyncio.create_task(self.one(f"refp-{index}"))
                pending.add(task)
                task.add_done_callback(pending.discard)
        finally:
            for task in list(pending):
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def ready(self, args: argparse.Namespace) -> bool:
        # a whole first request per user (closed loop), any token (open loop): then the warm-up runs
        return self.tokens > 0 if args.rate else self.users_ready >= args.streams


async def reference_run(args: argparse.Namespace) -> int:
    body = Path(args.body).read_bytes()
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=HTTP_TIMEOUT_S, sock_read=60)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        load = ReferenceLoad(session, args.url + "/v1/completions", body, json.loads(body)["max_tokens"])
        if args.rate:
            tasks = [asyncio.create_task(load.arrivals(args.rate))]
        else:
            tasks = [asyncio.create_task(load.user(i, i * args.ramp_s / args.streams)) for i in range(args.streams)]
        try:
            deadline = time.monotonic() + RAMP_TIMEOUT_S
            while not load.ready(args) and time.monotonic() < deadline:
                await asyncio.sleep(POLL_S)
            if not load.ready(args):
                print(f"not ramped up in {RAMP_TIMEOUT_S:.0f} s ({load.users_ready} users streaming, "
                      f"{load.errors} errors)", file=sys.stderr)
                return 1
            await asyncio.sleep(args.warmup)
            announce(load)
            await asyncio.sleep(args.duration)
            announce(load)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    Path(args.timings).write_text(json.dumps(load.timings))
    return 0


def announce(load: ReferenceLoad) -> None:
    """One line on stdout marking a window edge: the orchestrator takes its own snapshot when it reads it."""
    mark = {"wall": time.time(), "tokens": load.tokens, "errors": load.errors, "cpu": time.process_time()}
    print(json.dumps(mark), flush=True)


def request_body(server: Server, input_tokens: int, output_tokens: int) -> bytes:
    """The load generator's own request for this workload (loadgen.target), so both clients send the same."""
    from loadgen.spec import WorkloadSpec
    from loadgen.target import build_target

    spec = WorkloadSpec.model_validate({"input_tokens": input_tokens, "output_tokens": output_tokens,
                                        "load": {"mode": "concurrency", "concurrency": 1}})
    return json.dumps(build_target(spec, server.url).body, separators=(",", ":")).encode()


def measure_reference(server: Server, args: argparse.Namespace, workdir: Path, load: Load, warmup: float,
                      run: int) -> tuple[Window, list[dict]]:
    name = ("reference" if load.rate is None else "reference_poisson") + str(run)
    body_path, timings_path = workdir / "request_body.json", workdir / f"{name}_timings.json"
    body_path.write_bytes(request_body(server, args.input_tokens, args.output_tokens))
    command = [sys.executable, str(Path(__file__).resolve()), "_reference", "--url", server.url, "--body",
               str(body_path), "--streams", str(load.streams), "--rate", str(load.rate or 0), "--warmup",
               str(warmup), "--duration", str(args.duration), "--timings", str(timings_path),
               "--ramp-s", str(args.ramp_s)]
    progress(f"aiohttp reference, {load.label}, run {run}: warm-up {warmup:.0f} s + {args.duration:g} s")
    child = Child(f"reference client ({load.label})", command, CLIENT_CORE, workdir / f"{name}.log",
                  pipe_stdout=True)
    try:
        start_mark = json.loads(child.read_line(time.monotonic() + RAMP_TIMEOUT_S + warmup + 10))
        before = snapshot(server, child)
        end_mark = json.loads(child.read_line(time.monotonic() + args.duration + 10))
        after = snapshot(server, child)
        if child.wait(STOP_TIMEOUT_S) != 0:
            raise SetupError(f"reference client failed:\n{child.log_tail()}")
    finally:
        child.stop()
    window = window_of("aiohttp reference", load, before, after, end_mark["tokens"] - start_mark["tokens"],
                       end_mark["errors"] - start_mark["errors"])
    window.run = str(run)
    window.notes["own_cpu"] = (end_mark["cpu"] - start_mark["cpu"]) / (end_mark["wall"] - start_mark["wall"])
    timings = [{"request_id": rid, "sent_s": sent, "first_token_s": first, "last_token_s": last}
               for rid, sent, first, last, count in json.loads(timings_path.read_text())
               if count == args.output_tokens and window.start <= sent <= window.end]
    return window, timings


# ----- the load generator ------------------------------------------------------------------------------


class LoadGenerator:
    """`batchscope load --workers 0` on CLIENT_CORE, with its client /metrics on a free port."""

    def __init__(self, server: Server, workdir: Path, name: str, spec: dict) -> None:
        self.out = workdir / name
        spec_path = workdir / f"{name}.yaml"
        spec_path.write_text(yaml.safe_dump({**spec, "scenario": name}))
        port = free_port()
        self.metrics_url = f"http://127.0.0.1:{port}/metrics"
        command = [sys.executable, "-m", "batchscope.cli", "load", "--spec", str(spec_path), "--host", server.url,
                   "--workers", "0", "--out", str(self.out), "--metrics-port", str(port)]
        self.child = Child(f"batchscope load ({name})", command, CLIENT_CORE, workdir / f"{name}.log")

    def in_flight(self) -> int:
        """batchscope_client_requests_in_flight from the client /metrics (0 until it serves)."""
        try:
            text = requests.get(self.metrics_url, timeout=HTTP_TIMEOUT_S).text
        except requests.RequestException:
            return 0
        for line in text.splitlines():
            if line.startswith("batchscope_client_requests_in_flight"):
                return int(float(line.rsplit(" ", 1)[1]))
        return 0

    def locust_pid(self) -> int:
        """The process that runs the users: `python -m locust` under the CLI (or the CLI itself, alone)."""
        members = self.child.members()
        for pid in members:
            with contextlib.suppress(OSError):
                if b"locust" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:3]:
                    return pid
        if members == [self.child.pid]:
            return self.child.pid
        raise SetupError(f"no Locust process among {members} under `batchscope load`")

    def wait_streaming(self, server: Server, streams: int) -> None:
        """Until the client has ``streams`` requests in flight and the server holds them all."""
        wait_until(lambda: self.in_flight() >= streams and server.open_requests() >= streams, RAMP_TIMEOUT_S,
                   f"{streams} streams in flight", self.child.check_alive)


def tokens_in_window(records: list[dict], start: float, end: float) -> tuple[int, int]:
    """Token events the client received in [start, end), from the records' chunk times; and how many requests
    sent before ``end`` carry no chunk times although they may have streamed in the window."""
    tokens = missing = 0
    for record in records:
        first = record["first_token_s"]
        if first is None:
            missing += record["sent_s"] is not None and record["sent_s"] < end and record["outcome"] == "aborted"
            continue
        if first >= end or (record["last_token_s"] or first) < start:
            continue
        times = first + np.concatenate(([0.0], np.cumsum(record["itl_s"])))
        tokens += int(np.count_nonzero((times >= start) & (times < end)))
    return tokens, missing


def loadgen_spec(args: argparse.Namespace, load: Load, warmup: float, tail: float) -> dict:
    mode = ({"mode": "concurrency", "concurrency": load.streams, "ramp_up_s": args.ramp_s} if load.rate is None else
            {"mode": "poisson", "rate": load.rate, "max_in_flight": 4 * load.streams})
    return {"input_tokens": args.input_tokens, "output_tokens": args.output_tokens, "warmup_s": warmup,
            "duration_s": args.duration + tail, "timeout_s": 120, "load": mode}


def measure_loadgen(server: Server, args: argparse.Namespace, workdir: Path, load: Load, warmup: float,
                    tail: float, run: int) -> tuple[Window, list[dict]]:
    """The window is timed as the reference's; the run goes on ``tail`` s longer so that every request that
    streams during the window finishes (and so has its chunk times in records.jsonl)."""
    name = ("loadgen" if load.rate is None else "loadgen_poisson") + str(run)
    progress(f"batchscope load, {load.label}, run {run}: warm-up {warmup:.0f} s + {args.duration:g} s + tail "
             f"{tail:.0f} s")
    gen = LoadGenerator(server, workdir, name, loadgen_spec(args, load, warmup, tail))
    try:
        gen.wait_streaming(server, load.streams if load.rate is None else 1)
        hold(warmup, gen.child.check_alive)
        pid = gen.locust_pid()
        rss_before = proc_status_mb(pid, "VmRSS")
        before = snapshot(server, gen.child)
        hold(args.duration, gen.child.check_alive)
        after = snapshot(server, gen.child)
        rss_after = proc_status_mb(pid, "VmRSS")
        status = gen.child.wait(tail + LOCUST_FINAL_S + STOP_TIMEOUT_S)
    finally:
        gen.child.stop()
    if not (gen.out / "summary.json").exists():
        raise SetupError(f"batchscope load wrote no summary (status {status}):\n{gen.child.log_tail()}")
    summary = json.loads((gen.out / "summary.json").read_text())
    records = [json.loads(line) for line in (gen.out / "records.jsonl").read_text().splitlines()]
    tokens, missing = tokens_in_window(records, before.wall, after.wall)
    errors = sum(1 for r in records if r["outcome"] not in ("ok", "aborted") and r["sent_s"] < after.wall)
    window = window_of("batchscope load", load, before, after, tokens, errors)
    window.run = str(run)
    window.notes.update(exit_status=status, summary_tokens_per_s=summary["output_tokens_per_s"],
                        summary_completed=summary["completed"], summary_window_s=summary["effective_duration_s"],
                        summary_outcomes=summary["outcomes"], records_missing=missing,
                        rss_window_mb=(rss_before, rss_after))
    measured = [r for r in records if r["outcome"] == "ok" and before.wall <= r["sent_s"] <= after.wall]
    return window, measured


# ----- memory at many streams ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryResult:
    streams: int
    client_in_flight: int
    server_open_min: int
    sample_s: float
    rss_max_mb: float
    hwm_mb: float
    wrapper_rss_mb: float
    tokens_per_stream: float

    @property
    def peak_mb(self) -> float:
        return max(self.rss_max_mb, self.hwm_mb)


def measure_memory(server: Server, args: argparse.Namespace, workdir: Path) -> MemoryResult:
    n = args.rss_streams
    spec = {"input_tokens": args.input_tokens, "output_tokens": args.rss_output_tokens, "warmup_s": 0,
            "duration_s": RAMP_TIMEOUT_S + args.rss_sample + 60, "timeout_s": 600,
            "load": {"mode": "concurrency", "concurrency": n}}
    progress(f"batchscope load, {n} streams of {args.rss_output_tokens} tokens, RSS for {args.rss_sample:g} s")
    gen = LoadGenerator(server, workdir, "memory", spec)
    try:
        gen.wait_streaming(server, n)
        pid = gen.locust_pid()
        tokens_at_ready = server.stats()["tokens"]
        rss_max, open_min = 0.0, n
        end = time.monotonic() + args.rss_sample
        while time.monotonic() < end:
            gen.child.check_alive()
            rss_max = max(rss_max, proc_status_mb(pid, "VmRSS"))
            open_min = min(open_min, server.open_requests())
            time.sleep(0.1)  # sampling period
        in_flight = gen.in_flight()
        hwm = proc_status_mb(pid, "VmHWM")
        wrapper = proc_status_mb(gen.child.pid, "VmRSS") if gen.child.pid != pid else 0.0
        streamed = server.stats()["tokens"] - tokens_at_ready
    finally:
        gen.child.stop()
    return MemoryResult(n, in_flight, open_min, args.rss_sample, rss_max, hwm, wrapper, streamed / n)


# ----- bias against the ground truth ---------------------------------------------------------------------


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p99: float
    max: float

    @classmethod
    def of_ms(cls, values: list[float]) -> Percentiles:
        if not values:
            return cls(float("nan"), float("nan"), float("nan"))
        array = np.asarray(values) * 1e3
        p50, p99 = np.percentile(array, [50, 99])
        return cls(float(p50), float(p99), float(array.max()))


@dataclass(frozen=True)
class Bias:
    """Client minus server latency for requests that both sides saw complete."""

    label: str
    matched: int
    unmatched: int
    burst: int  # most arrivals at the server within BURST_S
    ttft: Percentiles
    e2e: Percentiles
    send: Percentiles  # server arrival - client send
    first_read: Percentiles  # client first token - server first token written


BURST_S = 0.010


def bias_of(label: str, pairs: list[tuple[dict, dict]], unmatched: int) -> Bias:
    """From (client record, server ground-truth line) pairs of the same requests."""
    ttft, e2e, send, first_read = [], [], [], []
    for client, server in pairs:
        sent, arrival = client["sent_s"], server["arrival_s"]
        ttft.append((client["first_token_s"] - sent) - (server["first_token_s"] - arrival))
        e2e.append((client["last_token_s"] - sent) - (server["last_token_s"] - arrival))
        send.append(arrival - sent)
        first_read.append(client["first_token_s"] - server["first_token_s"])
    return Bias(label, len(pairs), unmatched, largest_burst(sorted(s["arrival_s"] for _, s in pairs)),
                Percentiles.of_ms(ttft), Percentiles.of_ms(e2e), Percentiles.of_ms(send), Percentiles.of_ms(first_read))


def largest_burst(arrivals: list[float]) -> int:
    """Most arrivals within any BURST_S (sorted input): how synchronised the sends were."""
    if not arrivals:
        return 0
    times = np.asarray(arrivals)
    return int((np.searchsorted(times, times + BURST_S, side="right") - np.arange(times.size)).max())


def match(timed: list[dict], truth: dict[str, dict]) -> list[tuple[dict, dict]]:
    return [(record, truth[record["request_id"]]) for record in timed
            if record["request_id"] in truth and truth[record["request_id"]]["first_token_s"] is not None]


# ----- the phases ----------------------------------------------------------------------------------------


@dataclass
class Results:
    """Runs by client key (ref, gen, ref_poisson, gen_poisson), their bias samples, and the memory run."""

    runs: dict[str, list[Window]] = field(default_factory=dict)
    pairs: dict[str, list[tuple[dict, dict]]] = field(default_factory=dict)
    unmatched: dict[str, int] = field(default_factory=dict)
    memory: MemoryResult | None = None

    def window(self, key: str) -> Window:
        return pooled(self.runs[key])

    def bias(self, key: str) -> Bias:
        return bias_of(self.window(key).label, self.pairs[key], self.unmatched[key])


def run_phase(server: Server, results: Results, key: str, measure: Callable[[], tuple[Window, list[dict]]]) -> None:
    """One client on an idle server; its bias samples from the ground-truth lines the phase wrote."""
    offset = server.truth_offset()
    window, timed = measure()
    server.wait_idle()
    pairs = match(timed, server.truth_since(offset))
    results.runs.setdefault(key, []).append(window)
    results.pairs.setdefault(key, []).extend(pairs)
    results.unmatched[key] = results.unmatched.get(key, 0) + len(timed) - len(pairs)


def run_phases(args: argparse.Namespace, workdir: Path) -> Results:
    results = Results()
    server = Server(workdir)
    try:
        server.wait_ready()
        closed = Load(args.streams)
        for run in range(1, args.repeat + 1):  # alternating, so that drifting contention hits both clients
            run_phase(server, results, "ref", partial(measure_reference, server, args, workdir, closed, args.warmup,
                                                      run=run))
            request_s = args.streams * args.output_tokens / max(results.window("ref").tokens_per_s, 1.0)
            tail = args.tail if args.tail is not None else 1.5 * request_s + 2
            run_phase(server, results, "gen", partial(measure_loadgen, server, args, workdir, closed, args.warmup,
                                                      tail, run=run))
        if not args.no_poisson:
            poisson = Load(args.streams, results.window("ref").tokens_per_s / args.output_tokens)
            warmup = args.warmup + request_s
            run_phase(server, results, "ref_poisson", partial(measure_reference, server, args, workdir, poisson,
                                                              warmup, run=1))
            run_phase(server, results, "gen_poisson", partial(measure_loadgen, server, args, workdir, poisson,
                                                              warmup, tail, run=1))
        results.memory = measure_memory(server, args, workdir)
    finally:
        server.child.stop()
    return results


def progress(message: str) -> None:
    print(f"loadgen_capacity: {message} ...", file=sys.stderr, flush=True)


# ----- report --------------------------------------------------------------------------------------------


def client_rows(results: Results) -> list[Window]:
    """Each run, then the pooled figures of clients that ran more than once."""
    rows = [w for runs in results.runs.values() for w in runs]
    return rows + [results.window(key) for key, runs in results.runs.items() if len(runs) > 1]


def clients_table(windows: list[Window]) -> str:
    header = ["client", "load", "run", "in flight", "tok/s client", "tok/s server", "client CPU", "tok/s per core",
              "server CPU", "step ms", "others c0/c1", "errors", "bound by"]
    rows = [[w.client, w.load, w.run, f"{w.in_flight:.0f}", f"{w.tokens_per_s:,.0f}", f"{w.server_tokens_per_s:,.0f}",
             f"{w.client_cpu:.0%}", f"{w.tokens_per_cpu_s:,.0f}", f"{w.server_cpu:.0%}", f"{w.step_ms:.2f}",
             f"{w.core0_other:.0%}/{w.core1_other:.0%}", str(w.errors), w.bound] for w in windows]
    return table(header, rows)


def bias_table(biases: list[Bias]) -> str:
    header = ["client, load", "requests", f"burst/{BURST_S * 1e3:g}ms", "TTFT p50 ms", "TTFT p99 ms", "TTFT max ms",
              "E2E p50 ms", "E2E p99 ms", "E2E max ms", "send->arrival p99 ms", "1st-token read p99 ms"]
    rows = [[b.label, f"{b.matched}" + (f" (+{b.unmatched} unmatched)" if b.unmatched else ""), str(b.burst),
             f"{b.ttft.p50:.2f}", f"{b.ttft.p99:.2f}", f"{b.ttft.max:.2f}", f"{b.e2e.p50:.2f}", f"{b.e2e.p99:.2f}",
             f"{b.e2e.max:.2f}", f"{b.send.p99:.2f}", f"{b.first_read.p99:.2f}"] for b in biases]
    return table(header, rows)


def checks(results: Results) -> list[tuple[str, str, bool]]:
    """(target, measured, passed) for each target of the issue (the Poisson bias is an extra view)."""
    ref, gen, memory = results.window("ref"), results.window("gen"), results.memory
    ratio = gen.tokens_per_cpu_s / ref.tokens_per_cpu_s
    out = [(f"tokens/s per core >= {MIN_RATIO:.0%} of the reference ({gen.streams_label})",
            f"{ratio:.0%} ({gen.tokens_per_cpu_s:,.0f} vs {ref.tokens_per_cpu_s:,.0f})", ratio >= MIN_RATIO)]
    for key in ("gen", "gen_poisson"):
        if key in results.runs:
            bias, window = results.bias(key), results.window(key)
            view = window.streams_label if key == "gen" else f"extra: {window.load}, ~{window.in_flight:.0f} in flight"
            out.append((f"TTFT bias p99 <= {MAX_TTFT_BIAS_P99_MS:g} ms ({view})", f"{bias.ttft.p99:.2f} ms",
                        bias.ttft.p99 <= MAX_TTFT_BIAS_P99_MS))
    out.append((f"RSS per worker <= {MAX_RSS_MB:.0f} MB at {memory.streams:,} in-flight streams",
                f"{memory.peak_mb:.0f} MB", memory.peak_mb <= MAX_RSS_MB))
    return out


def loadgen_notes(window: Window) -> str:
    n = window.notes
    rss0, rss1 = n["rss_window_mb"]
    per_token = (rss1 - rss0) * 2**20 / max(window.client_tokens, 1)
    return (f"batchscope load, {window.load}, run {window.run}: summary.json output_tokens_per_s "
            f"{n['summary_tokens_per_s']:,.0f} over {n['summary_window_s']:.1f} s ({n['summary_completed']} requests "
            "scheduled and finished inside its window; outcomes "
            + ", ".join(f"{k} {v}" for k, v in n["summary_outcomes"].items() if v)
            + f"; exit status {n['exit_status']}); Locust RSS {rss0:.0f} -> {rss1:.0f} MB over the window "
            f"({(rss1 - rss0) / window.seconds * 60:+.1f} MB/min, {per_token:.0f} bytes per streamed token).")


def notes(results: Results) -> list[str]:
    ref, gen, memory = results.window("ref"), results.window("gen"), results.memory
    lines = [
        "tok/s client: token events the client received in the window (reference: its own count; batchscope load: "
        "chunk times in records.jsonl). tok/s server: /sim/stats over the same window. tok/s per core: tok/s client "
        "/ client CPU. step ms: wall time per engine step. others c0/c1: CPU other processes took on core 0 / 1.",
        *(loadgen_notes(w) for key in ("gen", "gen_poisson") for w in results.runs.get(key, [])),
        "Reference CPU by getrusage: " + ", ".join(f"{w.notes['own_cpu']:.0%}" for w in results.runs["ref"])
        + " (by /proc: " + ", ".join(f"{w.client_cpu:.0%}" for w in results.runs["ref"]) + ").",
        f"Memory run: {memory.client_in_flight} in flight at the client at the end, >= {memory.server_open_min} open "
        f"at the server throughout {memory.sample_s:g} s of sampling ({memory.tokens_per_stream:.0f} tokens "
        f"streamed per stream meanwhile): VmRSS max {memory.rss_max_mb:.0f} MB, VmHWM {memory.hwm_mb:.0f} MB "
        f"(plus the `batchscope load` CLI wrapper process: {memory.wrapper_rss_mb:.0f} MB).",
    ]
    lines += growth_warning(results)
    for w in client_rows(results):
        if w.notes.get("records_missing"):
            lines.append(f"WARNING: {w.notes['records_missing']} requests of '{w.label}' sent before the window's "
                         "end were aborted without chunk times: its tok/s client is a lower bound (raise --tail).")
    if ref.bound == "server CPU" and gen.bound == "server CPU":
        lines.append("WARNING: the server saturated core 0 under both clients: both ran below capacity at the rate "
                     "the server set, so the ratio compares CPU per token at that rate, not saturated capacities.")
    elif "client CPU" not in (ref.bound, gen.bound):
        lines.append("Neither client saturated core 1: the ratio compares CPU per token at the rate the server "
                     "set, not saturated capacities.")
    contended = [f"{w.label} run {w.run} ({w.core0_other:.0%}/{w.core1_other:.0%})" for w in client_rows(results)
                 if w.run != "all" and max(w.core0_other, w.core1_other) >= CONTENDED_CPU]
    if contended:
        lines.append(f"WARNING: other processes took >= {CONTENDED_CPU:.0%} of core {SERVER_CORE} or {CLIENT_CORE} "
                     f"during {', '.join(contended)}: their rates and latencies are suspect (CPU per token less so).")
    return lines


def growth_warning(results: Results) -> list[str]:
    """RSS that grows with the tokens streamed reaches the limit after a while, whatever the streams in flight."""
    runs = results.runs["gen"]
    mb_per_min = sum((w.notes["rss_window_mb"][1] - w.notes["rss_window_mb"][0]) / w.seconds * 60 for w in runs)
    mb_per_min /= len(runs)
    if mb_per_min < 1.0:
        return []
    minutes = (MAX_RSS_MB - results.memory.peak_mb) / mb_per_min
    return [f"WARNING: the Locust process grew {mb_per_min:.0f} MB/min while streaming "
            f"{results.window('gen').tokens_per_s:,.0f} tok/s: at that rate it passes {MAX_RSS_MB:.0f} MB after "
            f"about {minutes:.1f} min, whatever the number of streams in flight."]


def report(results: Results, args: argparse.Namespace) -> str:
    biases = [results.bias(key) for key in results.runs]
    return "\n".join([
        f"Workload: prompt {args.input_tokens} token ids, max_tokens {args.output_tokens}, ignore_eos, stream + "
        f"include_usage; simulator {' '.join(SERVER_FLAGS)} alone on core {SERVER_CORE}, each client on core "
        f"{CLIENT_CORE}; window {args.duration:g} s after a warm-up of {args.warmup:g} s (Poisson: plus one "
        "request's duration).",
        "",
        clients_table(client_rows(results)),
        "",
        "Bias against the server's ground truth, client minus server (requests sent in the windows, completed):",
        bias_table(biases),
        f"burst: most server arrivals within {BURST_S * 1e3:g} ms. send->arrival: server arrival - client send. "
        "1st-token read: client first token - server first token written.",
        f"Closed loop: users started over {args.ramp_s:g} s (0: at once, in lockstep: TTFTs taken in bursts of "
        "sends the server queues). Poisson: the reference's closed-loop request rate, arrivals spread (fewer in "
        "flight: the server's steps are shorter with fewer streams).",
        "",
        *notes(results),
        "",
        targets_table(checks(results)),
    ])


def to_json(results: Results) -> dict:
    def window_json(w: Window) -> dict:
        return {**asdict(w), "tokens_per_s": w.tokens_per_s, "server_tokens_per_s": w.server_tokens_per_s,
                "tokens_per_cpu_s": w.tokens_per_cpu_s, "step_ms": w.step_ms, "bound": w.bound}

    return {
        "runs": {key: [window_json(w) for w in runs] for key, runs in results.runs.items()},
        "pooled": {key: window_json(results.window(key)) for key in results.runs},
        "bias_ms": {key: asdict(results.bias(key)) for key in results.runs},
        "memory": asdict(results.memory),
        "targets": [{"target": t, "measured": m, "pass": ok} for t, m, ok in checks(results)],
    }


# ----- main ----------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argument_parser(__doc__)
    parser.add_argument("--streams", type=int, default=256, help="closed-loop streams of the capacity runs")
    parser.add_argument("--ramp-s", type=float, default=1.5,
                        help="start the closed-loop users evenly over this time (about one request's duration), "
                        "so that they don't run in lockstep; 0: all at once")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load before each window")
    parser.add_argument("--duration", type=float, default=15.0, help="measurement window, seconds")
    parser.add_argument("--input-tokens", type=int, default=32, help="prompt length, token ids")
    parser.add_argument("--output-tokens", type=int, default=256, help="tokens streamed per request")
    parser.add_argument("--repeat", type=int, default=2,
                        help="closed-loop runs of each client, alternating (figures pooled over them)")
    parser.add_argument("--tail", type=float, default=None,
                        help="seconds the load generator runs past its window (default: 1.5 x the reference's "
                             "request duration + 2)")
    parser.add_argument("--no-poisson", action="store_true", help="skip the Poisson runs (bias without bursts)")
    parser.add_argument("--rss-streams", type=int, default=1000, help="in-flight streams of the memory run")
    parser.add_argument("--rss-output-tokens", type=int, default=2000, help="tokens per request of the memory run")
    parser.add_argument("--rss-sample", type=float, default=4.0, help="seconds of RSS sampling at full load")
    parser.add_argument("--workdir", metavar="DIR", help="keep logs, records and the ground truth here")
    add_json_option(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_reference"]:
        return reference_child_main(argv[1:])
    args = parse_args(argv)
    os.sched_setaffinity(0, {CLIENT_CORE})
    started = time.perf_counter()
    try:
        if args.workdir:
            Path(args.workdir).mkdir(parents=True, exist_ok=True)
            results = run_phases(args, Path(args.workdir))
        else:
            with tempfile.TemporaryDirectory(prefix="loadgen_capacity-") as tmp:
                results = run_phases(args, Path(tmp))
    except (SetupError, OSError, requests.RequestException) as exc:
        print(f"loadgen_capacity: setup failed: {exc}", file=sys.stderr)
        return 1
    print(report(results, args))
    print(f"\nTook {time.perf_counter() - started:.0f} s.")
    if args.json:
        write_json(args.json, to_json(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
