"""The exporter under test: `batchscope exporter` as a child pinned to its core, and one scrape of it as
Prometheus makes it."""

from __future__ import annotations

import contextlib
import http.client
import os
import sys
import time
from pathlib import Path

from batchscope.testkit.processes import Child, SetupError
from scrape.settings import (
    BENCH_CORE,
    EXPORTER_CORE,
    POLL_S,
    PROMETHEUS_ACCEPT,
    REPO,
    SCRAPE_TIMEOUT_S,
    STARTUP_TIMEOUT_S,
)


def start_exporter(vllm_url: str, loadgen_url: str, port: int, log_path: Path) -> Child:
    """`batchscope exporter` alone on EXPORTER_CORE, in a session of its own, blind to BATCHSCOPE_* settings."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("BATCHSCOPE_")}
    args = [sys.executable, "-m", "batchscope.cli", "exporter", "--vllm-url", vllm_url, "--loadgen-url",
            loadgen_url, "--host", "127.0.0.1", "--port", str(port)]
    return Child("exporter", args, log_path, core=EXPORTER_CORE, new_session=True, cwd=REPO, env=env)


def scrape(port: int) -> tuple[float, bytes]:
    """One scrape as Prometheus does it (new connection, its Accept header): (wall seconds, body)."""
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=SCRAPE_TIMEOUT_S)
    try:
        connection.request("GET", "/metrics", headers={"Accept": PROMETHEUS_ACCEPT})
        reply = connection.getresponse()
        body = reply.read()
    finally:
        connection.close()
    elapsed = time.perf_counter() - started
    if reply.status != 200:
        raise SetupError(f"exporter answered {reply.status}: {body[:200]!r}")
    return elapsed, body


def wait_ready(exporter: Child, port: int) -> None:
    """Until the exporter answers a scrape; SetupError when it exits or stays silent for STARTUP_TIMEOUT_S."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        exporter.check_alive()
        with contextlib.suppress(OSError, http.client.HTTPException):
            scrape(port)
            return
        time.sleep(POLL_S)  # the polling interval of a bounded wait
    raise SetupError(f"exporter did not answer within {STARTUP_TIMEOUT_S:.0f} s:\n{exporter.log_tail(2000)}")


def claim_bench_core(bench: str) -> bool:
    """Pin this process to BENCH_CORE, leaving EXPORTER_CORE to the exporter; False (said on stderr) when the
    machine does not give this process both."""
    cores = os.sched_getaffinity(0)
    if not {EXPORTER_CORE, BENCH_CORE} <= cores:
        print(f"{bench}: needs cores {EXPORTER_CORE} and {BENCH_CORE}, have {sorted(cores)}", file=sys.stderr)
        return False
    os.sched_setaffinity(0, {BENCH_CORE})
    return True
