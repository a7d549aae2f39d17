"""Comparing finished runs, pure (no I/O): what is compared, the deltas' intervals and evidence, the verdicts and
explanations, and the comparison's data model (comparison.json)."""

from batchscope.tuner.compare.compute import changed_params, compare
from batchscope.tuner.compare.metrics import METRIC_BY_KEY, METRICS
from batchscope.tuner.compare.model import Comparison, MetricDelta, Recommendation, SettingSummary
from batchscope.tuner.compare.nested import first_difference
from batchscope.tuner.compare.verdicts import OBJECTIVES, evidence

__all__ = [
    "METRICS", "METRIC_BY_KEY", "OBJECTIVES", "Comparison", "MetricDelta", "Recommendation", "SettingSummary",
    "changed_params", "compare", "evidence", "first_difference",
]
