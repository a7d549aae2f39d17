"""Stopping a plan cleanly: SIGINT or SIGTERM raises `Interrupted` in the main thread, except inside a cleanup.

A run's cleanup (stopping the load and the server) is not interrupted (`signals_deferred`): a signal that lands in
it is raised once the server is stopped, so no server is left holding the GPU and the port.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import ClassVar


class Interrupted(Exception):  # noqa: N818 - a user's request, not an error
    """SIGINT or SIGTERM arrived; the current run is abandoned cleanly."""


class StopOnSignal:
    """Within the block, the first SIGINT or SIGTERM raises Interrupted (at once, or when the cleanup it landed
    in ends: ``signals_deferred``); later ones wait for the cleanup."""

    active: ClassVar[StopOnSignal | None] = None  # signal handlers are the process's: one block at a time

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self.raised = False
        self.deferring = 0  # nested signals_deferred blocks
        self._previous: dict = {}

    def __enter__(self) -> StopOnSignal:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        StopOnSignal.active = self
        return self

    def __exit__(self, *exc) -> None:
        StopOnSignal.active = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, number: int, _frame) -> None:
        if self.received is None:
            self.received = signal.Signals(number)
            if not self.deferring:
                self.interrupt()

    def interrupt(self) -> None:
        assert self.received is not None, "a signal arrived"
        self.raised = True
        raise Interrupted(self.received.name)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Cleanup that must finish (stopping the load and the server): a first signal that lands inside raises
    Interrupted when the block ends, not in the middle of it."""
    guard = StopOnSignal.active
    if guard is None:
        yield
        return
    guard.deferring += 1
    try:
        yield
    finally:
        guard.deferring -= 1
    if not guard.deferring and guard.received is not None and not guard.raised:
        guard.interrupt()
