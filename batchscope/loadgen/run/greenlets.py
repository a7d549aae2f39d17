"""Generic gevent helpers: precise waits and background work that yields to everything else."""

from __future__ import annotations

import time
from collections.abc import Callable

import gevent

# libev rounds a timer's wait up to the next millisecond: sleeping until 1 ms before the moment, then yielding,
# wakes in time without spinning longer than needed (the spin is CPU taken from the streams)
SPIN_S = 0.001
IDLE_NAP_S = 0.05
# items queued beyond which the work takes its turn like any greenlet instead of waiting for an idle moment: a
# saturated generator's loop is never idle, and its queues of finished records would grow without bound
MAX_BACKLOG = 256


def sleep_until(moment: float) -> None:
    """Sleep until ``moment`` to within a fraction of a millisecond: timers alone wake up to a ms late, which
    would show as dispatch lag; the last couple of ms are spent yielding to the other greenlets instead."""
    delay = moment - time.time()
    if delay > SPIN_S:
        gevent.sleep(delay - SPIN_S)
    while time.time() < moment:
        gevent.sleep(0)


def work_when_idle(step: Callable[[], bool], backlog: Callable[[], int] = lambda: 0) -> None:
    """Call ``step`` whenever nothing else is ready to run, or in turn with the others once ``backlog()`` passes
    MAX_BACKLOG; ``step`` returns whether work is left (else nap 50 ms).

    For bookkeeping that must not delay the reading of the streams being timed.
    """
    while True:
        if backlog() > MAX_BACKLOG:
            gevent.sleep(0)
        else:
            gevent.idle()
        if not step():
            gevent.sleep(IDLE_NAP_S)
