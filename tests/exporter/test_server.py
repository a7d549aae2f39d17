"""exporter.server: /metrics in the classic text format 0.0.4 whatever the scraper asks, anything else 404;
an IPv6 address gets an IPv6 socket."""

from __future__ import annotations

import logging
import socket
import struct

import pytest
import requests
from prometheus_client import CollectorRegistry, Gauge

from batchscope.exporter.exposition import CONTENT_TYPE
from batchscope.exporter.server import make_server, serve_in_thread
from tests.conftest import wait_until

OPENMETRICS_ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


@pytest.fixture
def served():
    registry = CollectorRegistry()
    Gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
          registry=registry).set(3)
    server = make_server(registry, ("127.0.0.1", 0))
    serve_in_thread(server)
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_metrics_are_the_classic_text_format_even_when_openmetrics_is_asked(served):
    reply = requests.get(served + "/metrics", headers={"Accept": OPENMETRICS_ACCEPT}, timeout=5)
    assert reply.status_code == 200 and reply.headers["Content-Type"] == CONTENT_TYPE
    assert "vllm:num_requests_running 3.0\n" in reply.text  # the colon kept, no escaping into vllm_...


def test_any_other_path_is_404_with_a_hint(served):
    reply = requests.get(served + "/", timeout=5)
    assert reply.status_code == 404 and "/metrics" in reply.text


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 on this machine")
def test_an_ipv6_address_is_served_on_an_ipv6_socket():
    try:
        server = make_server(CollectorRegistry(), ("::1", 0, 0, 0), socket.AF_INET6)
    except OSError:
        pytest.skip("::1 is not configured")
    try:
        assert server.socket.family == socket.AF_INET6
    finally:
        server.server_close()


def test_a_scraper_hanging_up_mid_response_is_a_quiet_debug_line(capfd, caplog):
    """A scraper that times out closes its socket mid-body: the write fails with a broken pipe or a reset,
    which is the scraper's business; it is logged at debug, with no traceback on the exporter's stderr."""
    registry = CollectorRegistry()
    big = Gauge("vllm:big", "A body far larger than the socket buffers.", ["filler"], registry=registry)
    for index in range(1000):
        big.labels(f"{index:04d}" + "x" * 16_000).set(index)
    server = make_server(registry, ("127.0.0.1", 0))
    serve_in_thread(server)
    caplog.set_level(logging.DEBUG, logger="batchscope.exporter.server")
    try:
        with socket.socket() as client:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            client.connect(server.server_address)
            client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert client.recv(1024).startswith(b"HTTP/1.0 200")
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        stderr: list[str] = []

        def ours() -> bool:  # a traceback through this server (a stub of an earlier test may still print its own)
            return "batchscope/exporter/server.py" in "".join(stderr)

        def settled() -> bool:
            stderr.append(capfd.readouterr().err)
            return ours() or any("hung up" in r.getMessage() for r in caplog.records)

        wait_until(settled, message="the failed write to be handled")
        assert not ours(), "".join(stderr)
        assert requests.get(f"http://127.0.0.1:{server.server_address[1]}/metrics", timeout=10).status_code == 200
    finally:
        server.shutdown()
        server.server_close()
