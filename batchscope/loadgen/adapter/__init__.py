"""The Locust adapter: the only part of the load generator that imports Locust (entry point: locustfile.py)."""
