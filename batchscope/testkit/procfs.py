"""CPU time, memory and core affinity of processes and cores, read from /proc (Linux), for benches and tests that
measure them."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def stat_fields(pid: int, proc: Path = Path("/proc")) -> list[str]:
    """Fields of /proc/PID/stat after the parenthesised command name (state is [0], pgrp [2], utime [11])."""
    return (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()


def cpu_ticks(pid: int, proc: Path = Path("/proc")) -> int:
    """utime + stime of a process, all its threads (fields 14 and 15 of /proc/PID/stat), clock ticks."""
    fields = stat_fields(pid, proc)
    return int(fields[11]) + int(fields[12])


def cpu_seconds(pid: int, proc: Path = Path("/proc")) -> float:
    """utime + stime of a process, all its threads, seconds."""
    return cpu_ticks(pid, proc) / CLK_TCK


def total_cpu_seconds(pids: list[int], proc: Path = Path("/proc")) -> float:
    """utime + stime of the given processes, seconds (one that exited meanwhile counts as 0)."""
    ticks = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            ticks += cpu_ticks(pid, proc)
    return ticks / CLK_TCK


def status_mb(pid: int, key: str, proc: Path = Path("/proc")) -> float:
    """A memory line of /proc/PID/status (VmRSS, VmHWM), MB (2**20 bytes)."""
    for line in (proc / str(pid) / "status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    # a zombie has no memory lines: to the caller, the process is gone
    raise ProcessLookupError(f"no {key} in {proc / str(pid) / 'status'}")


def core_busy_seconds(proc: Path = Path("/proc")) -> dict[int, float]:
    """Non-idle time of each CPU so far (user, nice, system, irq, softirq, steal) from /proc/stat."""
    busy = {}
    for line in (proc / "stat").read_text().splitlines():
        name, *values = line.split()
        if name.startswith("cpu") and name != "cpu":
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, values[:8])
            busy[int(name[3:])] = (user + nice + system + irq + softirq + steal) / CLK_TCK
    return busy


def group_members(pgid: int, proc: Path = Path("/proc")) -> list[int]:
    """Live (not zombie) processes of one process group."""
    members = []
    for entry in os.scandir(proc):
        if entry.name.isdigit():
            try:
                fields = stat_fields(int(entry.name), proc)
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def thread_ids(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """The threads of a live process (none if it has exited)."""
    with contextlib.suppress(OSError):
        return [int(entry.name) for entry in os.scandir(proc / str(pid) / "task")]
    return []


def thread_affinities(pid: int) -> list[set[int]]:
    """The cores each thread of a process may run on (a thread gone meanwhile is left out)."""
    found = []
    for tid in thread_ids(pid):
        with contextlib.suppress(OSError):
            found.append(os.sched_getaffinity(tid))
    return found


def pin_process(pid: int, cores: set[int]) -> None:
    """Confine every thread of a process to ``cores`` (sched_setaffinity is per thread; new threads inherit)."""
    for tid in thread_ids(pid):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cores)
