"""A recording HTTP stub for the Docker stack tier (tests/stack/test_docker_stack.py): test support, not a product.

Two roles, one per container:

- ``grafana``: the stand-in for grafana/grafana. A STUB: only what the stack uses of Grafana, GET /api/health and
  the annotations API (POST /api/annotations as Grafana's admin, by basic auth against GF_SECURITY_ADMIN_USER and
  GF_SECURITY_ADMIN_PASSWORD; GET /api/annotations?tags=...). Annotations are appended to DATA/stub-annotations.jsonl,
  so a data folder its user cannot write fails the request as it would fail Grafana.
- ``webhook``: Alertmanager's webhook receiver: any POST is accepted.

Both record every request they get (method, path, query, the basic-auth user but never a password, the JSON body)
and return the records at GET /_stub/requests. Standard library only: the image has Debian's python3 and nothing
else.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

RECORDS_PATH = "/_stub/requests"
MAX_BODY = 1 << 20  # the stack posts annotations and alert groups of a few KiB


class Recorder:
    """Every request seen, in order, and the annotations kept (thread-safe)."""

    def __init__(self, data: Path | None) -> None:
        self._lock = threading.Lock()
        self.requests: list[dict] = []
        self.annotations: list[dict] = []
        self._annotations_file = data / "stub-annotations.jsonl" if data else None

    def record(self, entry: dict) -> None:
        with self._lock:
            self.requests.append(entry)

    def annotate(self, body: dict) -> int:
        with self._lock:
            annotation = {"id": len(self.annotations) + 1, "time": body["time"], "tags": body["tags"],
                          "text": body["text"]}
            if self._annotations_file is not None:
                with self._annotations_file.open("a") as out:
                    out.write(json.dumps(annotation) + "\n")
            self.annotations.append(annotation)
            return annotation["id"]


def basic_auth_user(header: str | None) -> tuple[str, str] | None:
    """(user, password) of a Basic Authorization header, None for any other."""
    if not header or not header.startswith("Basic "):
        return None
    try:
        user, _, password = base64.b64decode(header[6:]).decode().partition(":")
    except ValueError:
        return None
    return user, password


def valid_annotation(body: object) -> bool:
    """Grafana's POST /api/annotations body as the exporter sends it: time (ms), tags, text."""
    return (isinstance(body, dict) and isinstance(body.get("time"), int) and isinstance(body.get("text"), str)
            and isinstance(body.get("tags"), list) and all(isinstance(tag, str) for tag in body["tags"]))


class Handler(BaseHTTPRequestHandler):
    """Records the request, then answers as the server's role says."""

    server: StubServer

    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        self._handle(None)

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        self._handle(self.rfile.read(min(length, MAX_BODY)))

    def _handle(self, raw: bytes | None) -> None:
        url = urlsplit(self.path)
        body: object = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode(errors="replace")
        credentials = basic_auth_user(self.headers.get("Authorization"))
        if url.path != RECORDS_PATH:
            self.server.recorder.record({"time": time.time(), "method": self.command, "path": url.path,
                                         "query": parse_qs(url.query), "auth_user": credentials and credentials[0],
                                         "body": body})
        status, reply = self.server.answer(self.command, url.path, parse_qs(url.query), credentials, body)
        payload = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the standard library's name)
        pass  # the records are the log; the healthcheck would print a line every 10 s


class StubServer(ThreadingHTTPServer):
    """The HTTP server of one role."""

    daemon_threads = True

    def __init__(self, port: int, role: str, recorder: Recorder) -> None:
        super().__init__(("0.0.0.0", port), Handler)
        self.role = role
        self.recorder = recorder
        self.admin = (os.environ.get("GF_SECURITY_ADMIN_USER", "admin"),
                      os.environ.get("GF_SECURITY_ADMIN_PASSWORD", "admin"))

    def answer(self, method: str, path: str, query: dict[str, list[str]], credentials: tuple[str, str] | None,
               body: object) -> tuple[int, object]:
        if path == RECORDS_PATH:
            return 200, self.recorder.requests
        if self.role == "webhook":
            return (200, {}) if method == "POST" else (405, {"message": "POST only"})
        return self._grafana(method, path, query, credentials, body)

    def _grafana(self, method: str, path: str, query: dict[str, list[str]], credentials: tuple[str, str] | None,
                 body: object) -> tuple[int, object]:
        if path == "/api/health":
            return 200, {"database": "ok", "version": "12.3.1 (batchscope stub)"}
        if path != "/api/annotations":
            return 404, {"message": "Not found (batchscope's Grafana stub implements /api/health and /api/annotations)"}
        if credentials != self.admin:
            return 401, {"message": "Unauthorized"}
        if method == "GET":
            tags = set(query.get("tags", []))
            return 200, [a for a in self.recorder.annotations if tags <= set(a["tags"])]
        if not valid_annotation(body):
            return 400, {"message": "bad annotation: time (ms), tags (strings) and text are required"}
        assert isinstance(body, dict)
        return 200, {"message": "Annotation added", "id": self.recorder.annotate(body)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["grafana", "webhook"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data", type=Path, help="folder the grafana role keeps its annotations in")
    args = parser.parse_args()
    # PID 1 in its container: without a handler SIGTERM is ignored and every `docker compose down` waits 10 s
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    StubServer(args.port, args.role, Recorder(args.data)).serve_forever()


if __name__ == "__main__":
    main()
