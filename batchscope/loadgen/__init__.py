"""The load generator's face: what other components use of it (the tuner's plans, readings and what-if runs).

The load itself runs as `batchscope load` (batchscope.loadgen.cli) or Locust on the adapter's locustfile;
everything else here is internal.
"""

from batchscope.loadgen.figures import (
    Distribution,
    ExactGaps,
    MeasurementWindow,
    RunFigures,
    Summary,
    counted,
    final_window,
    latencies,
)
from batchscope.loadgen.spec import (
    DEFAULT_SLO_TPOT_S,
    DEFAULT_SLO_TTFT_S,
    MAX_TIMEOUT_S,
    ConcurrencyLoad,
    OfflineLoad,
    PoissonLoad,
    SloTargets,
    WorkloadSpec,
    within_slo,
)
from batchscope.loadgen.stream import RequestRecord, draw_prompt, timed_elsewhere

__all__ = [
    "DEFAULT_SLO_TPOT_S", "DEFAULT_SLO_TTFT_S", "MAX_TIMEOUT_S", "ConcurrencyLoad", "Distribution", "ExactGaps",
    "MeasurementWindow", "OfflineLoad", "PoissonLoad", "RequestRecord", "RunFigures", "SloTargets", "Summary",
    "WorkloadSpec", "counted", "draw_prompt", "final_window", "latencies", "timed_elsewhere", "within_slo",
]
