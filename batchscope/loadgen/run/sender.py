"""The load-sending side of a run, one per Locust process that runs users (a worker, or a local runner).

It sends requests for closed-loop users and for the open-loop dispatcher and counts what it starts. Finished
records wait in an outbox until ``report()`` hands them to the controller (directly on a local runner, through
Locust's worker reports otherwise). At the end, ``stop_now`` refuses new requests and aborts those in flight,
so each ends as 'aborted'. A non-retryable 4xx, a 429 or a 503 backs the whole process off (docs/loadgen.md,
"Back-off"), but not vLLM's admission 503 (rejected_busy): only the closed-loop user it answered pauses. A server
away (connection refused or reset) backs off each closed-loop user and the open loop's schedule, exponentially with
jitter ("A server going away"). Failed requests are logged by kind, rate-limited (faults.py).
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterator

import gevent
import gevent.event
import gevent.local
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


# a server away (refused or reset connections): the n-th round of failures in a row waits a draw from [d/2, d],
# d = AWAY_BASE_S doubling to AWAY_CAP_S, so a restart of a few seconds costs a user about one failed request a
# second away and a long one about one per 3 s, the users spread out (no herd at the return), back within 4 s
AWAY_BASE_S = 1.0
AWAY_CAP_S = 4.0
BACKOFF_BASE_S = 0.1
BACKOFF_CAP_S = 5.0  # how soon a fixed server (a key, a model loaded) is noticed again
RETRY_AFTER_CAP_S = 30.0  # the longest Retry-After honoured: a server asking for more is asked again after this
# a closed-loop user turned away by vLLM's admission check: at most 10 tries a second each, so it cannot spin at the
# round trip's pace, and back within a fraction of a request's time once the queue drains (docs/loadgen.md, "Back-off")
ADMISSION_PAUSE_S = 0.1
ADMISSION_PAUSE_CAP_S = 1.0  # the longest Retry-After such a user honours: the load stays the spec's concurrency
NOT_SENT = ("in_flight_cap", "backing_off", "server_away")  # why an open-loop arrival was not sent


def doubling(streak: int, base: float, cap: float) -> float:
    """The wait after the ``streak``-th refusal in a row: ``base`` doubling up to ``cap``."""
    return min(cap, base * 2 ** min(streak - 1, 32))


def away_wait(streak: int) -> float:
    """The jittered wait after the ``streak``-th round of connection failures in a row (AWAY_BASE_S's comment)."""
    ceiling = doubling(streak, AWAY_BASE_S, AWAY_CAP_S)
    return random.uniform(ceiling / 2, ceiling)


class AwayBackOff:
    """One party's back-off from a server away: a closed-loop user, or a sender's open-loop schedule. Failures
    while it waits (requests already in flight) are one round: only a failure after the wait doubles it."""

    def __init__(self) -> None:
        self.streak = 0
        self.until = 0.0
        self.since = 0.0  # the streak's first failure

    def note(self, record: RequestRecord) -> None:
        if record.outcome == "connection_error":
            now = time.time()
            if now >= self.until:
                self.since = self.since if self.streak else now
                self.streak += 1
                self.until = now + away_wait(self.streak)
        elif record.status is not None and record.sent_s is not None and record.sent_s > self.since:
            # answered, and sent after the failures began (not an old request finishing): the server is back
            self.streak, self.until = 0, 0.0


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
        self.not_sent = dict.fromkeys(NOT_SENT, 0)  # refused arrivals by reason (NOT_SENT), cumulative
        self._refused_s: list[float] = []  # scheduled times of refused arrivals not yet reported
        self._refused_streak = 0
        self.backoff_until = 0.0
        self.schedule_away = AwayBackOff()  # the open loop's, for the whole schedule of this sender
        self._probe: RequestRecord | None = None  # the open loop's one request sent while the server is away
        self._user = gevent.local.local()  # a closed-loop user is one greenlet (Locust's): its AwayBackOff
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
        return self.send(pool, self.new_record(scheduled_s))

    def new_record(self, scheduled_s: float) -> RequestRecord:
        # unique across runs too: records of several runs can be matched against one server's log
        return RequestRecord(request_id=f"{self.run_id}-w{self.worker_index}-{next(self._sequence)}",
                             worker=self.worker_index, scheduled_s=scheduled_s)

    def send(self, pool: ConnectionPool, record: RequestRecord) -> RequestRecord:
        """Send ``record``'s request and deliver it, whatever happens; after the stop, neither (as the schedule's
        later arrivals): a greenlet spawned just before the stop may first run after the final report."""
        if not self.accepting:
            return record
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
            if not isinstance(self.spec.load, ConcurrencyLoad):
                self.schedule_away.note(record)
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
            delay = doubling(self._refused_streak, BACKOFF_BASE_S, BACKOFF_CAP_S)
        self.backoff_until = max(self.backoff_until, time.time() + delay)

    def pause_after(self, record: RequestRecord) -> float:
        """How long a closed-loop user (the calling greenlet) waits before its next request, after ``record``:
        the sender's back-off, or longer its own pause (a server away, an admission refusal)."""
        now = time.time()
        backoff = max(0.0, self.backoff_until - now)
        away = getattr(self._user, "away", None)
        if away is None:
            away = self._user.away = AwayBackOff()
        away.note(record)
        if record.outcome == "connection_error":
            return max(backoff, away.until - now)
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
            reason = self.not_sent_because(scheduled, pool.full())
            if reason is not None:
                self.refused += 1
                self.not_sent[reason] += 1
                self._refused_s.append(scheduled)
                continue
            record = self.new_record(scheduled)
            if self.schedule_away.streak:
                self._probe = record
            pool.spawn(self.send, connections, record)
        pool.join()

    def not_sent_because(self, scheduled: float, full: bool) -> str | None:
        """Why the open loop's arrival at ``scheduled`` is not sent (a NOT_SENT reason), or None: send it. While the
        server is away, one arrival after each wait is sent (a probe), and none while it is in flight unanswered."""
        if full:
            return "in_flight_cap"
        if scheduled < self.backoff_until:
            return "backing_off"
        away = self.schedule_away
        if away.streak and (scheduled < away.until or self._probing()):
            return "server_away"
        return None

    def _probing(self) -> bool:
        probe = self._probe
        if probe is None:
            return False
        if probe.status is not None:  # answered: the server is back, before the probe's stream ends
            self.schedule_away.note(probe)
        elif probe.end_s is None:
            return True
        self._probe = None  # answered, or failed (and the back-off has its next wait)
        return False

    def connection_pool(self) -> ConnectionPool:
        return ConnectionPool(self.target.endpoint, self.spec.timeout_s, read_timeouts=False)

    def report(self, final: bool = False) -> SenderReport:
        """The delta for the controller: records finished since the last report, and cumulative counts."""
        records, self._outbox = self._outbox, []
        refused_s, self._refused_s = self._refused_s, []
        return SenderReport(records=records, started=self.started, refused=self.refused,
                            not_sent=dict(self.not_sent), refused_s=refused_s,
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
