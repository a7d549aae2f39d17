"""The Locust adapter: the only part of the load generator that imports Locust (entry point: locustfile.py).

`batchscope load` (batchscope/loadgen/cli.py) hands Locust the locustfile's path; from here it takes only
command_line (serving_knobs.py, no Locust import), to check a vLLM command line before it becomes Locust."""

from batchscope.loadgen.adapter.serving_knobs import command_line

__all__ = ["command_line"]
