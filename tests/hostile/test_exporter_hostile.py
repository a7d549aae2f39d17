"""`batchscope exporter` (a real subprocess) in front of a hostile vLLM-shaped /metrics (batchscope.testkit.hostile).

Whatever the upstream does (a 200 MB body, an endless one, no answer, a byte every 100 ms), every scrape of the
exporter answers within its scrape timeout plus MARGIN_S, says ``batchscope_up 0`` with the reason in
``batchscope_scrape_error_info``, logs one line for the target, and the exporter's peak RSS (VmHWM) stays under
RSS_BOUND_MB. Ten concurrent scrapes of an exporter whose upstream hangs all answer in time, and a /metrics
without a charset is read as UTF-8. The exporter's memory is watched from its first poll on and the process
killed at KILL_MB: unbounded, it once reached 6 GB on one endless /metrics.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from batchscope.testkit import procfs
from batchscope.testkit.hostile import HostileServer
from tests.conftest import Exporter, wait_until

pytestmark = pytest.mark.e2e

TIMEOUT_S = 1.0  # --scrape-timeout-s
MARGIN_S = 1.5  # merging, serving and a 2-core machine shared with other test runs
RSS_BOUND_MB = 100.0  # the exporter idles at ~45 MB; a 16 MiB body at the cap adds at most ~35 MB
KILL_MB = 500.0
WATCH_LIMIT_S = 300.0
UP_VLLM = ("batchscope_up", (("target", "vllm"),))
# mode -> (reason, what the log line says, scrapes: enough of the fast ones for memory kept per scrape to show)
DOWN_MODES = {
    "metrics-huge": ("too_large", "larger than the 16 MiB cap", 40),
    "metrics-endless": ("too_large", "larger than the 16 MiB cap", 40),
    "metrics-hang": ("timeout", f"timeout after {TIMEOUT_S:g} s", 3),
    "metrics-drip": ("timeout", f"timeout after {TIMEOUT_S:g} s", 3),
}


class MemoryWatch:
    """Samples a process's VmRSS every few milliseconds on a thread, keeps the largest, kills it at KILL_MB."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_mb = 0.0
        self.killed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rss-{pid}", daemon=True)

    def start(self) -> MemoryWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        deadline = time.monotonic() + WATCH_LIMIT_S
        while not self._stop.wait(0.005) and time.monotonic() < deadline:
            try:
                rss = procfs.status_mb(self.pid, "VmRSS")
            except (OSError, ProcessLookupError):
                return
            self.peak_mb = max(self.peak_mb, rss)
            if rss > KILL_MB:
                self.killed = True
                os.kill(self.pid, signal.SIGKILL)
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class WatchedExporter(Exporter):
    """An Exporter whose memory is watched from its first readiness poll, before any scrape can grow it."""

    watch: MemoryWatch | None = None

    def __init__(self, started: list[WatchedExporter], *args) -> None:
        started.append(self)  # stopped after the test even if it never answers (the old exporter did not)
        super().__init__(*args)

    def _answers(self) -> bool:
        if self.watch is None:
            self.watch = MemoryWatch(self.process.pid).start()
        return super()._answers()

    def peak_mb(self) -> float:
        """The larger of VmHWM (the kernel's peak) and the watch's peak."""
        assert self.watch is not None and not self.watch.killed, f"exporter killed above {KILL_MB:.0f} MB RSS"
        return max(procfs.status_mb(self.pid, "VmHWM"), self.watch.peak_mb)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        if hasattr(self, "child"):
            super().stop()


@pytest.fixture
def watched(tmp_path):
    """Factory: ``watched(*flags)`` starts a WatchedExporter; every one started is stopped after the test."""
    started: list[WatchedExporter] = []

    def start(*flags: str) -> WatchedExporter:
        return WatchedExporter(started, tmp_path, *flags)

    yield start
    for exporter in started:
        exporter.stop()


def timed_scrape(exporter: Exporter) -> tuple[float, dict]:
    started = time.monotonic()
    values = exporter.scrape()
    return time.monotonic() - started, values


def target_lines(exporter: Exporter, target: str) -> list[str]:
    return [line for line in exporter.log.read_text().splitlines() if f"target {target} is" in line]


def reasons(values: dict, target: str) -> list[str]:
    """The reason labels of ``batchscope_scrape_error_info`` for ``target``."""
    return [dict(labels)["reason"] for (name, labels), value in values.items()
            if name == "batchscope_scrape_error_info" and dict(labels)["target"] == target and value == 1]


@pytest.mark.parametrize("mode", DOWN_MODES)
def test_a_hostile_metrics_is_up_0_with_its_reason_in_time_memory_and_one_log_line(watched, mode):
    reason, said, scrapes = DOWN_MODES[mode]
    with HostileServer(mode) as server:
        exporter = watched("--vllm-url", server.url, "--scrape-timeout-s", str(TIMEOUT_S))
        for _ in range(scrapes):
            elapsed, values = timed_scrape(exporter)
            assert elapsed <= TIMEOUT_S + MARGIN_S, f"{mode}: a scrape took {elapsed:.2f} s"
            assert values[UP_VLLM] == 0
            assert reasons(values, "vllm") == [reason]
            assert values[("batchscope_scrape_duration_seconds", (("target", "vllm"),))] <= TIMEOUT_S + MARGIN_S
        peak = exporter.peak_mb()
        assert peak <= RSS_BOUND_MB, f"{mode}: peak RSS {peak:.0f} MB"
        lines = wait_until(lambda: target_lines(exporter, "vllm"), message="the down line")
        assert len(lines) == 1 and lines[0].startswith("WARNING") and said in lines[0], lines


def test_ten_concurrent_scrapes_of_a_hanging_upstream_each_answer_in_time(watched):
    with HostileServer("metrics-hang") as server:
        exporter = watched("--vllm-url", server.url, "--scrape-timeout-s", str(TIMEOUT_S))
        with ThreadPoolExecutor(max_workers=10) as scrapers:
            answers = list(scrapers.map(lambda _: timed_scrape(exporter), range(10 * 3)))
    slowest = max(elapsed for elapsed, _ in answers)
    assert slowest <= TIMEOUT_S + MARGIN_S, f"the slowest of 30 scrapes (10 at a time) took {slowest:.2f} s"
    assert all(values[UP_VLLM] == 0 and reasons(values, "vllm") == ["timeout"] for _, values in answers)


def test_a_hostile_load_generator_is_down_alone(watched):
    with HostileServer("metrics-endless") as loadgen, HostileServer("ok") as vllm:
        exporter = watched("--vllm-url", vllm.url, "--loadgen-url", loadgen.url, "--scrape-timeout-s", str(TIMEOUT_S))
        elapsed, values = timed_scrape(exporter)
        assert elapsed <= TIMEOUT_S + MARGIN_S
        assert values[("batchscope_up", (("target", "loadgen"),))] == 0 and values[UP_VLLM] == 1
        assert reasons(values, "loadgen") == ["too_large"] and reasons(values, "vllm") == []
        assert exporter.peak_mb() <= RSS_BOUND_MB


def test_metrics_without_a_charset_are_read_as_utf8(exporters):
    with HostileServer("metrics-no-charset") as server:
        values = exporters("--vllm-url", server.url).scrape()
    assert values[UP_VLLM] == 1 and reasons(values, "vllm") == []
    labels = {dict(labels)["model_name"] for (name, labels), _ in values.items() if name == "vllm:num_requests_running"}
    assert labels == {"modèle"}
