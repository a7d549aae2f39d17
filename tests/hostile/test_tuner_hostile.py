"""The tuner's reads of its peers against hostile servers: vLLM's /metrics sampled during a run, and Grafana's
answers to the annotations, each ends within its deadline and byte cap."""

from __future__ import annotations

import logging
import time

import pytest

from batchscope.runs.annotations import GrafanaAnnotator
from batchscope.testkit.hostile import HostileServer
from batchscope.tuner.run.metrics_sampler import fetch_metrics
from tests.conftest import wait_until
from tests.stubs import HttpStub, Reply, json_reply


@pytest.mark.parametrize("mode", ["metrics-endless", "metrics-hang", "metrics-huge"])
def test_a_metrics_read_of_a_hostile_server_is_a_missing_point_within_its_deadline(mode, tmp_path):
    with HostileServer(mode) as server:
        started = time.monotonic()
        point = fetch_metrics(server.url, tmp_path / "metrics.prom", timeout_s=1.0)
        took = time.monotonic() - started
    assert point is None and took < 2.0, took
    assert not (tmp_path / "metrics.prom").exists()


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
