"""A child run to its end under an address-space limit and a deadline, measured: exit status, wall time and its
own peak RSS: the kernel's high-water mark of the program's memory (/proc/PID/status VmHWM), read every poll
once the child has exec'd it. Not wait4's ru_maxrss: Linux folds the forking parent's high-water mark into it
at exec, so a child of a large test process (pytest after the real-vLLM tier: ~300 MB) read as that large.
Only growth in the last poll interval before the exit goes unseen.

For runs against a server that may make them misbehave (batchscope/testkit/hostile.py): a runaway allocation
fails against the limit instead of eating the host, and a run that does not end is killed (SIGKILL to its
process group: a runaway may ignore SIGTERM) at the deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from batchscope.testkit.procfs import status_mb

POLL_S = 0.02
PROC = Path("/proc")


@dataclass
class BoundedRun:
    """How a bounded child ended."""

    returncode: int  # negative: the signal that ended it (-9 when killed at the deadline)
    wall_s: float  # start to exit, seconds
    peak_rss_mb: float  # the child's highest resident set size, MB (2**20 bytes)
    timed_out: bool  # killed at the deadline
    log_path: Path  # its stdout and stderr

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def limited(limit_bytes: int, core: int | None = None) -> Callable[[], None]:
    """A Popen ``preexec_fn`` capping the child's address space (RLIMIT_AS: allocations past it fail), and
    pinning it to ``core`` when one is given."""
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
        if core is not None:
            os.sched_setaffinity(0, {core})
    return apply


def run_bounded(args: list[str], log_path: Path, *, timeout_s: float, address_space_bytes: int,
                core: int | None = None) -> BoundedRun:
    """Run ``args`` to its end, or kill it ``timeout_s`` after its start; its output goes to ``log_path``."""
    start = time.monotonic()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                   preexec_fn=limited(address_space_bytes, core))
    timed_out, peak_mb = False, 0.0
    own_cmdline = "\0".join(args).encode()
    pid, status, _ = os.wait4(process.pid, os.WNOHANG)
    while not pid:
        peak_mb = max(peak_mb, program_hwm_mb(process.pid, own_cmdline))
        if time.monotonic() - start > timeout_s:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                os.killpg(process.pid, signal.SIGKILL)
            pid, status, _ = os.wait4(process.pid, 0)  # SIGKILL cannot be ignored: this returns
            break
        time.sleep(POLL_S)  # the polling interval of a bounded wait
        pid, status, _ = os.wait4(process.pid, os.WNOHANG)
    wall_s = time.monotonic() - start
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    return BoundedRun(returncode=process.returncode, wall_s=wall_s, peak_rss_mb=peak_mb, timed_out=timed_out,
                      log_path=log_path)


def program_hwm_mb(pid: int, own_cmdline: bytes) -> float:
    """VmHWM of ``pid`` once it runs its own program (its command line is ``own_cmdline``), else 0: before the
    exec the forked child still holds its parent's memory."""
    try:
        if not (PROC / str(pid) / "cmdline").read_bytes().startswith(own_cmdline):
            return 0.0
        return status_mb(pid, "VmHWM")
    except (OSError, ProcessLookupError):  # gone, or a zombie without memory lines
        return 0.0


@dataclass
class BoundedLoad:
    """A bounded `batchscope load` run and what it wrote (empty when it wrote nothing)."""

    run: BoundedRun
    summary: dict
    records: list[dict]


def bounded_load(workdir: Path, spec: dict, host: str, *, timeout_s: float, address_space_bytes: int,
                 core: int | None = None) -> BoundedLoad:
    """`batchscope load` of ``spec`` on ``host`` (one local process, no client /metrics port), run bounded (and
    pinned to ``core``); its spec, log and results go to a fresh directory under ``workdir``."""
    run_dir = workdir / f"load-{time.monotonic_ns()}"
    run_dir.mkdir(parents=True)
    (run_dir / "spec.yaml").write_text(yaml.safe_dump(spec))
    out = run_dir / "out"
    args = [sys.executable, "-m", "batchscope.cli", "load", "--spec", str(run_dir / "spec.yaml"), "--host", host,
            "--out", str(out), "--metrics-port", "0"]
    run = run_bounded(args, run_dir / "load.log", timeout_s=timeout_s, address_space_bytes=address_space_bytes,
                      core=core)
    summary_path, records_path = out / "summary.json", out / "records.jsonl"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    records = [json.loads(line) for line in records_path.read_text().splitlines()] if records_path.exists() else []
    return BoundedLoad(run, summary, records)
