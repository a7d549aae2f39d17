"""Fault injection for tests of clients: HTTP 500s, streams cut half-way, requests held before answering, a
hung engine core (no step for a while, every request kept where it is), and an API server that burns CPU on every
stream event (a saturated frontend: its process at a full core, as vLLM's is when detokenizing and writing tokens
outpaces one event loop).

Each request draws its faults from one seeded generator (``--seed``), in a fixed order, so a run is repeatable.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from batchscope.simulator.config import ServeConfig

# a burn past this many times its CPU time in wall time gives up: a process starved of CPU then holds its event loop
# a bounded while, and under-burns, rather than stretching one event's cost without end
BURN_WALL_FACTOR = 100


@dataclass(frozen=True)
class Faults:
    """What to do wrong with one request."""

    error: bool = False  # answer HTTP 500 instead
    cut_after: int | None = None  # close the stream abruptly after this many tokens
    stall: bool = False  # hold the request for --fault-stall-s before it reaches the engine


class FaultInjector:
    """Draws each request's faults at the configured rates and holds stalled requests."""

    def __init__(self, config: ServeConfig) -> None:
        self._config = config
        self._random = random.Random(config.seed)
        self.stalled = 0  # requests being held now, shown by /sim/stats

    def draw(self, stream: bool, max_tokens: int) -> Faults:
        config, draw = self._config, self._random.random
        if draw() < config.fault_error_rate:
            return Faults(error=True)
        cut = stream and draw() < config.fault_cut_rate  # only streams are cut: no draw for the others
        stall = draw() < config.fault_stall_rate
        return Faults(cut_after=max(max_tokens // 2, 1) if cut else None, stall=stall)

    async def stall(self) -> None:
        """Hold the caller; cancelled when its client gives up."""
        self.stalled += 1
        try:
            await asyncio.sleep(self._config.fault_stall_s)
        finally:
            self.stalled -= 1


@dataclass(frozen=True)
class EngineStall:
    """A hung engine core: from ``after_s`` past the engine loop's start, for ``duration_s``, no step runs.

    Requests keep arriving and stay running or waiting, and no token is generated: what an engine stuck in a
    collective or a dead worker looks like from /metrics (the gauges hold, the token counters stop).
    """

    after_s: float
    duration_s: float

    @classmethod
    def of(cls, config: ServeConfig) -> EngineStall | None:
        if config.fault_engine_stall_after_s is None or config.fault_engine_stall_s <= 0:
            return None
        return cls(config.fault_engine_stall_after_s, config.fault_engine_stall_s)

    def resumes_at(self, started: float, now: float) -> float | None:
        """When the stall holding the engine at ``now`` ends (loop clock), or None when the engine may step."""
        begin = started + self.after_s
        end = begin + self.duration_s
        return end if begin <= now < end else None


def burn_cpu(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time busy, holding the event loop meanwhile as real work would.

    Real CPU, not a sleep: the process's ``process_cpu_seconds_total`` grows by it, as a slow detokenizer's does.
    """
    end = time.thread_time() + seconds
    give_up = time.monotonic() + seconds * BURN_WALL_FACTOR
    while time.thread_time() < end and time.monotonic() < give_up:
        pass
