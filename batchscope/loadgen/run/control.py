"""The controlling side of a run, on the master (or the local runner): timing, merged stats, records, stop.

Workers report deltas (new records, cumulative counts) every few seconds and once more when stopped; the
controller adds them up, writes each record to records.jsonl as it arrives, and serves the merged metrics. At
the end it asks every sender to stop, waits (bounded) for their final reports, then lets Locust quit, so every
started request is accounted for in the summary. A run whose first FAIL_FAST_REQUESTS requests were all refused
with the same status ends there: a non-retryable 4xx (more of the same requests would only be rejected again), or
a 429 or 503 the senders kept backing off from (sender.py) while the server kept refusing. vLLM's admission 503
(rejected_busy) is no such refusal: its queue limit at work, the run goes on at its offered load.
"""

from __future__ import annotations

import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np

from batchscope.loadgen.figures import (
    ClientStats,
    MeasurementWindow,
    RunFigures,
    SaturationMonitor,
    Summary,
    away_s,
    live_window,
    summarize,
)
from batchscope.loadgen.run.report import SenderReport
from batchscope.loadgen.spec import OfflineLoad, WorkloadSpec
from batchscope.loadgen.stream import RequestRecord, Target, build_target

FINAL_REPORT_TIMEOUT_S = 30.0
FAIL_FAST_REQUESTS = 10


@dataclass
class SenderState:
    """The latest cumulative counts one sender (worker) reported."""

    started: int = 0
    refused: int = 0
    not_sent: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    prefill_backlog_tokens: int = 0
    final: bool = False


