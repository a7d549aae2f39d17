"""exporter.process_source against a procfs laid out in a folder (proc= as prometheus_client's ProcessCollector
takes it): which process is the server, what is said when none is, and that a socket seen is not searched twice.
The real /proc is read in tests/exporter/test_process_source.py, against a running simulator."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from batchscope.exporter.process_source import ProcessSource, loopback_port

PORT = 8000
SERVE = ["/venv/bin/python", "/venv/bin/vllm", "serve", "m", "--port", "8000", "--max-num-seqs", "32"]


class FakeProc:
    """A procfs: the TCP tables and, per pid, its parent, argv and descriptors."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "net").mkdir(parents=True)
        self.listen(socket_inode=4242)

    def listen(self, socket_inode: int, port: int = PORT, table: str = "tcp") -> None:
        header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        address = "0100007F" if table == "tcp" else "00000000000000000000000001000000"
        line = (f"   0: {address}:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 "
                f"{socket_inode} 1 0000000000000000 100 0 0 10 0\n")
        (self.root / "net" / table).write_text(header + line)
        (self.root / "net" / ("tcp6" if table == "tcp" else "tcp")).write_text(header)

    def process(self, pid: int, parent: int, argv: list[str], *sockets: int) -> None:
        folder = self.root / str(pid)
        (folder / "fd").mkdir(parents=True)
        (folder / "stat").write_text(f"{pid} (a name) S {parent} {pid} {pid} 0 -1\n")
        (folder / "cmdline").write_bytes(b"\0".join(arg.encode() for arg in argv) + b"\0")
        os.symlink("/dev/null", folder / "fd" / "0")
        for index, inode in enumerate(sockets, start=3):
            os.symlink(f"socket:[{inode}]", folder / "fd" / str(index))


@pytest.fixture
def proc(tmp_path):
    return FakeProc(tmp_path / "proc")


def read(proc: FakeProc, url: str = f"http://127.0.0.1:{PORT}", deadline_s: float = 5.0):
    return ProcessSource(proc.root).read(url, time.monotonic() + deadline_s)


def test_the_server_is_the_oldest_holder_of_the_socket_not_a_forked_child(proc):
    """vLLM's forked engine core holds the listening socket too, under a title that replaced its argv."""
    proc.process(100, 1, SERVE, 4242)
    proc.process(200, 100, ["VLLM::EngineCore_DP0"], 4242)
    proc.process(300, 1, ["bash"])
    assert read(proc).argv == SERVE


def test_a_listener_that_is_not_a_server_command_line_is_said_and_gives_none(proc):
    proc.process(100, 1, ["/usr/bin/docker-proxy", "-proto", "tcp", "-host-port", "8000"], 4242)
    view = read(proc)
    assert view.argv is None
    assert view.why == "process 100, listening on port 8000, is not a `vllm serve` command line"


def test_ipv6_listeners_and_the_simulators_command_line_are_read(proc):
    sim = ["python", "-m", "batchscope.cli", "sim", "serve", "sim-model", "--port", "8000", "--max-num-seqs", "8"]
    proc.listen(socket_inode=777, table="tcp6")
    proc.process(100, 1, sim, 777)
    assert read(proc, f"http://[::1]:{PORT}").argv == sim
    assert read(proc, f"http://localhost:{PORT}").argv == sim


@pytest.mark.parametrize(("url", "why"), [
    ("http://10.0.0.5:8000", "vLLM's host 10.0.0.5 is not this host's loopback"),
    ("http://vllm:8000", "vLLM's host vllm is not this host's loopback"),
    ("http://127.0.0.1:9000", "no process listens on port 9000 in the exporter's network namespace"),
])
def test_without_a_local_listener_the_reason_says_which_case(proc, url, why):
    proc.process(100, 1, SERVE, 4242)
    assert read(proc, url).why == why


def test_a_socket_held_by_no_visible_process_is_said(proc):
    """A server in another PID namespace (a container publishing the port with the host's network)."""
    proc.process(100, 1, ["bash"])
    assert read(proc).why == "no process of this PID namespace holds port 8000's socket"


def test_the_same_socket_is_not_searched_twice_and_a_new_one_is(proc):
    proc.process(100, 1, SERVE, 4242)
    source = ProcessSource(proc.root)
    assert source.read(f"http://127.0.0.1:{PORT}", time.monotonic() + 5).argv == SERVE
    shutil.rmtree(proc.root / "100")  # not read again while the socket is the same
    assert source.read(f"http://127.0.0.1:{PORT}", time.monotonic() + 5).argv == SERVE
    restarted = [*SERVE[:-1], "128"]
    proc.listen(socket_inode=5151)  # a restart: a new socket
    proc.process(101, 1, restarted, 5151)
    assert source.read(f"http://127.0.0.1:{PORT}", time.monotonic() + 5).argv == restarted


def test_a_search_past_its_deadline_gives_none_and_is_tried_again(proc):
    proc.process(100, 1, SERVE, 4242)
    source = ProcessSource(proc.root)
    assert source.read(f"http://127.0.0.1:{PORT}", time.monotonic() - 1).why == (
        "the process on port 8000 was not found in time")
    assert source.read(f"http://127.0.0.1:{PORT}", time.monotonic() + 5).argv == SERVE


def test_loopback_port_defaults_by_scheme():
    assert (loopback_port("http://127.0.0.2"), loopback_port("https://localhost")) == (80, 443)
    assert loopback_port("http://192.168.1.4:8000") is None
