"""A run of the reference client (batchscope.testkit.reference_client, a child process on CLIENT_CORE, so that
its CPU is its own) sending the load generator's exact request, timed by the window edges it announces."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from batchscope.loadgen.spec import WorkloadSpec
from batchscope.loadgen.stream.target import build_target
from batchscope.testkit.processes import Child, SetupError
from capacity.server import Server
from capacity.settings import CLIENT_CORE, RAMP_TIMEOUT_S, REPO, STOP_TIMEOUT_S, progress
from capacity.windows import Load, Window, snapshot, window_of


def request_body(server: Server, input_tokens: int, output_tokens: int) -> bytes:
    """The load generator's own request for this workload (loadgen.stream.target), so both clients send the same."""
    spec = WorkloadSpec.model_validate({"input_tokens": input_tokens, "output_tokens": output_tokens,
                                        "load": {"mode": "concurrency", "concurrency": 1}})
    return json.dumps(build_target(spec, server.url).body, separators=(",", ":")).encode()


def measure_reference(server: Server, args: argparse.Namespace, workdir: Path, load: Load, warmup: float,
                      run: int) -> tuple[Window, list[dict]]:
    name = ("reference" if load.rate is None else "reference_poisson") + str(run)
    body_path, timings_path = workdir / "request_body.json", workdir / f"{name}_timings.json"
    body_path.write_bytes(request_body(server, args.input_tokens, args.output_tokens))
    command = [sys.executable, "-m", "batchscope.testkit.reference_client", "--url", server.url, "--body",
               str(body_path), "--streams", str(load.streams), "--rate", str(load.rate or 0), "--warmup",
               str(warmup), "--duration", str(args.duration), "--timings", str(timings_path),
               "--ramp-s", str(args.ramp_s)]
    progress(f"aiohttp reference, {load.label}, run {run}: warm-up {warmup:.0f} s + {args.duration:g} s")
    child = Child(f"reference client ({load.label})", command, workdir / f"{name}.log", core=CLIENT_CORE,
                  new_session=True, pipe_stdout=True, cwd=REPO)
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
