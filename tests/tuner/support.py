"""Helpers for the tuner's tests: small plans written to disk, `batchscope tune` as a child process."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from batchscope.testkit.processes import Child
from batchscope.tuner.results.record import RUN_FILE

PORT_FLAG = re.compile(r"--port (\d+)")


def tiny_plan(**overrides) -> dict:
    """A plan that runs in seconds: the tiny profile, short prompts and outputs, a one-second window."""
    plan = {
        "name": "tiny",
        "workload": {"input_tokens": 64, "output_tokens": 16, "timeout_s": 30,
                     "load": {"mode": "concurrency", "concurrency": 4}},
        "backend": {"kind": "simulator", "profile": "tiny"},
        "baseline": {"model": "sim-model", "max_model_len": 1024},
        "variations": [{"name": "mns-2", "set": {"max_num_seqs": 2}}],
        "warmup_s": 0.5,
        "window_s": 1.5,
    }
    plan.update(overrides)
    return plan


def write_plan(tmp_path: Path, plan: dict, name: str = "plan.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    return path


def start_tune(tmp_path: Path, plan_path: Path, *flags: str, log_name: str = "tune.log") -> subprocess.Popen:
    """`batchscope tune` in its own process group (so a test can kill it and its children, and nothing else)."""
    return Child("tune", [sys.executable, "-m", "batchscope.cli", "tune", str(plan_path), "--results",
                          str(tmp_path / "results"), *flags], tmp_path / log_name, new_session=True).process


def tune(tmp_path: Path, plan_path: Path, *flags: str, timeout_s: float = 120,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`batchscope tune` to the end (bounded); ``env`` adds variables to the tuner's environment."""
    return subprocess.run([sys.executable, "-m", "batchscope.cli", "tune", str(plan_path), "--results",
                           str(tmp_path / "results"), *flags], capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, **env} if env else None)


def run_files(plan_dir: Path) -> dict[str, dict]:
    """run.json of every finished run, by folder name."""
    return {path.parent.name: json.loads(path.read_text()) for path in sorted(plan_dir.glob(f"*/{RUN_FILE}"))}


def server_ports(plan_dir: Path) -> set[int]:
    """Every port a server of this plan was started on (finished runs' command lines, unfinished runs' logs)."""
    ports = set()
    for run in run_files(plan_dir).values():
        ports.update(int(p) for p in PORT_FLAG.findall(" ".join(run["command_line"])))
    for log in plan_dir.glob("*/server.log"):
        ports.update(int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", log.read_text(errors="replace")))
    return ports


def kill_group(process: subprocess.Popen, sig: signal.Signals = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group may be gone already
        os.killpg(process.pid, sig)
    process.wait(timeout=30)
