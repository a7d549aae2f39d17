"""Why a target is down: the cause of each failure (refused, timeout, HTTP status, unparseable), logged at most
once a minute per target while it stays the same, and once when the target is back."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry

from batchscope.exporter.changes import ChangeTracker
from batchscope.exporter.collector import BatchscopeCollector, ExporterSources
from batchscope.exporter.health import DownCause, DownReporter, shown_url
from tests.conftest import free_port, wait_until
from tests.exporter.clock import Clock
from tests.stubs import HttpStub, Reply

REFUSED = DownCause("refused", "connection refused", "connect")
TIMEOUT = DownCause("timeout", "timeout after 2 s", "timeout")
URL = "http://127.0.0.1:8000/metrics"


@pytest.fixture
def reporter_and_lines(caplog):
    caplog.set_level(logging.INFO, logger="batchscope.exporter")
    clock = Clock()
    reporter = DownReporter(logger=logging.getLogger("batchscope.exporter"), clock=clock, repeat_s=60)

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "batchscope.exporter"]

    return reporter, clock, lines


def test_one_line_per_target_per_minute_while_the_cause_stays_the_same(reporter_and_lines):
    reporter, clock, lines = reporter_and_lines
    for _ in range(30):  # a scrape every 2 s for a minute
        reporter.observe("vllm", URL, REFUSED)
        clock.now += 1.99
    assert lines() == [f"target vllm is down at {URL}: connection refused"]
    clock.now += 1
    reporter.observe("vllm", URL, REFUSED)
    assert lines()[1] == f"target vllm is still down at {URL} for 61 s: connection refused"
    reporter.observe("vllm", URL, REFUSED)
    assert len(lines()) == 2


def test_a_new_cause_is_logged_at_once_and_recovery_once(reporter_and_lines):
    reporter, clock, lines = reporter_and_lines
    reporter.observe("vllm", URL, REFUSED)
    clock.now += 5
    reporter.observe("vllm", URL, TIMEOUT)
    reporter.observe("vllm", URL, TIMEOUT)
    clock.now += 5
    reporter.observe("vllm", URL, None)
    reporter.observe("vllm", URL, None)
    assert lines() == [
        f"target vllm is down at {URL}: connection refused",
        f"target vllm is still down at {URL}, now: timeout after 2 s (was: connection refused)",
        f"target vllm is up again at {URL} after 10 s down (last cause: timeout after 2 s)",
    ]


def test_targets_are_rate_limited_apart(reporter_and_lines):
    reporter, _clock, lines = reporter_and_lines
    for _ in range(3):
        reporter.observe("vllm", URL, REFUSED)
        reporter.observe("loadgen", "http://127.0.0.1:9646/metrics", REFUSED)
    assert [line.split(" is ")[0] for line in lines()] == ["target vllm", "target loadgen"]


def test_an_up_target_logs_nothing(reporter_and_lines):
    reporter, _clock, lines = reporter_and_lines
    reporter.observe("vllm", URL, None)
    assert lines() == []


def test_a_password_in_a_url_is_masked():
    assert shown_url("http://user:s3cret@host:8000/metrics") == "http://user:***@host:8000/metrics"
    assert shown_url(URL) == URL


STUB_REPLIES = {
    "HTTP status": (Reply(status=503, body=b"busy", content_type="text/plain"), "HTTP 503 Service Unavailable"),
    "unparseable": (Reply(body=b'vllm:x{a="1" 1\n', content_type="text/plain"), "unparseable: malformed exposition"),
    "timeout": (Reply(body=b"", content_type="text/plain", delay_s=1.5), "timeout after 0.3 s"),
}


@pytest.mark.parametrize("case", [*STUB_REPLIES, "refused"])
def test_the_collector_logs_the_cause_of_each_failure(caplog, case):
    caplog.set_level(logging.INFO, logger="batchscope.exporter")
    stub = HttpStub(lambda _method, _path: STUB_REPLIES[case][0]).start() if case in STUB_REPLIES else None
    url = stub.url if stub else f"http://127.0.0.1:{free_port()}"
    clock = Clock()
    collector = BatchscopeCollector(ExporterSources(vllm_url=url, timeout_s=0.3), ChangeTracker(),
                                    DownReporter(clock=clock))
    registry = CollectorRegistry()
    registry.register(collector)
    try:
        for _ in range(3):
            assert registry.get_sample_value("batchscope_up", {"target": "vllm"}) == 0
    finally:
        if stub:
            stub.stop()
    down = [r.getMessage() for r in caplog.records if "target vllm" in r.getMessage()]
    expected = STUB_REPLIES[case][1] if stub else "connection refused"
    assert len(down) == 1 and down[0].startswith(f"target vllm is down at {url}/metrics: {expected}"), down


@pytest.mark.e2e
def test_the_exporter_log_says_why_vllm_is_down_and_when_it_is_back(simulator, exporters):
    port = free_port()
    exporter = exporters("--vllm-url", f"http://127.0.0.1:{port}")
    for _ in range(5):
        assert exporter.scrape()[("batchscope_up", (("target", "vllm"),))] == 0
    simulator("--profile", "tiny", "--port", str(port))
    assert exporter.scrape()[("batchscope_up", (("target", "vllm"),))] == 1
    log = wait_until(lambda: "is up again" in exporter.log.read_text() and exporter.log.read_text(),
                     message="recovery line")
    lines = [line for line in log.splitlines() if "target vllm" in line]
    assert len(lines) == 2, log
    assert lines[0].startswith("WARNING") and lines[0].endswith(
        f"target vllm is down at http://127.0.0.1:{port}/metrics: connection refused")
    assert lines[1].startswith("INFO") and "target vllm is up again" in lines[1]
