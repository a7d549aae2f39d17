"""Child processes for tests and benches: started with their output in a log file (optionally in a session of
their own and pinned to one core), waited on with deadlines, and stopped with their whole process group."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from batchscope.testkit import procfs

POLL_S = 0.05
STOP_TIMEOUT_S = 15.0
T = TypeVar("T")


class SetupError(RuntimeError):
    """A process did not start, answer, ramp up or finish in time: whatever it was for cannot go on."""


def pinned_to(core: int) -> Callable[[], None]:
    """A Popen ``preexec_fn`` that pins the child to one core."""
    return lambda: os.sched_setaffinity(0, {core})


def wait_until(predicate: Callable[[], T | None], timeout_s: float = 10.0, interval_s: float = 0.02,
               message: str = "condition", alive: Callable[[], None] | None = None) -> T:
    """Poll ``predicate`` until it returns a truthy value (returned) or ``timeout_s`` passes (SetupError).

    ``alive`` is called between polls and raises when a process the wait depends on has died, so a crash is
    reported at once rather than as a timeout.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if alive is not None:
            alive()
        time.sleep(interval_s)  # the polling interval of a bounded wait, not synchronisation
    raise SetupError(f"timed out after {timeout_s:g}s waiting for {message}")


def hold(seconds: float, alive: Callable[[], None]) -> None:
    """Let a measurement run for ``seconds`` (a timed window, not synchronisation), checking liveness."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        alive()
        time.sleep(min(left, 0.25))


def log_tail(path: Path, size: int = 2000) -> str:
    """The last ``size`` bytes of a log file as text; empty when it cannot be read."""
    with contextlib.suppress(OSError):
        return path.read_bytes()[-size:].decode(errors="replace")
    return ""


class Child:
    """A child process writing stdout and stderr to ``log_path`` (or stdout to a pipe, read by ``read_line``).

    With ``new_session`` it leads a process group of its own, so that ``stop`` ends its whole tree and
    ``cpu_seconds`` counts it; without, ``stop`` signals the child alone (it then gets the terminal's Ctrl-C
    with its parent).
    """

    def __init__(self, name: str, args: list[str], log_path: Path, *, core: int | None = None,
                 new_session: bool = False, pipe_stdout: bool = False, cwd: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = log_path
        self.new_session = new_session
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                args, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if pipe_stdout else log,
                stderr=log, start_new_session=new_session, preexec_fn=None if core is None else pinned_to(core))
        self._buffer = b""

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def members(self) -> list[int]:
        """Live processes of the child's tree: its process group with ``new_session``, else the child alone."""
        if self.new_session:
            return procfs.group_members(self.pid)
        return [self.pid] if self.alive() else []

    def cpu_seconds(self) -> float:
        """utime + stime of every live process of the tree, seconds."""
        return procfs.total_cpu_seconds(self.members())

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, size: int = 3000) -> str:
        return log_tail(self.log_path, size)

    def check_alive(self) -> None:
        """SetupError naming the child and its log's tail once it has exited."""
        if not self.alive():
            raise SetupError(f"{self.name} exited early (status {self.process.returncode}):\n{self.log_tail()}")

    def read_line(self, deadline: float) -> bytes:
        """The next line the child prints on its piped stdout, waiting at most until ``deadline`` (monotonic)."""
        stream = self.process.stdout
        assert stream is not None, "read_line needs pipe_stdout=True"
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SetupError(f"{self.name} printed nothing in time:\n{self.log_tail()}")
            ready, _, _ = select.select([stream], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(stream.fileno(), 65536)
                if not chunk:
                    raise SetupError(f"{self.name} closed its output (status {self.process.poll()}):\n"
                                     f"{self.log_tail()}")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def wait(self, timeout_s: float) -> int:
        """The exit status; SetupError when it has not exited within ``timeout_s``."""
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise SetupError(f"{self.name} did not finish within {timeout_s:.0f} s:\n{self.log_tail()}") from None

    def send_signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(sig)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM to every process of the tree (a clean stop), SIGKILL to what is left after ``timeout_s``."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            members = self.members()
            if not members and not self.alive():
                break
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + timeout_s
            while (self.alive() or self.members()) and time.monotonic() < deadline:
                time.sleep(POLL_S)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout_s)  # reaped, so that no zombie outlives the stop
        if self.process.stdout:
            self.process.stdout.close()
