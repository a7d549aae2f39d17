"""The Locust adapter: the only part of the load generator that imports Locust (entry point: locustfile.py).

`batchscope load` (batchscope/loadgen/cli.py) hands Locust the locustfile's path; it imports only
serving_knobs.py (no Locust there), to check a vLLM command line before it becomes Locust."""

__all__: list[str] = []
