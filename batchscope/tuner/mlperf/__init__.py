"""MLPerf's Server and Offline scenarios: the rate search and a point's checks (pure, rules.py) and the points
measured on a server or the virtual clock (measure.py)."""

from batchscope.tuner.mlperf.measure import SCENARIOS, describe, nothing_measured, run_scenario
from batchscope.tuner.mlperf.rules import FOLDER_PREFIX, OfflineResult, ServerPoint, ServerRules, ServerSearch

__all__ = [
    "FOLDER_PREFIX", "SCENARIOS", "OfflineResult", "ServerPoint", "ServerRules", "ServerSearch", "describe",
    "nothing_measured", "run_scenario",
]
