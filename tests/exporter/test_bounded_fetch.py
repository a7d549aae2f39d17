"""Every upstream read of the collector is bounded, in process: a name lookup that hangs holds no scrape past its
timeout and is not started twice, concurrent scrapes share one collection, a /v1/models over its 1 MiB cap is
dropped and said, and a body is decoded in its declared charset, else as UTF-8 (the exposition format's)."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from batchscope.exporter.changes import ChangeTracker
from batchscope.exporter.collector import BatchscopeCollector, ExporterSources
from batchscope.testkit.hostile import HostileServer
from tests.stubs import HttpStub, Reply

TIMEOUT_S = 0.5
MARGIN_S = 1.0
METRICS = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="modèle"} 3.0\n'


def registry_for(vllm_url: str) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(BatchscopeCollector(ExporterSources(vllm_url=vllm_url, timeout_s=TIMEOUT_S), ChangeTracker()))
    return registry


def collect_in_thread(registry: CollectorRegistry) -> tuple[threading.Thread, dict]:
    """Collect on a thread of its own (a collector that never returns must not hang the test)."""
    answer: dict = {}

    def run() -> None:
        started = time.monotonic()
        answer["up"] = registry.get_sample_value("batchscope_up", {"target": "vllm"})
        answer["reason"] = next((s.labels["reason"] for m in registry.collect() for s in m.samples
                                 if m.name == "batchscope_scrape_error_info"), None)
        answer["elapsed_s"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, answer


@pytest.fixture
def hanging_lookup(monkeypatch):
    """socket.getaddrinfo for the host ``hangs.invalid`` blocks until the test ends (a resolver that never
    answers, as glibc's retries do for 10 s and more); returns the count of lookups started."""
    release = threading.Event()
    lookups: list[str] = []
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        if host == "hangs.invalid":
            lookups.append(host)
            release.wait(60)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield lookups
    release.set()


def test_a_name_lookup_that_hangs_holds_no_scrape_past_its_timeout_and_is_not_started_twice(hanging_lookup):
    registry = registry_for("http://hangs.invalid:8000")
    for _ in range(2):
        thread, answer = collect_in_thread(registry)
        thread.join(TIMEOUT_S * 2 + MARGIN_S)  # two collections (up, then the reason), each within its timeout
        assert not thread.is_alive(), "the scrape waited on the name lookup"
        assert (answer["up"], answer["reason"]) == (0, "timeout")
    # four collections, one lookup per route (/metrics, /v1/models, /version): a stuck one is waited on again
    assert len(hanging_lookup) == 3


def test_concurrent_scrapes_share_one_collection():
    with HostileServer("metrics-hang") as server:
        registry = registry_for(server.url)
        threads = [threading.Thread(target=registry.get_sample_value, args=("batchscope_up", {"target": "vllm"}),
                                    daemon=True) for _ in range(10)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT_S + MARGIN_S)
        assert not any(thread.is_alive() for thread in threads)
        assert time.monotonic() - started <= TIMEOUT_S + MARGIN_S
        assert server.seen["/metrics"] == 1


@pytest.mark.parametrize(("content_type", "body"), [
    ("text/plain", METRICS.encode()),  # no charset: the exposition format's UTF-8
    ("text/plain; version=0.0.4; charset=iso-8859-1", METRICS.encode("latin-1")),
])
def test_a_body_is_read_in_its_declared_charset_else_utf8(content_type, body):
    stub = HttpStub(lambda _m, path: Reply(body=body, content_type=content_type) if path == "/metrics"
                    else Reply(status=404)).start()
    try:
        registry = registry_for(stub.url)
        assert registry.get_sample_value("vllm:num_requests_running", {"model_name": "modèle"}) == 3.0
    finally:
        stub.stop()


def test_a_model_card_over_its_cap_is_dropped_and_said(caplog):
    caplog.set_level(logging.INFO, logger="batchscope.exporter")
    with HostileServer("models-huge") as server:  # a valid card of 2 MiB
        registry = registry_for(server.url)
        info = [s.labels for m in registry.collect() for s in m.samples if m.name == "batchscope_vllm_config_info"]
    assert len(info) == 1 and info[0]["served_model_name"] == "" and info[0]["max_model_len"] == ""
    assert info[0]["vllm_version"] == "0.32.0"  # the other routes still count
    lines = [r.getMessage() for r in caplog.records if "/v1/models" in r.getMessage()]
    assert len(lines) == 1 and "larger than the 1 MiB cap" in lines[0], lines
