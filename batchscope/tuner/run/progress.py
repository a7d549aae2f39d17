"""Live progress of a plan: run i of n, setting, phase, elapsed, the client's TTFT p50 and errors so far.

On a terminal a rich Live panel redraws in place; otherwise (tests, CI, a log file) one line per phase goes to
stderr. The client figures come from the load generator's own /metrics, read while the load runs.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import requests
from rich.console import Console
from rich.live import Live
from rich.table import Table

from batchscope.vllm import scrape

TTFT = "batchscope_client_time_to_first_token_seconds"
REQUESTS = "batchscope_client_requests_total"
CLIENT_READ_S = 1.0
# the client /metrics holds a few counters and histograms, some KB: 1 MiB leaves room and still bounds a bad answer
CLIENT_METRICS_MAX_BYTES = 1 << 20
_SESSION = requests.Session()  # one connection kept to the load generator across the reads
NOT_ERRORS = ("ok", "aborted")


@dataclass
class ClientLive:
    """What the load generator reports so far (the measurement window only)."""

    ttft_p50_s: float | None = None
    completed: int = 0
    errors: int = 0


def client_live(metrics_text: str) -> ClientLive:
    """TTFT p50 (linear within the bucket, as histogram_quantile) and error count from client /metrics."""
    buckets: dict[float, float] = {}
    live = ClientLive()
    for family in scrape.families(metrics_text):
        for sample in family.samples:
            if sample.name == f"{TTFT}_bucket":
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
            elif sample.name == REQUESTS:
                outcome = sample.labels.get("outcome")
                if outcome == "ok":
                    live.completed += int(sample.value)
                elif outcome not in NOT_ERRORS:
                    live.errors += int(sample.value)
    live.ttft_p50_s = quantile(0.5, sorted(buckets.items()))
    return live


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """histogram_quantile over (upper bound, cumulative count) pairs, sorted by bound."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return lower


def read_client(port: int, timeout_s: float = CLIENT_READ_S) -> ClientLive | None:
    """The load generator's live figures from its client /metrics, read within ``timeout_s`` and
    CLIENT_METRICS_MAX_BYTES; None when it does not answer so (not up yet, already gone, or misbehaving)."""
    try:
        return client_live(scrape.read_text(_SESSION, f"http://127.0.0.1:{port}/metrics", timeout_s,
                                            CLIENT_METRICS_MAX_BYTES))
    except (scrape.Unreadable, ValueError):
        return None


@dataclass
class Progress:
    """The state shown; ``live`` redraws on a terminal, else each new phase is logged as one line."""

    total: int
    console: Console = field(default_factory=lambda: Console(stderr=True))
    index: int = 0
    run: str = ""
    phase: str = ""
    started: float = field(default_factory=time.monotonic)
    client: ClientLive | None = None
    live: Live | None = None

    def __enter__(self) -> Progress:
        if sys.stdout.isatty() and self.console.is_terminal:
            self.live = Live(self._table(), console=self.console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def begin(self, index: int, run: str) -> None:
        self.index, self.run, self.client, self.started = index, run, None, time.monotonic()

    def set_phase(self, phase: str) -> None:
        if phase == self.phase:
            return
        self.phase = phase
        if self.live is None:
            print(f"tune: run {self.index}/{self.total} {self.run}: {phase}", file=sys.stderr, flush=True)
        self._redraw()

    def note(self, text: str) -> None:
        """A line that stays (a skipped or finished run)."""
        if self.live is not None:
            self.live.console.print(text)
        else:
            print(f"tune: {text}", file=sys.stderr, flush=True)

    def update_client(self, client: ClientLive | None) -> None:
        if client is not None:
            self.client = client
            self._redraw()

    def _redraw(self) -> None:
        if self.live is not None:
            self.live.update(self._table())

    def _table(self) -> Table:
        table = Table(show_header=True, title="batchscope tune")
        for column in ("run", "setting", "phase", "elapsed", "TTFT p50", "completed", "errors"):
            table.add_column(column)
        client = self.client or ClientLive()
        p50 = "-" if client.ttft_p50_s is None else f"{client.ttft_p50_s * 1000:.0f} ms"
        table.add_row(f"{self.index}/{self.total}", self.run, self.phase,
                      f"{time.monotonic() - self.started:.0f} s", p50, str(client.completed), str(client.errors))
        return table
