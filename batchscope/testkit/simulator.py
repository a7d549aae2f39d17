"""THE way tests and benches start the simulator: `batchscope sim serve` on 127.0.0.1, ready when /health answers.

    sim = start_simulator(tmp_path, "--profile", "tiny")   # port 0: the simulator picks one, its log names it
    requests.get(sim.url + "/v1/models")
    sim.stop()

Flags go to `batchscope sim serve` as given, after ``--host 127.0.0.1 --port 0``, so a caller's own ``--port``
wins (a restart on the same port). The launcher waits, with a deadline, for vLLM's start-up line naming the
URL and then for /health; a simulator that exits or never answers is a SetupError carrying its log's tail.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from batchscope.testkit.processes import STOP_TIMEOUT_S, Child, SetupError, wait_until

READY_LINE = re.compile(r"Starting vLLM API server 0 on (http://[0-9.]+:\d+)")
HEALTH_TIMEOUT_S = 2.0


def sim_serve_command(model: str, *flags: str) -> list[str]:
    """The command line of `batchscope sim serve MODEL` on loopback, on a port of its choosing unless flagged."""
    return [sys.executable, "-m", "batchscope.cli", "sim", "serve", model, "--host", "127.0.0.1", "--port", "0",
            *flags]


def url_in_log(text: str) -> str | None:
    """The simulator's base URL from its start-up line, or None while it has not logged it."""
    match = READY_LINE.search(text)
    return match[1] if match else None


@dataclass
class SimProcess:
    """A running `batchscope sim serve`: where it answers, its process and its log."""

    url: str
    child: Child

    @property
    def process(self) -> subprocess.Popen:
        return self.child.process

    @property
    def log_path(self) -> Path:
        return self.child.log_path

    def log(self) -> str:
        return self.child.log()

    def cpu_seconds(self) -> float:
        return self.child.cpu_seconds()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        self.child.stop(timeout_s)


def healthy(url: str) -> bool:
    try:
        return requests.get(url + "/health", timeout=HEALTH_TIMEOUT_S).status_code == 200
    except requests.RequestException:
        return False


def start_simulator(workdir: Path, *flags: str, model: str = "sim-model", deadline_s: float = 20.0,
                    core: int | None = None, new_session: bool = False, log_name: str | None = None) -> SimProcess:
    """Start the simulator with ``flags`` and wait (at most ``deadline_s``) until /health answers.

    ``workdir`` receives the log (``log_name``, else a fresh ``sim-<ns>.log``); ``core`` pins the server to one
    CPU; ``new_session`` gives it a process group of its own (benches count its CPU and stop its tree).
    """
    log_path = workdir / (log_name or f"sim-{time.monotonic_ns()}.log")
    child = Child("simulator", sim_serve_command(model, *flags), log_path, core=core, new_session=new_session)

    def ready() -> str | None:
        url = url_in_log(child.log())
        return url if url is not None and healthy(url) else None

    try:
        url = wait_until(ready, deadline_s, interval_s=0.05, message="the simulator to answer /health",
                         alive=child.check_alive)
    except SetupError:
        exited = not child.alive()  # then the error already carries the log's tail
        child.stop()
        if exited:
            raise
        raise SetupError(f"simulator not ready in {deadline_s:g} s:\n{child.log_tail()}") from None
    return SimProcess(url, child)
