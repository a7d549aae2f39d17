"""The run's figures as records arrive, in bounded memory: what the summary and the LLM tab read.

Each record is folded in once, as the controller receives it, under the window rule (window.py; the
live verdict on a record is final). Per-request figures stay exact: TTFT, TPOT and E2E of the requests completed
ok in the window, and dispatch lag, send and end times of every request, are kept as 8-byte floats (about 48
bytes a request). The per-token gaps (ITL) go into a GapSketch (sketch.py: fixed size, relative error
≤ 0.5%) instead of being kept. Tokens that arrived in the window are counted from each record's chunk times when
it arrives, so no gap outlives its record. records.jsonl still gets every gap of every record.
"""

from __future__ import annotations

import math
from array import array

import numpy as np

from batchscope.loadgen.figures.away import AwayTracker
from batchscope.loadgen.figures.sketch import GapPool, GapSketch
from batchscope.loadgen.figures.window import MeasurementWindow
from batchscope.loadgen.stream import OUTCOMES, RequestRecord, refused_by_server
from batchscope.vllm.catalogue import ADMISSION_REJECTION_REASONS

# aborted: the run's end cut them; rejected_busy: vLLM's admission policy at work, counted apart (self.rejected)
FAILURES = tuple(o for o in OUTCOMES if o not in ("ok", "aborted", "rejected_busy"))


class RunFigures:
    """Window figures (completed, failed, rejected by vLLM's admission check, latencies, tokens, offered arrivals)
    and whole-run ones (dispatch lag, send and end times for peak concurrency, refusals)."""

    def __init__(self, itl: GapPool | None = None) -> None:
        """``itl``: where the gaps are pooled, a GapSketch unless given (ExactGaps keeps them all)."""
        self.completed = 0
        self.failed = dict.fromkeys(FAILURES, 0)
        self.rejected: dict[str, int] = dict.fromkeys(ADMISSION_REJECTION_REASONS, 0)  # rejected_busy, by reason
        self.ttft, self.tpot, self.e2e = array("d"), array("d"), array("d")
        self.itl: GapPool = GapSketch() if itl is None else itl
        self.output_tokens = 0.0  # tokens that arrived in the window, whatever became of their request
        self.prompt_tokens = 0  # prompts of the requests first answered in the window
        self.completed_output_tokens = 0  # usage of the requests completed in the window
        self.scheduled_in_window = 0  # arrivals scheduled in the window (sent; refused ones are counted apart)
        self.dispatch_lags, self.sent, self.ended = array("d"), array("d"), array("d")
        self.read_lags = array("d")
        self.last_end_s = -math.inf
        self.finished = 0  # requests that ended in anything but 'aborted', whole run
        self.rejections: dict[int, int] = {}  # finished requests per refusing status (a non-retryable 4xx, 429, 503)
        self.rejection_detail: dict[int, str] = {}  # the first such answer's text, per status
        self.away = AwayTracker()  # when the server was away (away.py)

    def add(self, record: RequestRecord, window: MeasurementWindow) -> None:
        self._add_run_wide(record)
        self.away.add(record, window.holds(record))
        if window.start_s <= record.scheduled_s < window.end_s:
            self.scheduled_in_window += 1
        self.output_tokens += tokens_in(record, window)
        if record.first_token_s is not None and window.covers(record.first_token_s):
            self.prompt_tokens += record.prompt_tokens or 0
        if not window.holds(record):
            return
        if record.outcome in self.failed:
            self.failed[record.outcome] += 1
        if record.outcome == "rejected_busy" and record.reject_reason is not None:
            self.rejected[record.reject_reason] = self.rejected.get(record.reject_reason, 0) + 1
        if record.outcome != "ok":
            return
        self.completed += 1
        self.completed_output_tokens += record.output_tokens or 0
        if record.ttft_s is not None and record.e2e_s is not None:
            self.ttft.append(record.ttft_s)
            self.e2e.append(record.e2e_s)
        if record.tpot_s is not None:  # None for a one-token request; 0.0 (tokens in one read) counts
            self.tpot.append(record.tpot_s)
        self.itl.add(record.itl_s)

    def _add_run_wide(self, record: RequestRecord) -> None:
        if record.sent_s is not None:
            self.dispatch_lags.append(record.sent_s - record.scheduled_s)
        if record.read_lag_s is not None:
            self.read_lags.append(record.read_lag_s)
        if record.end_s is not None:
            self.last_end_s = max(self.last_end_s, record.end_s)
            if record.sent_s is not None:
                self.sent.append(record.sent_s)
                self.ended.append(record.end_s)
        if record.outcome != "aborted":
            self.finished += 1
        if refused_by_server(record) and record.status is not None:
            self.rejections[record.status] = self.rejections.get(record.status, 0) + 1
            self.rejection_detail.setdefault(record.status, record.error or "")

    def rejected_share(self) -> float | None:
        """vLLM's admission rejections / every request that ended in the window (completed + failed + rejected);
        None when none did."""
        rejected = sum(self.rejected.values())
        ended = self.completed + sum(self.failed.values()) + rejected
        return rejected / ended if ended else None

    def rejected_throughout(self) -> int | None:
        """The refusing status (request.refused_by_server) every finished request got, if one did (and at least one
        finished)."""
        return next((status for status, count in self.rejections.items() if count == self.finished), None)

    def peak_concurrency(self) -> int:
        """Most requests between send and end at one moment (sweep line; an end before a send at a tie)."""
        if not self.sent:
            return 0
        moments = np.concatenate((np.asarray(self.sent), np.asarray(self.ended)))
        steps = np.concatenate((np.ones(len(self.sent), dtype=np.int64), -np.ones(len(self.ended), dtype=np.int64)))
        order = np.lexsort((steps, moments))
        return int(np.cumsum(steps[order]).max())


def counted(record: RequestRecord, window: MeasurementWindow) -> bool:
    """A record the latency figures count: it ended ok in the window."""
    return record.outcome == "ok" and window.holds(record)


def tokens_in(record: RequestRecord, window: MeasurementWindow) -> float:
    """Output tokens of ``record`` whose chunk arrived within the window: the first token, then one per gap."""
    first = record.first_token_s
    if first is None:
        return 0.0
    chunks = len(record.itl_s) + 1
    # a server may pack several tokens in one chunk: weight by what usage says, when it says
    per_chunk = record.output_tokens / chunks if record.outcome == "ok" and record.output_tokens else 1.0
    last = record.last_token_s if record.last_token_s is not None else first
    if window.covers(first) and window.covers(last):
        return chunks * per_chunk  # the usual case: no need to place each chunk
    if first > window.end_s or last < window.start_s:
        return 0.0
    times = first + np.concatenate(([0.0], np.cumsum(np.asarray(record.itl_s, dtype=float))))
    return int(np.count_nonzero((times >= window.start_s) & (times <= window.end_s))) * per_chunk
