"""/proc readers on a fixture tree (so the figures are known) and on this very process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from batchscope.testkit import procfs


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """A /proc with two processes of group 40 (one a zombie), one of group 7, and two CPUs."""
    for pid, state, pgrp, utime, stime in ((40, "S", 40, 300, 100), (41, "Z", 40, 5, 5), (50, "R", 7, 1, 2)):
        (tmp_path / str(pid)).mkdir()
        # a command name with spaces and a parenthesis, as /proc allows
        fields = [state, "1", str(pgrp), "0", "0", "0", "0", "0", "0", "0", "0", str(utime), str(stime)]
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (odd) name) " + " ".join(fields) + " 0 0\n")
        (tmp_path / str(pid) / "status").write_text("Name:\todd\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n")
    (tmp_path / "self").mkdir()  # not a pid: ignored
    (tmp_path / "stat").write_text("cpu  9 9 9 9 9 9 9 9 0 0\n"
                                   "cpu0 100 0 50 1000 7 10 20 20 0 0\n"
                                   "cpu1 1 1 1 5000 0 0 0 0 0 0\n")
    return tmp_path


def test_cpu_time_is_utime_plus_stime_of_all_threads(proc):
    assert procfs.cpu_ticks(40, proc) == 400
    assert procfs.cpu_seconds(40, proc) == pytest.approx(400 / procfs.CLK_TCK)


def test_total_cpu_counts_a_vanished_process_as_zero(proc):
    assert procfs.total_cpu_seconds([40, 50, 99999], proc) == pytest.approx(403 / procfs.CLK_TCK)


def test_memory_lines_in_megabytes(proc):
    assert procfs.status_mb(40, "VmRSS", proc) == 100.0
    assert procfs.status_mb(40, "VmHWM", proc) == 200.0
    with pytest.raises(ProcessLookupError, match="no VmSwap"):
        procfs.status_mb(40, "VmSwap", proc)


def test_core_busy_time_leaves_out_idle_and_iowait(proc):
    assert procfs.core_busy_seconds(proc) == {0: pytest.approx(200 / procfs.CLK_TCK),
                                              1: pytest.approx(3 / procfs.CLK_TCK)}


def test_group_members_are_the_live_processes_of_the_group(proc):
    assert procfs.group_members(40, proc) == [40]
    assert procfs.group_members(7, proc) == [50]


def test_this_process_is_readable():
    assert procfs.cpu_seconds(os.getpid()) > 0
    assert procfs.status_mb(os.getpid(), "VmRSS") > 1
    assert os.getpid() in procfs.group_members(os.getpgid(0))
