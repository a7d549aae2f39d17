"""Signals and the tuner's cleanup: the first SIGINT/SIGTERM interrupts a run at once, except inside the cleanup
that stops the load and the server, which finishes first (a server left running holds the GPU and the port).
Real signals to this process, a real simulator."""

from __future__ import annotations

import os
import signal

import pytest

from batchscope.tuner.plan import Plan
from batchscope.tuner.plan.order import plan_runs
from batchscope.tuner.run.one_run import run_one
from batchscope.tuner.run.progress import Progress
from batchscope.tuner.run.servers import make_server
from batchscope.tuner.run.stopping import Interrupted, StopOnSignal, signals_deferred
from tests.tuner.support import tiny_plan


def interrupt_self() -> None:
    os.kill(os.getpid(), signal.SIGINT)  # the handler runs before the next line of Python


def test_a_signal_interrupts_at_once_outside_a_cleanup_and_after_it_inside_one():
    steps: list[str] = []
    with StopOnSignal(), pytest.raises(Interrupted, match="SIGINT"):
        interrupt_self()
        steps.append("after an undeferred signal")
    assert steps == []

    with StopOnSignal(), pytest.raises(Interrupted, match="SIGTERM"):
        with signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            steps.append("cleanup, part one")
            with signals_deferred():  # nested: raised when the outermost ends
                steps.append("cleanup, part two")
            steps.append("cleanup, part three")
        steps.append("after the cleanup")
    assert steps == ["cleanup, part one", "cleanup, part two", "cleanup, part three"]


def test_outside_a_stop_on_signal_block_the_cleanup_changes_nothing():
    with signals_deferred():
        pass  # no handler installed: Python's own (KeyboardInterrupt) stays in place
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


class SignalWhileStopping(Progress):
    """The progress display; the user presses Ctrl-C just as the run's cleanup begins."""

    def set_phase(self, phase: str) -> None:
        super().set_phase(phase)
        if phase == "stopping":
            interrupt_self()


def test_ctrl_c_during_a_runs_cleanup_still_stops_the_server(tmp_path):
    plan = Plan.model_validate(tiny_plan())
    run = plan_runs(plan)[0]
    server = make_server(plan.backend)
    with StopOnSignal(), SignalWhileStopping(total=1) as progress, pytest.raises(Interrupted):
        run_one(plan, run, tmp_path / run.name, server, progress)
    assert not server.alive()  # stopped before the interruption went on
