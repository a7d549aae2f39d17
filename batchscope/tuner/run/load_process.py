"""The load of one run: `batchscope load` as a child process with the run's spec, followed until it ends.

The spec goes to a file without its key (the key travels in the child's environment); the live file, when asked
for, points a following exporter at the run's server and the load's client metrics.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from batchscope.runs.live_run import LiveRun
from batchscope.tuner.plan import Plan, PlannedRun
from batchscope.tuner.results import write_atomically
from batchscope.tuner.run.progress import Progress, read_client
from batchscope.tuner.run.servers import CAUSE_LINES, Server, die_with_parent
from batchscope.vllm.log import failure_cause
from batchscope.wire.listen import free_port

LOAD_GRACE_S = 120.0  # beyond warm-up + window: Locust's start, the stop and the summary
LOAD_STOP_GRACE_S = 30.0  # the load generator aborts what is in flight and writes its summary first


@dataclass
class LoadProcess:
    process: subprocess.Popen
    metrics_port: int
    out: Path
    started: float


def start_load(plan: Plan, run: PlannedRun, run_dir: Path, url: str) -> LoadProcess:
    spec_path = run_dir / "spec.yaml"
    spec = plan.run_spec()
    # the key stays out of files: the load generator takes it from the environment
    spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude={"api_key"}), sort_keys=False))
    env = {**os.environ, "BATCHSCOPE_API_KEY": spec.api_key.get_secret_value()} if spec.api_key else None
    port = free_port()
    out = run_dir / "load"
    argv = [sys.executable, "-m", "batchscope.cli", "load", "--spec", str(spec_path), "--host", url,
            "--out", str(out), "--run-id", plan.run_id(run.setting, run.repeat), "--metrics-port", str(port)]
    with open(run_dir / "load.log", "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                   preexec_fn=die_with_parent)
    return LoadProcess(process, port, out, time.monotonic())


def write_live_file(path: Path, plan: Plan, run: PlannedRun, command_line: list[str], url: str, metrics_port: int,
                    started_at: str) -> None:
    """Point a following exporter at this run: its server and its load's client metrics (replaced atomically)."""
    live = LiveRun(vllm_url=url, loadgen_url=f"http://127.0.0.1:{metrics_port}", command_line=command_line,
                   plan=plan.name, setting=run.setting, repeat=run.repeat, started_at=started_at)
    write_atomically(path, live.model_dump_json(indent=2) + "\n")


def follow_load(plan: Plan, load: LoadProcess, server: Server, progress: Progress) -> str | None:
    """Wait for the load to end, showing its phase and live figures; the reason if the server died meanwhile."""
    deadline = load.started + plan.warmup_s + plan.window_s + LOAD_GRACE_S
    while True:
        try:
            load.process.wait(timeout=0.5)
            return None
        except subprocess.TimeoutExpired:
            pass
        if not server.alive():
            return "server died during the run: " + (failure_cause(server.log_tail(CAUSE_LINES)) or "no output")
        if time.monotonic() > deadline:
            return f"load generator still running {LOAD_GRACE_S:g} s after the window's end"
        elapsed = time.monotonic() - load.started
        progress.set_phase("warm-up" if elapsed < plan.warmup_s else "window")
        progress.update_client(read_client(load.metrics_port))
