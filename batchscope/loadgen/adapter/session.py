"""One run as this Locust process holds it: a typed session per Environment, and its parts built for the
process's role.

Roles: a *sender* (worker or local runner) runs users and produces records (run/sender.py's LoadRun); the
*controller* (master or local runner) merges reports, serves /metrics, writes records and the summary, and ends
the run (run/control.py's RunControl). A local runner is both. The session lives beside Locust's
Environment (a weak mapping), not in attributes added to it, and Locust's options are only read: what a sender
needs from the controller (its ``SenderPlan``) is handed over in process, or as a message to a worker
(messages.py).
"""

from __future__ import annotations

import argparse
import weakref
from dataclasses import dataclass, replace
from pathlib import Path

import gevent
from locust.env import Environment
from locust.runners import MasterRunner, Runner, WorkerRunner
from prometheus_client import CollectorRegistry

from batchscope.loadgen.adapter.stats import DeferredRequestEvents
from batchscope.loadgen.run import LoadRun, RunControl
from batchscope.loadgen.spec import WorkloadSpec
from batchscope.loadgen.stream import Target
from batchscope.runs import run_ids


@dataclass(frozen=True)
class SenderPlan:
    """What the controller tells every sender at the run's start: the spec as parsed once, the resolved request."""

    spec: WorkloadSpec
    target: Target
    run_id: str
    workers: int  # how many senders share the load (arrivals and users are split by it)

    def to_wire(self) -> dict[str, str | int]:
        # the spec as dumped has its secrets masked: the API key travels in the target's headers
        return {"spec": self.spec.model_dump_json(), "target": self.target.to_json(), "run_id": self.run_id,
                "workers": self.workers}

    @classmethod
    def from_wire(cls, data: dict) -> SenderPlan:
        return cls(spec=WorkloadSpec.model_validate_json(data["spec"]), target=Target.from_json(data["target"]),
                   run_id=data["run_id"], workers=int(data["workers"]))


@dataclass
class Session:
    """What batchscope keeps for the run in this process; a part is None where the role has none (yet)."""

    plan: SenderPlan | None = None  # set at the run's start: a worker's comes as a message, a master keeps its own
    sender: LoadRun | None = None  # built with the first user, from the plan
    events: DeferredRequestEvents | None = None  # the sender's records on their way into Locust's stats
    control: RunControl | None = None  # controller only: built at init from the spec
    registry: CollectorRegistry | None = None  # controller only: the merged client metrics
    stop_requested: bool = False  # the run is ending: a sender built from now on starts no request
    closing: gevent.Greenlet | None = None  # controller only: the run's close (finish.py), from its stop on
    summary_file: str = ""  # controller only: where summary.json was written


_SESSIONS: weakref.WeakKeyDictionary[Environment, Session] = weakref.WeakKeyDictionary()


def session(environment: Environment) -> Session:
    return _SESSIONS.setdefault(environment, Session())


def options_of(environment: Environment) -> argparse.Namespace:
    options = environment.parsed_options
    assert options is not None, "batchscope runs from Locust's command line (or its web UI's form)"
    return options


def runner_of(environment: Environment) -> Runner:
    runner = environment.runner
    assert runner is not None, "batchscope's listeners run after Locust created its runner"
    return runner


def sender(environment: Environment) -> LoadRun:
    """This process's LoadRun, built on first use from the plan (which reaches a worker before its first spawn)."""
    state = session(environment)
    if state.sender is None:
        plan = state.plan
        assert plan is not None, ("the controller's plan comes before the first user "
                                 "(batchscope/loadgen/adapter/messages.py)")
        runner = runner_of(environment)
        worker_index = runner.worker_index if isinstance(runner, WorkerRunner) else 0
        events = DeferredRequestEvents(environment, plan.spec.scenario)
        target = replace(plan.target, worker=worker_index)  # its own prompts
        state.sender = LoadRun(plan.spec, target, run_id=plan.run_id,
                               worker_index=worker_index, workers=plan.workers, on_record=events.add)
        state.events = events
        if state.stop_requested:  # users spawned after the stop came (a signal mid-spawn): they idle
            state.sender.stop_now()
    return state.sender


def sender_plan(environment: Environment, ctl: RunControl) -> SenderPlan:
    """The plan of the run ``ctl`` began; a master's workers share its load (as many as it expects)."""
    assert ctl.target is not None, "a run that began"
    workers = 1
    if isinstance(runner_of(environment), MasterRunner):
        workers = max(1, int(getattr(options_of(environment), "expect_workers", 1) or 1))
    return SenderPlan(ctl.spec, ctl.target, ctl.run_id, workers)


def stop_sender(environment: Environment) -> LoadRun | None:
    """Abort this process's in-flight requests and queue every record left; None before the first user (whose
    sender then starts nothing)."""
    state = session(environment)
    state.stop_requested = True
    if state.sender is None:
        return None
    state.sender.stop_now()
    if state.events is not None:
        state.events.flush()
    return state.sender


class MasterSenders:
    """A master's senders: its workers, stopped by a message; they push their reports."""

    def __init__(self, runner: MasterRunner) -> None:
        self.runner = runner
        self.control: RunControl | None = None

    def request_stop(self) -> None:
        self.runner.send_message("batchscope_stop", None)

    def count(self) -> int:
        # a worker that sent its last records and quit (its own Ctrl-C) still counts among those that finished
        reported = len(self.control.senders) if self.control is not None else 0
        return max(self.runner.worker_count, reported)


class LocalSender:
    """A local runner's one sender: itself; the controller pulls its reports."""

    def __init__(self, environment: Environment) -> None:
        self.environment = environment
        self.control: RunControl | None = None

    def request_stop(self) -> None:
        stop_sender(self.environment)
        self.pull(final=True)

    def count(self) -> int:
        return 1

    def pull(self, final: bool = False) -> None:
        run = session(self.environment).sender  # none before the first user starts
        if run is not None and self.control is not None:
            self.control.merge_report("local", run.report(final=final))


def new_control(environment: Environment, spec: WorkloadSpec) -> RunControl:
    """The controller of this run; ``spec`` as read, with its API key (a dumped spec has its secrets masked)."""
    options = options_of(environment)
    runner = runner_of(environment)
    senders: MasterSenders | LocalSender
    if isinstance(runner, MasterRunner):
        senders = MasterSenders(runner)
        pull = None
    else:
        senders = LocalSender(environment)
        pull = senders.pull
    low, _, high = options.batchscope_ids.partition(",")
    control = RunControl(spec=spec, run_id=options.run_id or run_ids.default_run_id(),
                         host=environment.host or "", out_dir=Path(options.out) if options.out else None,
                         request_stop=senders.request_stop, sender_count=senders.count, pull=pull,
                         ids=(int(low), int(high)) if high else None)
    senders.control = control
    session(environment).control = control
    return control
