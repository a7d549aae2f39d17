"""Feeding finished requests into Locust's own statistics, off the hot path.

Locust's stats, CSV and web UI get one request event per metric (TTFT, TPOT, E2E, and REQUEST with the outcome)
and every ITL gap. That is ~0.4 ms of work per request with a few hundred tokens; done as the request ends, a
burst of endings (a closed loop in lockstep) would delay the reading of other streams' chunks. So records queue
here and a greenlet feeds them to Locust whenever the event loop is idle; ``flush`` empties the queue at the end.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import gevent
import locust.stats
from locust.stats import PERCENTILES_TO_REPORT, StatsCSVFileWriter

from loadgen.greenlets import work_when_idle
from loadgen.request import RequestRecord

BATCH = 2  # records shown per idle moment: each logs its ITL gaps too, and tokens arriving meanwhile wait


class OutcomeError(Exception):
    """Carries a failed request's outcome into Locust's failure table."""


class DeferredRequestEvents:
    """Queue of records waiting to be shown in Locust's stats."""

    def __init__(self, environment, name: str) -> None:
        self._environment = environment
        self._name = name
        self._pending: deque[RequestRecord] = deque()
        self._greenlet = gevent.spawn(work_when_idle, self._feed_batch, lambda: len(self._pending))

    def add(self, record: RequestRecord) -> None:
        self._pending.append(record)

    def flush(self) -> None:
        while self._pending:
            self._fire(self._pending.popleft())

    def _feed_batch(self) -> bool:
        for _ in range(min(BATCH, len(self._pending))):
            self._fire(self._pending.popleft())
        return bool(self._pending)

    def _fire(self, record: RequestRecord) -> None:
        """One request event per metric (ms, as Locust wants), and the ITL gaps straight into the stats."""
        fire = self._environment.events.request.fire
        context = {"output_tokens": record.output_tokens, "request_id": record.request_id}
        total = ((record.end_s or record.scheduled_s) - record.scheduled_s) * 1000
        if record.outcome != "ok":
            failure = record.outcome if record.status in (None, 200) else f"http {record.status}"
            fire(request_type="REQUEST", name=self._name, response_time=total, response_length=0, context=context,
                 exception=OutcomeError(failure))
            return
        fire(request_type="REQUEST", name=self._name, response_time=total, response_length=0, context=context,
             exception=None)
        for metric, value in (("TTFT", record.ttft_s), ("TPOT", record.tpot_s), ("E2E", record.e2e_s)):
            if value is not None:
                fire(request_type=metric, name=self._name, response_time=value * 1000, response_length=0,
                     context=context, exception=None)
        # a request event per gap would cost a seventh of the client's CPU: log the gaps into the ITL row
        # directly (not into Locust's "Aggregated" row, which would mix them with whole requests anyway)
        log_many(self._environment.stats.get(self._name, "ITL"), [gap * 1000 for gap in record.itl_s])


def log_many(entry: Any, values_ms: list[float]) -> None:
    """``entry.log(value, 0)`` for each value, in one pass: the same fields, with Locust's own bucketing.

    The first value goes through StatsEntry.log (the per-second count, the last-request time, the response-time
    cache); the others add to the same second, as they would if logged within it. ``entry`` is a StatsEntry,
    typed Any: Locust annotates its times as int, and its own request events log float milliseconds.
    """
    if not values_ms:
        return
    entry.log(values_ms[0], 0)
    rest = values_ms[1:]
    if not rest or entry.last_request_timestamp is None:
        return
    entry.num_requests += len(rest)
    entry.num_reqs_per_sec[int(entry.last_request_timestamp)] += len(rest)
    entry.total_response_time += sum(rest)
    entry.min_response_time = min(entry.min_response_time or rest[0], min(rest))
    entry.max_response_time = max(entry.max_response_time, max(rest))
    for bucket, count in Counter(map(locust.stats.bucket_response_time, rest)).items():
        entry.response_times[bucket] += count


def take_over_csv(environment) -> Callable[[], None]:
    """Write Locust's --csv files from a greenlet of ours; returns the function that stops it and closes them.

    Locust's own CSV greenlet outlives the files it writes: a --processes master closes them, then waits for
    its workers at exit (atexit, which yields), and the greenlet's next write raises "I/O operation on closed
    file". Call this in the init event: Locust reads ``csv_prefix`` after it to decide whether to start its own.
    """
    options = environment.parsed_options
    writer = StatsCSVFileWriter(environment, PERCENTILES_TO_REPORT, options.csv_prefix, options.stats_history_enabled)
    options.csv_prefix = None
    greenlet = gevent.spawn(writer.stats_writer)

    def stop() -> None:
        greenlet.kill(block=True)
        writer.close_files()

    return stop
