"""Locust entry point: fixed streaming load against a vLLM-compatible server, as the workload spec says.

    locust -f batchscope/loadgen/adapter/locustfile.py --spec spec.yaml --host http://127.0.0.1:8000  # web UI
    batchscope load --spec spec.yaml --workers 2 --out out/                                        # headless

The users only say *what* runs; timing, metrics, records and the end of the run hang off Locust's events
(listeners.py registers them on import); the load shape is shape.py.
"""

import time

import gevent
from locust import LoadTestShape, User, constant, task

import batchscope.loadgen.adapter.listeners  # noqa: F401 (registers batchscope's options and event listeners)
from batchscope.loadgen.adapter import shape
from batchscope.loadgen.adapter.session import sender
from batchscope.loadgen.stream import ConnectionPool


class StreamingUser(User):
    """Closed loop (load mode `concurrency`): one request in flight per user, no think time."""

    wait_time = constant(0)

    connections: ConnectionPool | None = None

    def on_start(self) -> None:
        run = sender(self.environment)
        gevent.sleep(run.start_delay())  # the spec's ramp_up_s
        # connected before the first request's time is taken: a connect yields to every other greenlet, so at
        # 256 streams started together the last first request went out 20-60 ms after its time, all of it in TTFT
        self.connections = run.connection_pool()
        self.connections.prepare()

    @task
    def generate(self) -> None:
        run = sender(self.environment)
        self.connections = self.connections or run.connection_pool()
        if run.accepting:
            # a dead server or one rejecting every request: wait instead of spinning (LoadRun.pause_after)
            gevent.sleep(run.pause_after(run.run_one(self.connections, time.time())))
        else:
            gevent.sleep(0.1)  # the run is ending: idle until Locust stops the user


class ArrivalDispatcher(User):
    """Open loop (load modes `poisson`, `offline`): one per worker, releasing arrivals on schedule."""

    wait_time = constant(0)

    @task
    def dispatch(self) -> None:
        run = sender(self.environment)
        if run.accepting:
            run.dispatch(*shape.dispatch_window(self.environment))
        run.accepting = False  # one schedule per run
        gevent.sleep(0.1)


class SpecShape(LoadTestShape):
    """Users as the spec's load mode needs them, until the run is over and reported."""

    def tick(self):
        assert self.runner is not None  # Locust sets it before the first tick
        return shape.tick(self.runner.environment, StreamingUser, ArrivalDispatcher)
