"""Signals: SIGINT or SIGTERM to the controller ends the run as its duration would (in-flight requests aborted
and counted, every sender's last records collected, summary written), with exit status 130. A worker hit by
SIGINT (a terminal's Ctrl-C reaches the whole process group) or SIGTERM sends its last records before it quits.

Locust's default Ctrl-C raises KeyboardInterrupt in whichever greenlet runs (a request's, the /metrics server's)
and its SIGTERM handler comes only after a headless run's shape ends: both are taken over here.
"""

from __future__ import annotations

import logging
import signal

import gevent
from locust.env import Environment

from batchscope.inputs import exits
from batchscope.loadgen.adapter.messages import quit_worker
from batchscope.loadgen.adapter.session import runner_of, session
from batchscope.loadgen.run import RunControl

log = logging.getLogger("batchscope.loadgen")
POLL_S = 0.05


def install_controller(environment: Environment) -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        gevent.signal_handler(signum, end_on_signal, environment, signum)


def install_worker(environment: Environment) -> None:
    # Locust would end a worker on the spot (KeyboardInterrupt), its in-flight requests and unsent records
    # lost: report everything, then quit (SIGTERM goes through Locust's quitting event,
    # messages.py)
    gevent.signal_handler(signal.SIGINT, quit_worker, environment)


def end_on_signal(environment: Environment, signum: int) -> None:
    if environment.process_exit_code == exits.INTERRUPTED:
        return  # a second Ctrl-C: the first is already ending the run (bounded by FINAL_REPORT_TIMEOUT_S)
    ctl = session(environment).control
    if ctl is not None and ctl.stopping and ctl.stopped():
        # the run ended by itself (its web UI kept Locust up): quitting now interrupts nothing
        _quit(environment)
        return
    environment.process_exit_code = exits.INTERRUPTED
    log.warning("%s: run interrupted; in-flight requests count as aborted", signal.Signals(signum).name)
    if ctl is not None:
        finish_stop(ctl)
    _quit(environment)


def _quit(environment: Environment) -> None:
    runner_of(environment).quit()
    if environment.web_ui is not None:
        environment.web_ui.stop()  # the web UI's greenlet is what keeps Locust's main loop waiting


def finish_stop(ctl: RunControl) -> None:
    """Quitting early (Ctrl-C, SIGTERM, the UI's stop): abort what is in flight and collect it first."""
    if ctl.start_s is None:
        return
    if not ctl.stopping:
        ctl.begin_stop()
    while not ctl.stopped():  # bounded: stopped() turns true at the final-report deadline
        gevent.sleep(POLL_S)
