"""vLLM's /metrics during a run: one bounded read (before, after) and a sampler thread reading every second.

Each read ends within FETCH_TIMEOUT_S and METRICS_MAX_BYTES whatever the server sends (batchscope.wire.bounded_read);
a server that does not answer in time is a missing point, not a stuck run.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from pathlib import Path

import requests

from batchscope.tuner.results import MetricsPoint, parse_metrics
from batchscope.vllm import scrape

SAMPLE_INTERVAL_S = 1.0
MAX_SAMPLES = 24 * 3600  # a day of one-second samples: bounded memory whatever the window
FETCH_TIMEOUT_S = 5.0
_SESSION = requests.Session()  # one connection kept to the server across the samples


def fetch_metrics(url: str, path: Path | None = None, timeout_s: float = FETCH_TIMEOUT_S) -> MetricsPoint | None:
    """One read of /metrics within ``timeout_s`` and METRICS_MAX_BYTES (saved raw when a path is given); None when
    the server does not answer so."""
    try:
        text = scrape.read_text(_SESSION, url + "/metrics", timeout_s)
    except scrape.Unreadable:
        return None
    if path is not None:
        path.write_text(text)
    try:
        return parse_metrics(text, time.time())
    except ValueError:
        return None  # not an exposition: a missing point as well


class MetricsSampler:
    """Reads /metrics every second on a thread, keeping the points (bounded) and appending them to a JSONL file."""

    def __init__(self, url: str, path: Path, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.url, self.path, self.interval_s = url, path, interval_s
        self.points: deque[MetricsPoint] = deque(maxlen=MAX_SAMPLES)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        with open(self.path, "a") as out:
            while not self._stop.is_set():
                point = fetch_metrics(self.url)
                if point is not None:
                    self.points.append(point)
                    out.write(point.model_dump_json() + "\n")
                    out.flush()
                self._stop.wait(self.interval_s)  # the sampling period; stop() cuts it short
