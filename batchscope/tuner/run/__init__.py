"""Running a plan against a server in real time: each setting restarted, the load as a child process, /metrics
sampled, Prometheus and Grafana observed, progress shown, a signal's cleanup kept. What-if runs are whatif.py's."""

from batchscope.tuner.run.observers import grafana_annotator
from batchscope.tuner.run.one_run import run_one
from batchscope.tuner.run.progress import Progress
from batchscope.tuner.run.runner import ANNOTATIONS_DRAIN_S, nothing_compared, run_plan, what_if_run
from batchscope.tuner.run.servers import Server, make_server
from batchscope.tuner.run.stopping import Interrupted, StopOnSignal

__all__ = [
    "ANNOTATIONS_DRAIN_S", "Interrupted", "Progress", "Server", "StopOnSignal", "grafana_annotator",
    "make_server", "nothing_compared", "run_one", "run_plan", "what_if_run",
]
