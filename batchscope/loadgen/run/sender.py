"""The load-sending side of a run, one per Locust process that runs users (a worker, or a local runner).

It sends requests for closed-loop users and for the open-loop dispatcher and counts what it starts. Finished
records wait in an outbox until ``report()`` hands them to the controller (directly on a local runner, through
Locust's worker reports otherwise). At the end, ``stop_now`` refuses new requests and aborts those in flight,
so each ends as 'aborted'. A non-retryable 4xx, a 429 or a 503 backs the whole process off (docs/loadgen.md,
"Back-off"), but not vLLM's admission 503 (rejected_busy): the open loop keeps its schedule, and only the closed-loop
user it answered pauses; failed requests are logged by kind, rate-limited (faults.py).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator

import gevent
import gevent.event
import gevent.pool

from batchscope.loadgen.run.faults import FaultLog
from batchscope.loadgen.run.greenlets import sleep_until
from batchscope.loadgen.run.report import SenderReport
from batchscope.loadgen.spec import ConcurrencyLoad, OfflineLoad, PoissonLoad, WorkloadSpec
from batchscope.loadgen.stream import (
    Connection,
    ConnectionPool,
    RequestRecord,
    StreamReader,
    Target,
    Timeout,
    measure,
    refused_by_server,
    throttled,
)
from batchscope.workload import poisson


def arrival_times(spec: WorkloadSpec, start: float, worker_index: int, workers: int) -> Iterator[float]:
    """Scheduled send times of this worker's share: Poisson at rate/workers, or offline's share at start."""
    load = spec.load
    if isinstance(load, OfflineLoad):
        share = load.requests // workers + (1 if worker_index < load.requests % workers else 0)
        yield from itertools.repeat(start, share)
        return
    assert isinstance(load, PoissonLoad)
    # independent streams per worker: the superposition of Poisson processes at λ/W is Poisson at λ
    yield from poisson.times(load.rate, spec.seed, sender=worker_index, senders=workers, start=start)


RECONNECT_DELAY_S = 0.1  # a dead server: don't spin, but keep trying (and counting attempts) at 10 a second
BACKOFF_BASE_S = 0.1
BACKOFF_CAP_S = 5.0  # how soon a fixed server (a key, a model loaded) is noticed again
RETRY_AFTER_CAP_S = 30.0  # the longest Retry-After honoured: a server asking for more is asked again after this
# a closed-loop user turned away by vLLM's admission check: at most 10 tries a second each, so it cannot spin at the
# round trip's pace, and back within a fraction of a request's time once the queue drains (docs/loadgen.md, "Back-off")
ADMISSION_PAUSE_S = 0.1
ADMISSION_PAUSE_CAP_S = 1.0  # the longest Retry-After such a user honours: the load stays the spec's concurrency


class LoadRun:
    """Per-process sender state: target, counters, in-flight set, and where finished records go."""

    def __init__(self, spec: WorkloadSpec, target: Target, run_id: str, worker_index: int, workers: int,
                 on_record: Callable[[RequestRecord], None]) -> None:
        self.spec = spec
        self.run_id = run_id
        self.target = target
        self.worker_index = worker_index
        self.workers = workers
        self._outbox: list[RequestRecord] = []
        self._on_record = on_record
        self._sequence = itertools.count()
        self._users = itertools.count()
        self._active: dict[str, tuple[RequestRecord, Connection]] = {}
        self.reader = StreamReader()  # reads every streamed body of this process
        self._aborted: set[str] = set()
        self._idle = gevent.event.Event()
        self.accepting = True
        self.started = 0
        self.refused = 0
        self._refused_s: list[float] = []  # scheduled times of refused arrivals not yet reported
        self._refused_streak = 0
        self.backoff_until = 0.0
        self.faults = FaultLog()

    @property
    def in_flight(self) -> int:
        return len(self._active)

    @property
    def prefill_backlog_tokens(self) -> int:
        """Prompt tokens of the requests sent that have no first token yet: the client's view of what vLLM's
        max_num_queued_tokens counts (every prompt still in prefill, whole)."""
        return sum(self.target.prompt_tokens for record, _ in self._active.values()
                   if record.sent_s is not None and record.first_token_s is None)

    def start_delay(self) -> float:
        """How long the next closed-loop user of this process waits before its first request (ramp-up)."""
        load = self.spec.load
        if not isinstance(load, ConcurrencyLoad) or not load.ramp_up_s:
            return 0.0
        local_users = -(-load.concurrency // self.workers)
        return next(self._users) % local_users * load.ramp_up_s / local_users

    def run_one(self, pool: ConnectionPool, scheduled_s: float) -> RequestRecord:
        """Send one request scheduled at ``scheduled_s`` and deliver its record, whatever happens."""
        # unique across runs too: records of several runs can be matched against one server's log
        record = RequestRecord(request_id=f"{self.run_id}-w{self.worker_index}-{next(self._sequence)}",
                               worker=self.worker_index,
                               scheduled_s=scheduled_s)
        self.started += 1
        connection = pool.acquire()
        self._active[record.request_id] = (record, connection)
        try:
            # the id lets a test match this record with the server's ground-truth log
            timeout = Timeout(f"no complete response within {self.spec.timeout_s} s")
            with gevent.Timeout(self.spec.timeout_s, timeout):  # the whole exchange, one timer
                measure(connection, self.target, record, {"X-Request-Id": record.request_id}, self.reader.follow)
        finally:
            del self._active[record.request_id]
            pool.release(connection)
            if record.request_id in self._aborted:
                record.outcome, record.error = "aborted", "in flight when the run ended"
            self._note_refusal(record)
            self.faults.note(record)
            self._outbox.append(record)
            self._on_record(record)
            if not self._active:
                self._idle.set()
        return record

    def _note_refusal(self, record: RequestRecord) -> None:
        if not refused_by_server(record):
            self._refused_streak = 0
            return
        self._refused_streak += 1
        if throttled(record) and record.retry_after_s is not None:
            delay = min(RETRY_AFTER_CAP_S, max(BACKOFF_BASE_S, record.retry_after_s))
        else:
            delay = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** min(self._refused_streak - 1, 32))
        self.backoff_until = max(self.backoff_until, time.time() + delay)

    def pause_after(self, record: RequestRecord) -> float:
        """How long a closed-loop user waits before its next request, after ``record``."""
        if record.outcome == "connection_error":
            return RECONNECT_DELAY_S
        backoff = max(0.0, self.backoff_until - time.time())
        if record.outcome == "rejected_busy":  # this user only: the others' requests were not refused
            asked = ADMISSION_PAUSE_S if record.retry_after_s is None else record.retry_after_s
            return max(backoff, min(ADMISSION_PAUSE_CAP_S, max(ADMISSION_PAUSE_S, asked)))
        return backoff

    def dispatch(self, start: float, end: float) -> None:
        """Open loop: release this worker's arrivals at their scheduled times until ``end``."""
        load = self.spec.load
        assert not isinstance(load, ConcurrencyLoad)
        cap = load.max_in_flight if isinstance(load, PoissonLoad) else load.requests
        cap = max(1, -(-cap // self.workers))
        connections = self.connection_pool()
        pool = gevent.pool.Pool(cap)
        for scheduled in arrival_times(self.spec, start, self.worker_index, self.workers):
            if not self.accepting or scheduled >= end:
                break
            sleep_until(scheduled)
            if pool.full() or scheduled < self.backoff_until:
                self.refused += 1
                self._refused_s.append(scheduled)
                continue
            pool.spawn(self.run_one, connections, scheduled)
        pool.join()

    def connection_pool(self) -> ConnectionPool:
        return ConnectionPool(self.target.endpoint, self.spec.timeout_s, read_timeouts=False)

    def report(self, final: bool = False) -> SenderReport:
        """The delta for the controller: records finished since the last report, and cumulative counts."""
        records, self._outbox = self._outbox, []
        refused_s, self._refused_s = self._refused_s, []
        return SenderReport(records=records, started=self.started, refused=self.refused, refused_s=refused_s,
                            in_flight=self.in_flight, prefill_backlog_tokens=self.prefill_backlog_tokens,
                            final=final, at_s=time.time(), cpu_s=time.process_time())

    def stop_now(self, timeout_s: float = 10.0) -> None:
        """Refuse new requests and abort those in flight (each is delivered as 'aborted')."""
        self.accepting = False
        self._idle.clear()
        self.faults.flush()
        if not self._active:
            return
        for request_id, (_, connection) in list(self._active.items()):
            self._aborted.add(request_id)
            connection.abort()  # its greenlet wakes with an error and delivers the record
        self._idle.wait(timeout=timeout_s)
