"""Helpers the benchmark scripts of bench/ share: /proc readers, child processes, ports, reports.

The scripts run as `python bench/<name>.py`, so this module is imported as ``benchlib``. It holds only what
several of them do in the same way: reading CPU and memory figures from /proc, starting a pinned
`batchscope sim serve` and finding its port in its log, stopping a child, a free loopback port, the
plain-text tables of the reports and the argument and JSON boilerplate. What one benchmark alone measures
stays in its script.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
SIM_PORT_LINE = re.compile(rb"Starting vLLM API server 0 on (http://[0-9.]+:\d+)")


class SetupError(RuntimeError):
    """A process or stub did not start, ramp up, answer rightly or finish: the figures cannot be taken."""


# ----- /proc -------------------------------------------------------------------------------------------


def proc_stat_fields(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after the parenthesised command name (state is [0], pgrp [2], utime [11])."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def proc_cpu_ticks(pid: int) -> int:
    """utime + stime of a process, all its threads (fields 14 and 15 of /proc/PID/stat), clock ticks."""
    fields = proc_stat_fields(pid)
    return int(fields[11]) + int(fields[12])


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all its threads, seconds."""
    return proc_cpu_ticks(pid) / CLK_TCK


def proc_status_mb(pid: int, key: str) -> float:
    """A memory line of /proc/PID/status (VmRSS, VmHWM), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise SetupError(f"no {key} in /proc/{pid}/status")


def core_busy_seconds() -> dict[int, float]:
    """Non-idle time of each CPU so far (user, nice, system, irq, softirq, steal) from /proc/stat."""
    busy = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if name.startswith("cpu") and name != "cpu":
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, values[:8])
            busy[int(name[3:])] = (user + nice + system + irq + softirq + steal) / CLK_TCK
    return busy


# ----- child processes ---------------------------------------------------------------------------------


def pinned_to(core: int) -> Callable[[], None]:
    """A Popen ``preexec_fn`` that pins the child to one core."""
    return lambda: os.sched_setaffinity(0, {core})


def sim_serve_command(*flags: str) -> list[str]:
    """`batchscope sim serve` of "bench-model" on a port of its choosing, which its log names (sim_server_url)."""
    return [sys.executable, "-m", "batchscope.cli", "sim", "serve", "bench-model", "--port", "0", *flags]


def sim_server_url(log: bytes) -> str | None:
    """The simulator's base URL from its start-up log line, or None while it has not logged it."""
    match = SIM_PORT_LINE.search(log)
    return match[1].decode() if match else None


def stop_process(proc: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM (a clean stop), SIGKILL if it lingers more than ``timeout_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout_s)


def log_tail(path: Path, size: int = 2000) -> str:
    """The last ``size`` bytes of a log file as text; empty when it cannot be read."""
    with contextlib.suppress(OSError):
        return path.read_bytes()[-size:].decode(errors="replace")
    return ""


def free_port() -> int:
    """A TCP port free on loopback just now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ----- command line and report -------------------------------------------------------------------------


def argument_parser(doc: str) -> argparse.ArgumentParser:
    """A parser described by the first paragraph of the script's docstring."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0])


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")


def write_json(path: str | Path, figures: object) -> None:
    Path(path).write_text(json.dumps(figures, indent=2) + "\n")


def table(header: list[str], rows: list[list[str]]) -> str:
    """Plain-text columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [header, ["-" * w for w in widths], *rows]
    return "\n".join("  ".join(cell.rjust(w) if i else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(line, widths, strict=True))).rstrip()
                     for line in lines)


def targets_table(checks: list[tuple[str, str, bool]]) -> str:
    """The (target, measured, passed) checks of a benchmark as a PASS/FAIL table."""
    return table(["target", "measured", "result"],
                 [[name, value, "PASS" if ok else "FAIL"] for name, value, ok in checks])
