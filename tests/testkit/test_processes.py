"""Waiting with a deadline, and children stopped with their whole process group."""

from __future__ import annotations

import os
import sys
import time

import pytest

from batchscope.testkit import procfs
from batchscope.testkit.processes import Child, SetupError, wait_until
from batchscope.wire.listen import free_port


def test_wait_until_returns_the_first_truthy_value():
    values = iter([0, None, "", 5])
    assert wait_until(lambda: next(values), timeout_s=5, interval_s=0) == 5


def test_wait_until_names_what_it_waited_for_at_the_deadline():
    started = time.monotonic()
    with pytest.raises(SetupError, match="timed out after 0.05s waiting for the thing"):
        wait_until(lambda: False, timeout_s=0.05, interval_s=0.01, message="the thing")
    assert time.monotonic() - started < 1


def test_wait_until_stops_at_once_when_what_it_waits_on_died():
    def dead() -> None:
        raise SetupError("server exited early")

    with pytest.raises(SetupError, match="exited early"):
        wait_until(lambda: False, timeout_s=30, alive=dead)


def test_free_port_can_be_bound():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))


@pytest.mark.e2e
def test_a_child_in_its_own_session_is_stopped_with_its_grandchildren(tmp_path):
    # it waits on a signal, not on stdin: CI's stdin is at its end, and the child would exit at once
    script = "import signal, subprocess; subprocess.Popen(['sleep', '60']); print('up', flush=True); signal.pause()"
    child = Child("sleeper", [sys.executable, "-c", script], tmp_path / "sleeper.log", new_session=True,
                  pipe_stdout=True, core=sorted(os.sched_getaffinity(0))[0])
    assert child.read_line(time.monotonic() + 10) == b"up"
    members = wait_until(lambda: len(m := child.members()) == 2 and m, timeout_s=10, message="the grandchild")
    assert child.pid in members and child.cpu_seconds() >= 0
    child.stop(timeout_s=5)
    assert not child.alive() and procfs.group_members(child.pid) == []
    with pytest.raises(SetupError, match="sleeper exited early"):
        child.check_alive()
