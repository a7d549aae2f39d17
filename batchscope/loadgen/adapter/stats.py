"""Feeding finished requests into Locust's own statistics, off the hot path, so that its header and tables agree
with ours.

Only the REQUEST and REJECTED rows go through request events (Locust's header and "Aggregated" row add those up):
one per request that ended, failed when its outcome is a failure, none for one the run's end cut (``aborted``); a
request vLLM's admission check refused (``rejected_busy``) is a failed REJECTED one, named by its reason, so the
REQUEST row's failures are errors only and the rejections have their count and rate on a row of their own. The
latency rows (TTFT, TPOT, E2E) are logged into their own entries; per-token gaps are not requests and stay out.
Records queue here and a greenlet feeds them to Locust when the event loop is idle (a burst of endings must not
delay other streams' reads); ``flush`` empties the queue at the end.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import gevent
from locust.stats import PERCENTILES_TO_REPORT, StatsCSVFileWriter

from batchscope.loadgen.run import work_when_idle
from batchscope.loadgen.stream import RequestRecord

BATCH = 2  # records shown per idle moment: tokens arriving meanwhile wait


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
        """The request's event (ms, as Locust wants) and, when it completed, its latencies into their rows."""
        if record.outcome == "aborted":
            return  # the run's end cut it: not a request Locust should count, nor a failure
        context = {"output_tokens": record.output_tokens, "request_id": record.request_id}
        total = ((record.end_s or record.scheduled_s) - record.scheduled_s) * 1000
        kind, failure = "REQUEST", None
        if record.outcome == "rejected_busy":
            kind, failure = "REJECTED", OutcomeError(f"rejected_busy {record.reject_reason}")
        elif record.outcome != "ok":
            failure = OutcomeError(record.outcome if record.status in (None, 200) else f"http {record.status}")
        self._environment.events.request.fire(request_type=kind, name=self._name, response_time=total,
                                              response_length=0, context=context, exception=failure)
        if failure is not None:
            return
        stats = self._environment.stats
        for metric, value in (("TTFT", record.ttft_s), ("TPOT", record.tpot_s), ("E2E", record.e2e_s)):
            if value is not None:
                # the entry alone, not stats.total: a latency of a request already counted is not another request
                stats.get(self._name, metric).log(value * 1000, 0)


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
        write_final_tables(writer)
        writer.close_files()

    return stop


def write_final_tables(writer: StatsCSVFileWriter) -> None:
    """Rewrite the requests, failures and exceptions files with the final counts: the greenlet's last pass
    (once a second) may predate the last requests. The history file is appended to as it goes: left as is."""
    tables = ((writer.requests_csv_filehandle, writer.requests_csv_writer, writer.requests_csv),
              (writer.failures_csv_filehandle, writer.failures_csv_writer, writer.failures_csv),
              (writer.exceptions_csv_filehandle, writer.exceptions_csv_writer, writer.exceptions_csv))
    for handle, out, write_table in tables:  # each writes its header, then its rows
        handle.seek(0)
        handle.truncate()
        write_table(out)
