"""The LLM tab's read of the server's /metrics against hostile servers (batchscope.testkit.hostile): an
endless, dripping or hanging answer ends within SERVER_TIMEOUT_S (+ slack) and the byte cap, and the server
shows as unreachable; a well-formed answer after it is read again. A charted latency draws the table's digits."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from batchscope.loadgen.adapter.llm_tab import (
    MS_DECIMALS,
    SERVER_TIMEOUT_S,
    ServerMetrics,
    charted_milliseconds,
    milliseconds,
)
from batchscope.testkit.hostile import HostileServer
from batchscope.wire.bounded_read import METRICS_MAX_BYTES

SLACK_S = 1.0  # a shared 2-core machine's scheduling
# the body within its cap plus the bytearray's growth, the server thread's 1 MiB pieces in flight
PEAK_BYTES = 2 * METRICS_MAX_BYTES


@pytest.mark.parametrize("mode", ["metrics-endless", "metrics-huge", "metrics-drip", "metrics-hang"])
def test_a_hostile_metrics_read_ends_in_bounded_time_and_memory_as_unreachable(mode):
    with HostileServer(mode) as server:
        metrics = ServerMetrics(server.url)
        tracemalloc.start()
        try:
            started = time.monotonic()
            metrics.read(0.0, force=True)
            took = time.monotonic() - started
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert took < SERVER_TIMEOUT_S + SLACK_S
    assert peak < PEAK_BYTES
    assert metrics.reachable is False and metrics.latest is None


def test_a_good_answer_reads_as_reachable():
    with HostileServer("ok") as server:
        metrics = ServerMetrics(server.url)
        metrics.read(0.0, force=True)
    assert metrics.reachable is True
    assert metrics.latest is not None and metrics.latest.running == 0.0


@pytest.mark.parametrize("seconds", [0.001095000001, 0.0010949999, 0.0123449999, 0.2, 1.23456, 0.0])
def test_a_charted_latency_draws_the_tables_digits(seconds):
    # the browser formats a legend's value with toFixed(MS_DECIMALS), which for these values is Python's format
    assert f"{charted_milliseconds(seconds):.{MS_DECIMALS}f}" == milliseconds(seconds)
