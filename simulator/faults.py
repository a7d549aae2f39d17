"""Fault injection for tests of clients: HTTP 500s, streams cut half-way, and requests held before answering.

Each request draws its faults from one seeded generator (``--seed``), in a fixed order, so a run is repeatable.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from simulator.config import ServeConfig


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
