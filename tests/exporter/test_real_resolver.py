"""The exporter against a real resolver that never answers: glibc's, pointed (in a mount namespace of the
exporter's own, so nothing else on the host is touched) at a local DNS server that reads every query and answers
none, as Docker's embedded DNS did for a compose service created but not started. A scrape still ends by the
scrape timeout, with both targets down for a timeout, and a scraper that hangs up early costs no traceback.

Needs root (a mount namespace, port 53 on a loopback address); skipped elsewhere.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from batchscope.testkit.processes import Child, wait_until
from tests.conftest import free_port, samples

pytestmark = pytest.mark.e2e

DNS_ADDRESS = ("127.0.0.77", 53)
NAME = "batchscope-hang"  # every upstream's host is <service>.batchscope-hang.test: no /etc/hosts entry, DNS only
SCRAPE_TIMEOUT_S = 2.0
# one try of 30 s: longer than any deadline here, so only the exporter's own bound can end a scrape in time
RESOLV_CONF = f"nameserver {DNS_ADDRESS[0]}\noptions timeout:30 attempts:1\n"


class SilentDns:
    """A UDP DNS server that reads queries and never answers; ``queries`` holds what arrived."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(DNS_ADDRESS)
        self.sock.settimeout(0.1)  # the reader checks for stop() between reads
        self.queries: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                self.queries.append(self.sock.recv(512))
            except TimeoutError:
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


def namespaces_usable() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=10).returncode == 0


@pytest.fixture
def silent_dns():
    if not namespaces_usable():
        pytest.skip("needs root and unshare -m (a resolv.conf of the exporter's own)")
    try:
        dns = SilentDns()
    except OSError as exc:
        pytest.skip(f"cannot listen on {DNS_ADDRESS}: {exc}")
    yield dns
    dns.stop()


@pytest.fixture
def hanging_exporter(tmp_path, silent_dns):
    """`batchscope exporter` whose vLLM and load generator are names only the silent server would resolve."""
    resolv = tmp_path / "resolv.conf"
    resolv.write_text(RESOLV_CONF)
    port = free_port()
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", 'mount --bind "$0" /etc/resolv.conf && exec "$@"',
            str(resolv), sys.executable, "-m", "batchscope.cli", "exporter", "--port", str(port),
            "--vllm-url", f"http://vllm.{NAME}.test:8000", "--loadgen-url", f"http://locust-master.{NAME}.test:9646",
            "--scrape-timeout-s", str(SCRAPE_TIMEOUT_S)]
    child = Child("exporter", argv, tmp_path / "exporter.log", cwd=Path(__file__).resolve().parents[2])
    wait_until(lambda: "exporter on http://" in child.log(), timeout_s=20, message="exporter up",
               alive=child.check_alive)
    yield child, f"http://127.0.0.1:{port}/metrics"
    child.stop(timeout_s=10)


def test_a_scrape_ends_by_its_timeout_while_the_name_lookups_hang(hanging_exporter, silent_dns):
    child, url = hanging_exporter
    for _ in range(2):  # the second scrape finds the first one's lookups still stuck
        started = time.monotonic()
        reply = requests.get(url, timeout=10)
        elapsed = time.monotonic() - started
        assert reply.status_code == 200 and elapsed < SCRAPE_TIMEOUT_S + 1.0, elapsed
        values = samples(reply.text)
        for target in ("vllm", "loadgen"):
            assert values[("batchscope_up", (("target", target),))] == 0
            assert values[("batchscope_scrape_error_info", (("reason", "timeout"), ("target", target)))] == 1
    # the lookups were real ones, and the resolver really did not answer them
    asked = b"".join(silent_dns.queries)
    assert f"\x04vllm\x0f{NAME}\x04test".encode() in asked
    assert f"\x0dlocust-master\x0f{NAME}\x04test".encode() in asked


def test_a_scraper_that_hangs_up_before_the_answer_costs_no_traceback(hanging_exporter):
    child, url = hanging_exporter
    port = int(url.split(":")[2].split("/")[0])
    for _ in range(3):  # as Prometheus does at each scrape timeout: ask, then close before the answer
        with socket.create_connection(("127.0.0.1", port), timeout=5) as scraper:
            scraper.sendall(b"GET /metrics HTTP/1.1\r\nHost: exporter\r\n\r\n")
            # an abortive close (RST): the exporter's write of the answer then fails at once
            scraper.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    # later scrapes are served as before. The second is a new collection, begun after the one the hung-up
    # scrapers shared had ended and their writes had failed, and it lasts the scrape timeout: by its end, the
    # failed writes' log lines, if any, are in the log
    for _ in range(2):
        assert requests.get(url, timeout=10).status_code == 200
    log = child.log()
    assert "Traceback" not in log and "BrokenPipe" not in log and "ConnectionReset" not in log, log
