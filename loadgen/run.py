"""The load-sending side of a run, one per Locust process that runs users (a worker, or a local runner).

It sends requests for closed-loop users and for the open-loop dispatcher and counts what it starts.
Finished records wait in an outbox until ``report()`` hands them to the controller (directly on a local runner,
through Locust's worker reports otherwise). At the end, ``stop_now`` refuses new requests and aborts those in
flight, so each ends as 'aborted'.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace

import gevent
import gevent.event
import gevent.pool
import numpy as np
import requests
from requests.adapters import HTTPAdapter

from loadgen.request import RequestRecord, Target, measure
from loadgen.spec import OfflineLoad, PoissonLoad, WorkloadSpec


class RequestAborted(Exception):
    """Raised inside in-flight requests when the run ends."""


def new_session(pool_size: int) -> requests.Session:
    session = requests.Session()
    adapter = HTTPAdapter(pool_connections=1, pool_maxsize=pool_size)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def arrival_times(spec: WorkloadSpec, start: float, worker_index: int, workers: int) -> Iterator[float]:
    """Scheduled send times of this worker's share: Poisson at rate/workers, or offline's share at start."""
    load = spec.load
    if isinstance(load, OfflineLoad):
        share = load.requests // workers + (1 if worker_index < load.requests % workers else 0)
        yield from itertools.repeat(start, share)
        return
    assert isinstance(load, PoissonLoad)
    # independent streams per worker: the superposition of Poisson processes at λ/W is Poisson at λ
    rng = np.random.default_rng([spec.seed, worker_index])
    scale = workers / load.rate
    moment = start
    while True:
        for gap in rng.exponential(scale, size=256):
            moment += float(gap)
            yield moment


class LoadRun:
    """Per-process sender state: target, counters, in-flight set, and where finished records go."""

    def __init__(self, spec: WorkloadSpec, target: Target, worker_index: int, workers: int,
                 on_record: Callable[[RequestRecord], None]) -> None:
        self.spec = spec
        self.target = target
        self.worker_index = worker_index
        self.workers = workers
        self._outbox: list[RequestRecord] = []
        self._on_record = on_record
        self._sequence = itertools.count()
        self._active: set[gevent.Greenlet] = set()
        self._idle = gevent.event.Event()
        self.accepting = True
        self.started = 0
        self.refused = 0

    @property
    def in_flight(self) -> int:
        return len(self._active)

    def run_one(self, session: requests.Session, scheduled_s: float) -> None:
        """Send one request scheduled at ``scheduled_s`` and deliver its record, whatever happens."""
        record = RequestRecord(request_id=f"w{self.worker_index}-{next(self._sequence)}", worker=self.worker_index,
                               scheduled_s=scheduled_s)
        me = gevent.getcurrent()
        self.started += 1
        self._active.add(me)
        # the id lets a test match this record with the server's ground-truth log
        target = replace(self.target, headers={**self.target.headers, "X-Request-Id": record.request_id})
        try:
            measure(session, target, record)
        except RequestAborted:
            pass  # the record keeps outcome 'aborted'
        finally:
            self._active.discard(me)
            self._outbox.append(record)
            self._on_record(record)
            if not self._active:
                self._idle.set()

    def dispatch(self, start: float, end: float) -> None:
        """Open loop: release this worker's arrivals at their scheduled times until ``end``."""
        load = self.spec.load
        cap = load.max_in_flight if isinstance(load, PoissonLoad) else load.requests
        cap = max(1, -(-cap // self.workers))
        session = new_session(cap)
        pool = gevent.pool.Pool(cap)
        for scheduled in arrival_times(self.spec, start, self.worker_index, self.workers):
            if not self.accepting or scheduled >= end:
                break
            delay = scheduled - time.time()
            if delay > 0:
                gevent.sleep(delay)
            if pool.full():
                self.refused += 1
                continue
            pool.spawn(self.run_one, session, scheduled)
        pool.join()

    def report(self, final: bool = False) -> dict:
        """The delta for the controller: records finished since the last report, and cumulative counts."""
        records, self._outbox = self._outbox, []
        return {"records": [asdict(r) for r in records], "started": self.started, "refused": self.refused,
                "in_flight": self.in_flight, "final": final}

    def stop_now(self, timeout_s: float = 10.0) -> None:
        """Refuse new requests and abort those in flight (each is delivered as 'aborted')."""
        self.accepting = False
        self._idle.clear()
        if not self._active:
            return
        for greenlet in list(self._active):
            greenlet.kill(exception=RequestAborted, block=False)
        # closed-loop users survive the abort (they idle until Locust stops them), so wait for the requests
        self._idle.wait(timeout=timeout_s)
