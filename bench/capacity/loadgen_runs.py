"""Runs of `batchscope load --workers 0` on CLIENT_CORE: a capacity window timed as the reference's (tokens
from the records' chunk times), and the memory run at many in-flight streams."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import requests
import yaml

from batchscope.testkit.processes import Child, SetupError, hold, wait_until
from batchscope.testkit.procfs import status_mb
from batchscope.wire.listen import free_port
from capacity.server import Server
from capacity.settings import (
    CLIENT_CORE,
    HTTP_TIMEOUT_S,
    LOCUST_FINAL_S,
    RAMP_TIMEOUT_S,
    REPO,
    STOP_TIMEOUT_S,
    progress,
)
from capacity.windows import Load, Window, snapshot, window_of


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
        self.child = Child(f"batchscope load ({name})", command, workdir / f"{name}.log", core=CLIENT_CORE,
                           new_session=True, cwd=REPO)

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
                   interval_s=0.05, message=f"{streams} streams in flight", alive=self.child.check_alive)


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
        rss_before = status_mb(pid, "VmRSS")
        before = snapshot(server, gen.child)
        hold(args.duration, gen.child.check_alive)
        after = snapshot(server, gen.child)
        rss_after = status_mb(pid, "VmRSS")
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
            rss_max = max(rss_max, status_mb(pid, "VmRSS"))
            open_min = min(open_min, server.open_requests())
            time.sleep(0.1)  # sampling period
        in_flight = gen.in_flight()
        hwm = status_mb(pid, "VmHWM")
        wrapper = status_mb(gen.child.pid, "VmRSS") if gen.child.pid != pid else 0.0
        streamed = server.stats()["tokens"] - tokens_at_ready
    finally:
        gen.child.stop()
    return MemoryResult(n, in_flight, open_min, args.rss_sample, rss_max, hwm, wrapper, streamed / n)
