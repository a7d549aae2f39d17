"""exporter.server: /metrics in the classic text format 0.0.4 whatever the scraper asks, anything else 404;
an IPv6 address gets an IPv6 socket."""

from __future__ import annotations

import socket

import pytest
import requests
from prometheus_client import CollectorRegistry, Gauge

from batchscope.exposition import CONTENT_TYPE
from exporter.server import make_server, serve_in_thread

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
