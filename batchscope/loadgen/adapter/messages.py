"""Worker ↔ master messages of a run with workers.

Worker → master: a SenderReport (batchscope/loadgen/run/report.py) rides on each of Locust's periodic reports
(report_to_master → worker_report) and once more in "batchscope_final" when the worker stops.
Master → workers: "batchscope_run" hands every worker the run's SenderPlan (the spec, the resolved request, the
run id) when the run begins, or when the worker connects to a run begun; it is handled in turn with Locust's own
messages, so it comes before the spawn that starts the worker's users. "batchscope_stop" asks every worker to stop
(abort in-flight requests, send the last records). A local runner's sender gets its plan in process.
"""

from __future__ import annotations

import logging
import time

from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

from batchscope.loadgen.adapter.session import SenderPlan, runner_of, sender_plan, session, stop_sender
from batchscope.loadgen.run import WIRE_KEY, RunControl, SenderReport

log = logging.getLogger("batchscope.loadgen")
RUN = "batchscope_run"
STOP = "batchscope_stop"
FINAL = "batchscope_final"


def install_master(environment: Environment, runner: MasterRunner) -> None:
    runner.register_message(FINAL, lambda msg, **_kw: merge(environment, msg.node_id, msg.data), concurrent=True)
    environment.events.worker_report.add_listener(
        lambda client_id, data, **_kw: merge(environment, client_id, data.get(WIRE_KEY)))
    # fired before Locust sends a late worker its spawn: the plan reaches it first
    environment.events.worker_connect.add_listener(lambda client_id, **_kw: send_plan(environment, client_id))


def start_senders(environment: Environment, ctl: RunControl) -> None:
    """The run began: every sender gets its plan (a local runner's in process, a master's workers by message)."""
    session(environment).plan = sender_plan(environment, ctl)
    if isinstance(runner_of(environment), MasterRunner):
        send_plan(environment)


def send_plan(environment: Environment, client_id: str | None = None) -> None:
    """The plan to one worker, or to all; none before the run begins (a worker connected then gets it with all)."""
    plan = session(environment).plan
    if plan is not None:
        runner_of(environment).send_message(RUN, plan.to_wire(), client_id=client_id)


def merge(environment: Environment, sender_id: str, wire: dict | None) -> None:
    ctl = session(environment).control
    if ctl is not None and wire:
        ctl.merge_report(sender_id, SenderReport.from_wire(wire))


def install_worker(environment: Environment, runner: WorkerRunner) -> None:
    # not concurrent: handled before the spawn message that follows it
    runner.register_message(RUN, lambda msg, **_kw: receive_plan(environment, msg.data))
    runner.register_message(STOP, lambda msg, **_kw: stop_worker(environment), concurrent=True)
    environment.events.report_to_master.add_listener(lambda data, **_kw: attach_report(environment, data))
    # quitting fires in reverse order of registration: added after Locust's own listener (which tells the
    # master this worker quits), this one runs first, so the last records reach the master before the quit.
    # Covers a quit from the master and a SIGTERM to the worker alike.
    environment.events.quitting.add_listener(lambda **_kw: stop_worker(environment))


def receive_plan(environment: Environment, wire: dict) -> None:
    state = session(environment)
    if state.plan is None:  # one run per process: a repeated plan (a reconnect) changes nothing
        state.plan = SenderPlan.from_wire(wire)


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
