"""What a run leaves on disk (run.json, written atomically) and the figures read from its files and /metrics."""

from batchscope.tuner.results.record import (
    PLAN_FILE,
    RUN_FILE,
    CannotWrite,
    ClientFigures,
    RequestSamples,
    RunResult,
    RunStart,
    ServerReport,
    ServerSignals,
    check_writable,
    hit_rate,
    load_results,
    now_iso,
    save,
    write_atomically,
)
from batchscope.tuner.results.signals import (
    MetricsPoint,
    good_count,
    measured_client,
    parse_metrics,
    read_summary,
    samples_of,
    server_report,
    server_signals,
)

__all__ = [
    "PLAN_FILE", "RUN_FILE", "CannotWrite", "ClientFigures", "MetricsPoint", "RequestSamples", "RunResult",
    "RunStart", "ServerReport", "ServerSignals", "check_writable",
    "good_count", "hit_rate", "load_results", "measured_client", "now_iso", "parse_metrics", "read_summary",
    "samples_of", "save", "server_report", "server_signals", "write_atomically",
]
