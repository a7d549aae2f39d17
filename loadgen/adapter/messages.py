"""Worker ↔ master messages of a run with workers.

Worker → master: a SenderReport (loadgen/report.py) rides on each of Locust's periodic reports
(report_to_master → worker_report) and once more in "batchscope_final" when the worker stops.
Master → workers: "batchscope_stop" asks every worker to stop (abort in-flight requests, send the last records).
"""

from __future__ import annotations

import logging
import time

from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

from loadgen.adapter.session import runner_of, session, stop_sender
from loadgen.report import WIRE_KEY, SenderReport

log = logging.getLogger("batchscope.loadgen")
STOP = "batchscope_stop"
FINAL = "batchscope_final"


def install_master(environment: Environment, runner: MasterRunner) -> None:
    runner.register_message(FINAL, lambda msg, **_kw: merge(environment, msg.node_id, msg.data), concurrent=True)
    environment.events.worker_report.add_listener(
        lambda client_id, data, **_kw: merge(environment, client_id, data.get(WIRE_KEY)))


def merge(environment: Environment, sender_id: str, wire: dict | None) -> None:
    ctl = session(environment).control
    if ctl is not None and wire:
        ctl.merge_report(sender_id, SenderReport.from_wire(wire))


def install_worker(environment: Environment, runner: WorkerRunner) -> None:
    runner.register_message(STOP, lambda msg, **_kw: stop_worker(environment), concurrent=True)
    environment.events.report_to_master.add_listener(lambda data, **_kw: attach_report(environment, data))
    # quitting fires in reverse order of registration: added after Locust's own listener (which tells the
    # master this worker quits), this one runs first, so the last records reach the master before the quit.
    # Covers a quit from the master and a SIGTERM to the worker alike.
    environment.events.quitting.add_listener(lambda **_kw: stop_worker(environment))


def attach_report(environment: Environment, data: dict) -> None:
    """Worker side of report_to_master: add this worker's delta to Locust's periodic report."""
    run = session(environment).sender
    if run is not None:
        data[WIRE_KEY] = run.report().to_wire()


def stop_worker(environment: Environment) -> None:
    """Abort this worker's in-flight requests and send every record left; harmless when repeated.

    A worker stopped before its first user (a signal while the master spawns) has nothing to send, and says so:
    the master would otherwise wait out FINAL_REPORT_TIMEOUT_S for it.
    """
    run = stop_sender(environment)  # Locust's own final report carries the queued stats to the master
    report = run.report(final=True) if run is not None else SenderReport(final=True, at_s=time.time(),
                                                                          cpu_s=time.process_time())
    runner_of(environment).send_message(FINAL, report.to_wire())


def quit_worker(environment: Environment) -> None:
    log.info("SIGINT: this worker's in-flight requests count as aborted; quitting")
    stop_worker(environment)
    runner_of(environment).quit()
