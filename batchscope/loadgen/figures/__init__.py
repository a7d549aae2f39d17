"""A run's figures: folded record by record in bounded memory (figures.py, the ITL sketch in sketch.py) under
the one window rule (window.py), when the server was away (away.py), the client /metrics (metrics.py), whether
the generator itself is the bottleneck (saturation.py) and the end-of-run summary (summary.py). This face lists
what the rest of the load generator uses of it."""

from batchscope.loadgen.figures.away import away_s
from batchscope.loadgen.figures.figures import RunFigures, counted
from batchscope.loadgen.figures.metrics import (
    DEFAULT_METRICS_PORT,
    ClientMetricsCollector,
    ClientStats,
    workload_labels,
)
from batchscope.loadgen.figures.saturation import SaturationMonitor
from batchscope.loadgen.figures.sketch import ExactGaps
from batchscope.loadgen.figures.summary import (
    Distribution,
    Summary,
    generator_line,
    latencies,
    print_summary,
    summarize,
)
from batchscope.loadgen.figures.window import MeasurementWindow, final_window, live_window

__all__ = [
    "DEFAULT_METRICS_PORT", "ClientMetricsCollector", "ClientStats", "Distribution", "ExactGaps",
    "MeasurementWindow", "RunFigures", "SaturationMonitor", "Summary", "away_s", "counted", "final_window",
    "generator_line", "latencies", "live_window", "print_summary", "summarize", "workload_labels",
]
