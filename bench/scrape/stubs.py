"""Static HTTP stubs for the bench's upstreams: each serves fixed bytes per path from a thread on loopback."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StaticHandler(BaseHTTPRequestHandler):
    """Answers GET with the server's static bytes for the path (keep-alive and TCP_NODELAY, as uvicorn does)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else each small body waits ~40 ms for the delayed ACK of its headers

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        body = self.server.routes.get(self.path.split("?")[0])  # type: ignore[attr-defined]
        status = 200 if body is not None else 404
        body = body if body is not None else b"not found\n"
        kind = "application/json" if body.startswith(b"{") else "text/plain; version=0.0.4; charset=utf-8"
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args) -> None:
        pass


def start_stub(routes: dict[str, bytes]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), StaticHandler)
    server.daemon_threads = True
    server.routes = routes  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, name="stub", daemon=True).start()
    return server


def base_url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"
