"""Serve a registry over HTTP, always in the classic text format 0.0.4 (whatever the Accept header says).

prometheus_client >= 0.23 answers Prometheus 2.x's OpenMetrics Accept header with escaped names (`vllm_...`);
the classic format keeps `vllm:` names intact. A scraper that hangs up mid-response (its scrape timeout) is a
debug line, not a traceback on stderr.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, generate_latest

from batchscope.exporter.exposition import CONTENT_TYPE

log = logging.getLogger("batchscope.exporter.server")


def make_server(registry: CollectorRegistry, address: tuple, family: socket.AddressFamily = socket.AF_INET
                ) -> ThreadingHTTPServer:
    """An HTTP server (not yet serving) answering /metrics from ``registry``, bound to a socket address of
    ``family`` (batchscope.wire.listen.resolve gives both for a host and port)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            if self.path.split("?")[0] != "/metrics":
                self._reply(404, b"batchscope exporter: metrics are at /metrics\n", "text/plain")
                return
            self._reply(200, generate_latest(registry), CONTENT_TYPE)

        def _reply(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args) -> None:  # scrapes every few seconds would flood the log
            pass

    class Server(ThreadingHTTPServer):
        address_family = family  # an IPv6 --host (::) needs an AF_INET6 socket
        daemon_threads = True

        def handle_error(self, request: socket.socket | tuple[bytes, socket.socket], client_address: tuple) -> None:
            failure = sys.exc_info()[1]
            if isinstance(failure, BrokenPipeError | ConnectionResetError):
                # the scraper gave up (its scrape timeout) while the body was being written: its problem, not ours
                log.debug("scraper %s hung up mid-response: %s", client_address[0], failure)
                return
            super().handle_error(request, client_address)

    return Server(address, Handler)


def serve_in_thread(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="exporter-http", daemon=True)
    thread.start()
    return thread
