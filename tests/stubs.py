"""A small local HTTP stub for the boundaries nothing here can run (Grafana's API, the Docker engine) and for
misbehaving targets. It records every request and answers from a routing function."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    delay_s: float = 0.0


@dataclass
class HttpStub:
    """``route(method, path) -> Reply``; ``requests`` lists what arrived."""

    route: Callable[[str, str], Reply]
    requests: list[Recorded] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> HttpStub:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                stub.requests.append(Recorded(self.command, self.path, dict(self.headers), body))
                reply = stub.route(self.command, self.path)
                if reply.delay_s:
                    threading.Event().wait(reply.delay_s)  # a slow upstream, on purpose
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            do_GET = do_POST = do_DELETE = _handle  # noqa: N815

            def log_message(self, *_args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        # a short poll: stop() returns within 20 ms instead of serve_forever's default half second
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def json_reply(data, status: int = 200) -> Reply:
    return Reply(status=status, body=json.dumps(data).encode())
