"""A clock the test sets by hand, for the exporter's injected clocks (change times, down-log rate limits)."""

from __future__ import annotations


class Clock:
    """Returns ``now`` until the test moves it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
