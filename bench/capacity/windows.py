"""Measurement windows of the capacity bench: counters on both sides at a window's edges, and the figures
of a window (rates per wall second, CPU as a share of a core) of one run or pooled over several."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from batchscope.testkit.processes import Child
from batchscope.testkit.procfs import core_busy_seconds
from capacity.server import Server
from capacity.settings import BUSY_CPU, CLIENT_CORE, SERVER_CORE


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
