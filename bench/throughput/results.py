"""What the simulator throughput bench measures: a run's spec and figures, and the virtual clock's speed."""

from __future__ import annotations

from dataclasses import dataclass

from throughput.settings import BUSY_CPU, LAGGING


@dataclass(frozen=True)
class RunSpec:
    """One server configuration and the closed-loop load put on it."""

    label: str
    profile: str
    streams: int
    prompt_len: int
    max_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float


@dataclass(frozen=True)
class RunResult:
    """What one run measured over its window (rates per wall second, CPU as a share of one core)."""

    spec: RunSpec
    window_s: float
    tokens_per_s: float
    server_tokens_per_s: float
    server_cpu: float
    client_cpu: float
    server_core_other: float  # CPU other processes (and hypervisor steal) took on the server's core
    client_core_other: float
    steps_in_window: int
    lag_p50_ms: float
    lag_p99_ms: float
    lag_max_ms: float
    running: int
    waiting: int
    stream_errors: int
    peak_rss_mb: float

    @property
    def step_ms(self) -> float:
        """Mean wall time between two engine steps over the window."""
        return self.window_s / max(self.steps_in_window, 1) * 1e3

    @property
    def lag_share(self) -> float:
        """Median step lag as a share of the step period: roughly the rate lost to waking late."""
        return self.lag_p50_ms / self.step_ms

    @property
    def bottleneck(self) -> str:
        if self.client_cpu >= BUSY_CPU:
            return "client CPU"
        if self.server_cpu >= BUSY_CPU:
            return "server CPU"
        if self.server_cpu + self.server_core_other >= BUSY_CPU:
            return "core 0 shared"
        if self.lag_share >= LAGGING:
            return "step lag"
        return "modelled steps"


@dataclass(frozen=True)
class VirtualResult:
    """The virtual clock on one workload."""

    workload: str
    requests: int
    steps: int
    simulated_s: float
    wall_s: float
    mean_running: float

    @property
    def speedup(self) -> float:
        return self.simulated_s / self.wall_s
