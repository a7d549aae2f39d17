"""The load shape: which users run, and until when, as the spec's load mode says.

Locust asks the shape every second (``tick``). Closed loop (``concurrency``): all users at once, each delaying its
first request (LoadRun.start_delay), since Locust's spawn rate acts in whole-second batches, too coarse to spread
users over a request's duration. Open loop (``poisson``, ``offline``): one dispatcher per sender, releasing the
arrivals on schedule. The shape also starts the run on its first tick and ends it once the run is over and every
sender has reported its last records.
"""

from __future__ import annotations

import logging
import time

from locust.env import Environment
from locust.runners import MasterRunner

from batchscope.inputs import exits
from batchscope.loadgen.adapter import messages
from batchscope.loadgen.adapter.session import runner_of, sender, session
from batchscope.loadgen.spec import OfflineLoad, SpecError

log = logging.getLogger("batchscope.loadgen")


def tick(environment: Environment, closed_user: type, open_user: type) -> tuple | None:
    """(users, spawn rate, user classes) for now, or None when the run is over (or cannot start)."""
    ctl = session(environment).control
    if ctl is None:
        return None
    ctl.refresh()
    if ctl.start_s is None:
        try:
            ctl.begin()
        except SpecError as exc:
            log.error("%s", exc)
            environment.process_exit_code = exits.BAD_INPUT
            return None
        messages.start_senders(environment, ctl)  # before the users: their senders need the plan
    if not ctl.stopping and ctl.should_end():
        ctl.begin_stop()
    if ctl.stopping and ctl.stopped():
        return None
    load = ctl.spec.load
    if load.mode == "concurrency":
        return load.concurrency, load.concurrency, [closed_user]
    runner = runner_of(environment)
    senders = runner.worker_count if isinstance(runner, MasterRunner) else 1
    return senders, senders, [open_user]


def dispatch_window(environment: Environment) -> tuple[float, float]:
    """(start, end) of this sender's open-loop schedule: warm-up and duration from now; offline's is open."""
    spec = sender(environment).spec
    start = time.time()
    end = float("inf") if isinstance(spec.load, OfflineLoad) else start + spec.warmup_s + spec.duration_s
    return start, end
