"""The tuner's reads of its peers against hostile servers: vLLM's /metrics sampled during a run and read back after
a start, the load generator's client /metrics shown as progress, and Grafana's answers to the annotations, each
ends within its deadline and byte cap."""

from __future__ import annotations

import logging
import time

import pytest

from batchscope.runs.annotations import GrafanaAnnotator
from batchscope.testkit.hostile import HostileServer
from batchscope.tuner.run.metrics_sampler import FETCH_TIMEOUT_S, MetricsSampler, fetch_metrics
from batchscope.tuner.run.progress import read_client
from batchscope.tuner.run.servers import REPORT_READ_S, read_report
from tests.conftest import wait_until
from tests.stubs import HttpStub, Reply, json_reply


@pytest.mark.parametrize("mode", ["metrics-endless", "metrics-hang", "metrics-huge", "metrics-drip"])
def test_a_metrics_read_of_a_hostile_server_is_a_missing_point_within_its_deadline(mode, tmp_path):
    with HostileServer(mode) as server:
        started = time.monotonic()
        point = fetch_metrics(server.url, tmp_path / "metrics.prom", timeout_s=1.0)
        took = time.monotonic() - started
    assert point is None and took < 2.0, took
    assert not (tmp_path / "metrics.prom").exists()


@pytest.mark.parametrize("mode", ["metrics-endless", "metrics-hang", "metrics-drip"])
def test_the_progress_read_of_an_endless_client_metrics_is_none_within_its_deadline(mode):
    with HostileServer(mode) as server:
        started = time.monotonic()
        live = read_client(server.port, timeout_s=1.0)
        took = time.monotonic() - started
    assert live is None and took < 2.0, took


def test_the_sampler_of_an_endless_metrics_keeps_no_point_and_stops_within_one_read(tmp_path):
    with HostileServer("metrics-endless") as server:
        sampler = MetricsSampler(server.url, tmp_path / "metrics.jsonl", interval_s=0.1)
        sampler.start()
        time.sleep(1.0)
        started = time.monotonic()
        sampler.stop()
        took = time.monotonic() - started
    assert not sampler.points and (tmp_path / "metrics.jsonl").read_text() == ""
    assert took < FETCH_TIMEOUT_S + 1.0, took


def test_what_a_server_chose_is_unknown_when_its_metrics_never_ends():
    with HostileServer("metrics-endless") as server:
        started = time.monotonic()
        report = read_report(server.url, "")
        took = time.monotonic() - started
    assert report.block_size is None and report.num_gpu_blocks is None
    assert took < 3 * REPORT_READ_S + 1.0, took


def test_grafanas_endless_error_answer_is_read_within_a_cap_and_the_queue_drains_by_its_deadline(caplog):
    caplog.set_level(logging.WARNING, logger="batchscope.grafana")
    grafana = HttpStub(lambda _method, _path: Reply(status=503, body=b"x" * (32 << 20), content_type="text/plain"))
    grafana.start()
    try:
        annotator = GrafanaAnnotator(grafana.url, max_attempts=2, first_backoff_s=0.01)
        annotator.post("mns-2-r0", 1000.0, ["batchscope"], end_s=1020.5)
        assert annotator.close(timeout_s=10)  # both attempts made and the annotation dropped, well within it
    finally:
        grafana.stop()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(grafana.requests) == 2 and "grafana annotation attempt 1/2 failed: HTTP 503: " + "x" * 200 in warnings
    assert grafana.requests[0].json() == {"time": 1_000_000, "timeEnd": 1_020_500, "tags": ["batchscope"],
                                          "text": "mns-2-r0"}


def test_close_stops_retrying_at_its_deadline_and_says_what_was_not_delivered(caplog):
    grafana = HttpStub(lambda _method, _path: Reply(status=500, body=b"no", content_type="text/plain")).start()
    try:
        annotator = GrafanaAnnotator(grafana.url, first_backoff_s=30)
        annotator.post("never", 1.0, [])
        wait_until(lambda: grafana.requests, timeout_s=5, message="the first attempt")
        started = time.monotonic()
        assert not annotator.close(timeout_s=0.2)
        assert time.monotonic() - started < 1.0
    finally:
        grafana.stop()
    assert "grafana: 1 annotation(s) not delivered within 0.2 s" in [r.getMessage() for r in caplog.records]
    wait_until(lambda: any("dropped after 1 attempts" in r.getMessage() for r in caplog.records), timeout_s=5,
               message="the retry cut short by close")


def test_a_grafana_that_takes_the_annotation_is_delivered_before_close_returns():
    grafana = HttpStub(lambda _method, _path: json_reply({"id": 1})).start()
    try:
        annotator = GrafanaAnnotator(grafana.url)
        for n in range(3):
            annotator.post(f"run {n}", float(n), [])
        assert annotator.close(timeout_s=5)
        assert [r.json()["text"] for r in grafana.requests] == ["run 0", "run 1", "run 2"]
    finally:
        grafana.stop()
