"""The one reader of vLLM's /metrics (batchscope/vllm/scrape.py): bounded against hostile servers, and its parses
over a real vLLM 0.32 exposition."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
import requests

from batchscope.testkit.hostile import HostileServer
from batchscope.vllm import catalogue, scrape
from tests.stubs import HttpStub, Reply

FIXTURE = (Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32-cpu-metrics.txt").read_text()


@pytest.mark.parametrize("mode", ["metrics-endless", "metrics-hang", "metrics-drip", "metrics-huge"])
def test_a_hostile_metrics_endpoint_is_unreadable_within_the_bound(mode):
    with HostileServer(mode) as server, requests.Session() as session:
        started = time.monotonic()
        with pytest.raises(scrape.Unreadable):
            scrape.read_text(session, server.url + "/metrics", timeout_s=1.0, max_bytes=4 << 20)
        assert time.monotonic() - started < 3.0


def test_a_refused_connection_and_an_error_status_are_unreadable():
    with requests.Session() as session:
        with pytest.raises(scrape.Unreadable):
            scrape.read_text(session, "http://127.0.0.1:9/metrics", timeout_s=1.0)
        server = HttpStub(lambda _method, _path: Reply(status=500, body=b"engine dead")).start()
        try:
            with pytest.raises(scrape.Unreadable, match="HTTPError"):
                scrape.read_text(session, server.url + "/metrics", timeout_s=1.0)
        finally:
            server.stop()


def test_a_small_exposition_is_read_whole():
    with HostileServer("ok") as server, requests.Session() as session:
        text = scrape.read_text(session, server.url + "/metrics", timeout_s=2.0)
    assert scrape.sample_sums(text) == {catalogue.NUM_REQUESTS_RUNNING.name: 0.0}


def test_the_parses_of_a_real_exposition_agree():
    sums = scrape.sample_sums(FIXTURE)
    running = catalogue.NUM_REQUESTS_RUNNING.name
    picked = scrape.picked_samples(FIXTURE, (running,))
    assert {sample.name for sample in picked} == {running}
    assert sum(sample.value for sample in picked) == sums[running]
    assert not any(name.endswith("_bucket") for name in scrape.sample_sums(FIXTURE, ("_bucket", "_created")))
    labels = scrape.info_labels(FIXTURE, catalogue.CACHE_CONFIG_INFO.name)
    assert labels is not None and labels["block_size"].isdigit()


def test_what_is_not_an_exposition_is_told():
    with pytest.raises(ValueError, match="malformed"):
        scrape.families("# TYPE vllm:x gauge\nvllm:x not-a-number\n")
    assert scrape.info_labels("not { an exposition", catalogue.CACHE_CONFIG_INFO.name) is None
    assert scrape.info_labels(FIXTURE, "vllm:no_such_info") is None


def test_a_peer_hanging_up_mid_body_is_unreadable():
    """A body cut before its Content-Length, well before the deadline: urllib3's own error, told as Unreadable."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_half() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1000\r\n\r\nvllm")

    server = threading.Thread(target=answer_half, daemon=True)
    server.start()
    with listener, requests.Session() as session, pytest.raises(scrape.Unreadable):
        scrape.read_text(session, f"http://127.0.0.1:{listener.getsockname()[1]}/metrics", timeout_s=5.0)
    server.join(timeout=5)
