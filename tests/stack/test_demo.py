"""scripts/demo on a host that already serves the well-known ports: it measures its own simulator on free ports
(the script, run as a user runs it, against real servers on loopback)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TAKEN_PORTS = (8000, 9648, 9646)  # the simulator's, the exporter's and the client metrics' defaults


class Other(ThreadingHTTPServer):
    """Another server on a fixed port, answering 200 to every GET (a /health included); ``paths`` lists them."""

    daemon_threads = True

    def __init__(self, port: int) -> None:
        self.paths: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                server.paths.append(self.path)
                body = b'{"object": "list", "data": [{"id": "someone-else"}]}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args) -> None:
                pass

        super().__init__(("127.0.0.1", port), Handler)
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def occupy(port: int) -> Other | None:
    """Another server on ``port``, or None where something already uses the port (then it is taken anyway)."""
    with contextlib.suppress(OSError):
        return Other(port)
    return None


def test_the_demo_measures_its_own_simulator_whatever_answers_on_the_default_ports(tmp_path):
    """The demo waited for /health on 8000 and took another server answering there for its simulator."""
    others = [stub for stub in map(occupy, TAKEN_PORTS) if stub is not None]
    try:
        env = {**os.environ, "DEMO_OUT": str(tmp_path / "demo"), "DEMO_WARMUP_S": "0", "DEMO_DURATION_S": "10"}
        done = subprocess.run(["bash", "scripts/demo"], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120)
    finally:
        for stub in others:
            stub.stop()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert not [path for other in others for path in other.paths], "the demo talked to another server"
    summary = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert summary["outcomes"]["ok"] > 0
    for port in TAKEN_PORTS:
        assert f"127.0.0.1:{port}/" not in done.stdout and not done.stdout.count(f"127.0.0.1:{port} ")
