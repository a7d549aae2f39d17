"""VllmServer.split_cores on a real process tree shaped like vLLM's: an API server whose children are an engine
core (threads, unbound) and a worker that bound itself to one core, as vLLM's OpenMP binding does."""

from __future__ import annotations

import os
import sys
import time

import pytest

from batchscope.testkit import procfs
from batchscope.testkit.processes import Child, wait_until
from batchscope.testkit.vllm import VllmServer

CORES = os.sched_getaffinity(0)
pytestmark = pytest.mark.skipif(len(CORES) < 2, reason="splitting needs two cores")
BOUND = min(CORES)
# a child that starts a second thread, binds itself first when told to, says so, and waits to be stopped
CHILD = ("import os, sys, threading, time\n"
         "if sys.argv[1] != '-': os.sched_setaffinity(0, {int(sys.argv[1])})\n"
         "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
         "print('up', flush=True); time.sleep(60)\n")
# the API server: starts the engine core and the worker, says so once both are up
SERVER = ("import subprocess, sys\n"
          "kids = [subprocess.Popen([sys.executable, '-c', sys.argv[1], arg], stdout=subprocess.PIPE)\n"
          "        for arg in ('-', sys.argv[2])]\n"
          "assert all(kid.stdout.readline() == b'up\\n' for kid in kids)\n"
          "print('up', flush=True); sys.stdin.read()\n")


@pytest.fixture
def server(request, tmp_path):
    """A stand-in server tree; the parameter is the worker's binding ('-': none)."""
    child = Child("api server", [sys.executable, "-c", SERVER, CHILD, request.param], tmp_path / "server.log",
                  new_session=True, pipe_stdout=True)
    try:
        assert child.read_line(time.monotonic() + 20) == b"up"
        wait_until(lambda: len(child.members()) == 3, timeout_s=10, message="the engine side")
        yield VllmServer("http://127.0.0.1:1", 1, child, ())
    finally:
        child.stop(timeout_s=5)


def engine_side(server: VllmServer) -> list[int]:
    return [pid for pid in server.child.members() if pid != server.child.pid]


@pytest.mark.parametrize("server", [str(BOUND)], indirect=True)
def test_the_engine_side_joins_the_bound_worker_and_the_api_server_gets_the_rest(server):
    front = server.split_cores()
    assert front == CORES - {BOUND}
    for pid in engine_side(server):
        assert procfs.thread_affinities(pid) == [{BOUND}, {BOUND}]  # both threads of each
    assert set(map(frozenset, procfs.thread_affinities(server.child.pid))) == {frozenset(front)}


@pytest.mark.parametrize("server", ["-"], indirect=True)
def test_without_a_bound_worker_nothing_moves(server):
    assert server.split_cores() == CORES
    for pid in [server.child.pid, *engine_side(server)]:
        assert all(cores == CORES for cores in procfs.thread_affinities(pid))


@pytest.mark.parametrize("server", [str(BOUND)], indirect=True)
def test_the_client_runs_beside_the_api_server_inside_and_everywhere_after(server):
    with server.client_beside() as cores:
        assert os.sched_getaffinity(0) == cores == CORES - {BOUND}
    assert os.sched_getaffinity(0) == CORES