@dataclass
class RunControl:
    """Merges what the senders report and decides when the run ends."""

    spec: WorkloadSpec
    run_id: str
    host: str
    out_dir: Path | None
    request_stop: Callable[[], None]  # ask every sender to stop and send its final report
    sender_count: Callable[[], int]  # how many senders there are
    pull: Callable[[], None] | None = None  # local runner: fetch the in-process sender's report
    ids: tuple[int, int] | None = None  # the prompt token ids `batchscope load`'s pre-flight found (None: probe)
    figures: RunFigures = field(default_factory=RunFigures)  # the summary's and the LLM tab's
    saturation: SaturationMonitor = field(default_factory=SaturationMonitor)
    refused_s: array = field(default_factory=lambda: array("d"))  # scheduled times of refused arrivals
    received: int = 0  # records reported so far, stored or still queued
    _incoming: deque[RequestRecord] = field(default_factory=deque)
    senders: dict[str, SenderState] = field(default_factory=dict)
    target: Target | None = None
    start_s: float | None = None
    stop_s: float | None = None
    _stop_deadline: float | None = None
    _records_file: IO[str] | None = None
    stats: ClientStats = field(init=False)  # the live client metrics, goodput judged by the spec's SLO targets

    def __post_init__(self) -> None:
        self.stats = ClientStats(self.spec.slo)

    def begin(self) -> None:
        """Start the run (first tick): resolve the request once for every sender, open the records file.

        Raises SpecError when the server cannot tell the model or count a chat prompt.
        """
        self.target = build_target(self.spec, self.host, ids=self.ids)
        self.start_s = time.time()
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._records_file = open(self.out_dir / "records.jsonl", "w")  # noqa: SIM115

    def refresh(self) -> None:
        """Bring in the local sender's latest records (no-op on a master, whose workers push) and update the
        live figures of the server's absence."""
        if self.pull is not None and not self.stopping:
            self.pull()
        if self.start_s is not None:
            now = self.stop_s or time.time()
            self.stats.away_s = away_s(self.figures.away.gaps(now), now)
            self.stats.away_now = self.figures.away.away_now()

    # ----- reports -------------------------------------------------------------------------------------

    def accept(self, record: RequestRecord) -> None:
        if self._records_file is not None:
            self._records_file.write(record.to_json() + "\n")
        # a record arrives after its end, and one ending after an early stop arrives after the stop is set: the
        # verdict is final when made, so the live figures hold the summary's population (figures/window.py)
        window = self.window()
        self.stats.observe(record, in_window=window.holds(record))
        self.figures.add(record, window)  # the record itself is not kept: memory stays flat on long runs
        self.saturation.note_lags(record.dispatch_lag_s, record.read_lag_s)

    def merge_report(self, sender: str, report: SenderReport) -> None:
        """A sender's delta: its new records (queued for drain()) and its cumulative counters."""
        state = self.senders.setdefault(sender, SenderState())
        self._incoming.extend(report.records)
        self.refused_s.extend(report.refused_s)
        self.received += len(report.records)
        state.started, state.refused, state.in_flight = report.started, report.refused, report.in_flight
        state.prefill_backlog_tokens = report.prefill_backlog_tokens
        state.not_sent = report.not_sent
        state.final = state.final or report.final
        if self.start_s is not None:
            self.saturation.note_cpu(sender, report.at_s, report.cpu_s, self.window().start_s)
        self.stats.started = sum(s.started for s in self.senders.values())
        self.stats.refused = sum(s.refused for s in self.senders.values())
        self.stats.not_sent = {reason: sum(s.not_sent.get(reason, 0) for s in self.senders.values())
                               for reason in {r for s in self.senders.values() for r in s.not_sent}}
        self.stats.prefill_backlog_tokens = sum(s.prefill_backlog_tokens for s in self.senders.values())

    def drain(self, limit: int | None = None) -> bool:
        """Store up to ``limit`` queued records (all by default): metrics, records.jsonl, the summary's list.
        Returns whether records are still queued.

        A local runner calls this in small batches when its event loop is idle: done all at once in a tick,
        the work would delay the reading of the streams being timed.
        """
        count = len(self._incoming) if limit is None else min(limit, len(self._incoming))
        for _ in range(count):
            self.accept(self._incoming.popleft())
        if count and not self._incoming and self._records_file is not None:
            self._records_file.flush()
        return bool(self._incoming)

    def backlog(self) -> int:
        """Records received and not stored yet."""
        return len(self._incoming)

    @property
    def in_flight(self) -> int:
        return sum(s.in_flight for s in self.senders.values())

    # ----- timing --------------------------------------------------------------------------------------

    def window(self) -> MeasurementWindow:
        """The measurement window as known now (batchscope/loadgen/figures/window.py); call after begin()."""
        assert self.start_s is not None
        return live_window(self.spec, self.start_s, self.stop_s)

    def rejected_from_start(self) -> int | None:
        """The refusing status (request.refused_by_server) that each of the (at least FAIL_FAST_REQUESTS) requests
        finished so far got, if any."""
        if self.stats.finished < FAIL_FAST_REQUESTS:
            return None
        return self.figures.rejected_throughout()

    def should_end(self) -> bool:
        if self.rejected_from_start() is not None:
            return True
        assert self.start_s is not None
        elapsed = time.time() - self.start_s
        if isinstance(self.spec.load, OfflineLoad):
            return self.received >= self.spec.load.requests or elapsed > self.spec.timeout_s + 30
        return elapsed >= self.spec.warmup_s + self.spec.duration_s

    @property
    def stopping(self) -> bool:
        return self._stop_deadline is not None

    def begin_stop(self) -> None:
        self.stop_s = time.time()
        self._stop_deadline = self.stop_s + FINAL_REPORT_TIMEOUT_S
        self.request_stop()

    def stopped(self) -> bool:
        """All senders have sent their final report (or the wait timed out)."""
        finals = sum(1 for s in self.senders.values() if s.final)
        assert self._stop_deadline is not None
        return finals >= self.sender_count() or time.time() > self._stop_deadline

    # ----- result --------------------------------------------------------------------------------------

    def summary(self) -> Summary:
        assert self.start_s is not None, "a run that began"
        self.drain()
        stop = self.stop_s or time.time()
        generator = self.saturation.over_run(np.asarray(self.figures.dispatch_lags),
                                             np.asarray(self.figures.read_lags))
        return summarize(self.spec, self.figures, self.stats, generator, run_id=self.run_id, host=self.host,
                         start_s=self.start_s, stop_s=stop, refused_s=self.refused_s)

    def close(self) -> Summary | None:
        """Write summary.json (when an output directory is set) and return the summary."""
        if self.start_s is None:
            return None
        result = self.summary()
        if self._records_file is not None:
            self._records_file.close()
            self._records_file = None
        if self.out_dir is not None:
            (self.out_dir / "summary.json").write_text(result.model_dump_json(indent=2))
        return result
