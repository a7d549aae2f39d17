"""Poisson arrivals, the one generator of open-loop send times: the load generator's senders, the simulator's
workloads and the what-if runs all draw them here.

Gaps are exponential, drawn from ``numpy.random.default_rng([seed, sender])`` a block at a time and summed in
order from ``start`` (one running sum, not a sum per block): the n-th arrival is the same whatever the blocks, so
a run that stops early and one that reads on agree on every arrival they share, and a what-if run sends when the
load generator's single sender of the same seed does. A load split over senders gives each its own stream at
rate / senders: independent Poisson processes superpose to one at the whole rate.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

BLOCK = 256  # gaps drawn at a time: a sender's next few seconds, at no cost to the values


def blocks(rate: float, seed: int, *, sender: int = 0, senders: int = 1, start: float = 0.0) -> Iterator[np.ndarray]:
    """Sender ``sender``'s arrival times after ``start`` (of ``senders`` sharing a load of ``rate`` per second),
    BLOCK at a time, for ever."""
    rng = np.random.default_rng([seed, sender])
    mean_gap_s = senders / rate
    moment = start
    while True:
        gaps = rng.exponential(mean_gap_s, size=BLOCK)
        gaps[0] += moment
        arrivals = np.cumsum(gaps)  # a running sum: each time is the one before it plus its gap
        moment = float(arrivals[-1])
        yield arrivals


def times(rate: float, seed: int, *, sender: int = 0, senders: int = 1, start: float = 0.0) -> Iterator[float]:
    """The arrival times of ``blocks``, one by one."""
    for block in blocks(rate, seed, sender=sender, senders=senders, start=start):
        yield from block.tolist()


def first(count: int, rate: float, seed: int) -> np.ndarray:
    """A single sender's first ``count`` arrival times after 0."""
    drawn = itertools.islice(blocks(rate, seed), -(-count // BLOCK))
    return np.concatenate([*drawn, np.zeros(0)])[:count]


def before(end: float, rate: float, seed: int) -> np.ndarray:
    """A single sender's arrival times in [0, ``end``)."""
    drawn = []
    for block in blocks(rate, seed):
        drawn.append(block)
        if block[-1] >= end:
            break
    arrivals = np.concatenate(drawn)
    return arrivals[arrivals < end]
