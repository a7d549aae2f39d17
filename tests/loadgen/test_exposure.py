"""What a run exposes: the master's worker port listens on loopback only, and the API key is sent to the server
but written nowhere (summary, records, console, Locust's files, client metrics)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import requests
import yaml

from tests.conftest import free_port, wait_until
from tests.loadgen.support import streams_running

pytestmark = pytest.mark.e2e
SPEC = {"input_tokens": 64, "output_tokens": 40, "timeout_s": 30, "duration_s": 5,
        "load": {"mode": "concurrency", "concurrency": 4}}


def listeners_on(port: int) -> set[str]:
    """Local addresses (hex, as the kernel lists them) of the TCP sockets listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found



def run_with_key(tmp_path: Path, sim_url: str, spec: dict, env: dict, workers: int) -> tuple[str, str, Path, set]:
    """Run to the end; returns the console output, a mid-run /metrics scrape, the out dir, the master's binds."""
    spec_path, out, port, master_port = tmp_path / "spec.yaml", tmp_path / "out", free_port(), free_port()
    spec_path.write_text(yaml.safe_dump(spec))
    load = subprocess.Popen([sys.executable, "-m", "batchscope.cli", "load", "--spec", str(spec_path), "--host",
                             sim_url, "--workers", str(workers), "--out", str(out), "--metrics-port", str(port),
                             "--master-port", str(master_port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **env})
    try:
        # mid-run: the server streams (a worker's first report to the master can take 3 s, the run 5)
        wait_until(lambda: streams_running(sim_url), timeout_s=30, message="requests in flight")
        metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        binds = listeners_on(master_port)
        output, _ = load.communicate(timeout=120)
    finally:
        load.kill()
    assert load.returncode == 0, output[-3000:]
    return output, metrics, out, binds


def test_the_master_listens_for_workers_on_loopback_only(simulator, tmp_path):
    sim = simulator("--profile", "tiny")
    *_, binds = run_with_key(tmp_path, sim.url, SPEC, {}, workers=2)
    assert binds == {"0100007F"}  # 127.0.0.1, and no wildcard (00000000) nor IPv6 listener


@pytest.mark.parametrize("where", ["spec", "env"])
def test_the_api_key_is_sent_but_written_nowhere(simulator, tmp_path, where):
    key = f"sk-planted-{uuid.uuid4().hex}"
    sim = simulator("--profile", "tiny", "--api-key", key)
    spec = {**SPEC, "api_key": key} if where == "spec" else SPEC
    env = {"BATCHSCOPE_API_KEY": key} if where == "env" else {"BATCHSCOPE_API_KEY": ""}
    output, metrics, out, _ = run_with_key(tmp_path, sim.url, spec, env, workers=2)
    summary = (out / "summary.json").read_text()
    assert '"ok": 0' not in summary  # the server took the key: requests succeeded
    assert '"api_key": "***"' in summary if where == "spec" else '"api_key": null' in summary
    written = {path.name: path.read_bytes() for path in out.iterdir()}
    assert {"summary.json", "records.jsonl", "metrics.prom", "locust_stats.csv"} <= set(written)
    leaks = [name for name, data in written.items() if key.encode() in data]
    leaks += [name for name, text in (("console", output), ("/metrics", metrics)) if key in text]
    assert not leaks
