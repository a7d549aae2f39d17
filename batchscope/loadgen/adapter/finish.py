"""The end of a run on the controller: the summary (written and printed when the run stops, by its end or the
web UI's Stop button) and the process's exit status (when Locust quits).

Exit status (batchscope/inputs/exits.py): OK, or UNBALANCED when started != sum of outcomes, RUN_FAILED when the
summary names a failure, INTERRUPTED after a signal. Failed requests under the spec's threshold are outcomes,
not a crash: Locust's own "some requests failed" status 1 becomes OK.
"""

from __future__ import annotations

import logging

import gevent
from locust.env import Environment
from locust.runners import WorkerRunner
from prometheus_client import generate_latest

from batchscope.inputs import exits
from batchscope.loadgen.adapter.interrupts import finish_stop
from batchscope.loadgen.adapter.session import Session, session
from batchscope.loadgen.figures import Summary, print_summary

log = logging.getLogger("batchscope.loadgen")


def on_test_stop(environment: Environment, **_kwargs) -> None:
    """Listener of Locust's test_stop event: a run that began is closed now, in its own greenlet (its senders'
    last reports arrive meanwhile), not when Locust quits, which a web UI's process does only when told."""
    state = session(environment)
    ctl = state.control
    if ctl is None or ctl.start_s is None or isinstance(environment.runner, WorkerRunner) \
            or state.closing is not None:
        return
    state.closing = gevent.spawn(close_run, state)


def close_run(state: Session) -> Summary | None:
    """Collect the last records, write summary.json and metrics.prom, print the summary; once per run."""
    ctl = state.control
    assert ctl is not None
    finish_stop(ctl)
    summary = ctl.close()
    if summary is None:
        return None
    if ctl.out_dir is not None:
        state.summary_file = str(ctl.out_dir / "summary.json")
        if state.registry is not None:
            # the merged client metrics as they stood at the end, for after-the-fact use
            (ctl.out_dir / "metrics.prom").write_bytes(generate_latest(state.registry))
    print_summary(summary)
    return summary


def on_quitting(environment: Environment, **_kwargs) -> None:
    """Listener of Locust's quitting event: the run closed if its stop did not (a run that never began: none)."""
    state = session(environment)
    if state.control is None or isinstance(environment.runner, WorkerRunner):
        return
    summary = state.closing.get() if state.closing is not None else close_run(state)
    if summary is not None:
        environment.process_exit_code = exit_code(summary, environment.process_exit_code)


def exit_code(summary: Summary, current: int | None) -> int | None:
    """The status the run ends with, given the summary and the status set so far (a signal's, Locust's)."""
    if not summary.balanced:
        log.error("started %d requests but %d ended in an outcome", summary.started, sum(summary.outcomes.values()))
        return exits.UNBALANCED
    if current == exits.INTERRUPTED:
        log.warning("run interrupted: the summary covers it up to the signal")
        return current
    if summary.failure:
        log.error("run failed: %s", summary.failure)
        return exits.RUN_FAILED
    if current is None or current == 1:
        return exits.OK
    return current
