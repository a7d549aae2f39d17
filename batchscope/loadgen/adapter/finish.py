"""The end of a run on the controller: the summary (printed and written) and the process's exit status.

Exit status (batchscope/inputs/exits.py): OK, or UNBALANCED when started != sum of outcomes, RUN_FAILED when the
summary names a failure, INTERRUPTED after a signal. Failed requests under the spec's threshold are outcomes,
not a crash: Locust's own "some requests failed" status 1 becomes OK.
"""

from __future__ import annotations

import logging

from locust.env import Environment
from locust.runners import WorkerRunner
from prometheus_client import generate_latest

from batchscope.inputs import exits
from batchscope.loadgen.adapter.interrupts import finish_stop
from batchscope.loadgen.adapter.session import session
from batchscope.loadgen.figures import Summary, print_summary

log = logging.getLogger("batchscope.loadgen")


def on_quitting(environment: Environment, **_kwargs) -> None:
    """Listener of Locust's quitting event."""
    state = session(environment)
    ctl = state.control
    if ctl is None or isinstance(environment.runner, WorkerRunner):
        return
    finish_stop(ctl)
    summary = ctl.close()
    if summary is None:
        return
    if ctl.out_dir is not None and state.registry is not None:
        # the merged client metrics as they stood at the end, for after-the-fact use
        (ctl.out_dir / "metrics.prom").write_bytes(generate_latest(state.registry))
    print_summary(summary)
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
