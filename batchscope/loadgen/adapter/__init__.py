"""The Locust adapter: the only part of the load generator that imports Locust (entry point: locustfile.py).

Nothing else imports it: `batchscope load` (batchscope/loadgen/cli.py) hands Locust the locustfile's path."""

__all__: list[str] = []
