"""The report of a plan's results: report.md, report.html, report.csv, comparison.json, the MLPerf sections.

write_report is loaded when first asked for: it brings matplotlib and the statistics, which a run does not need.
"""

from typing import TYPE_CHECKING, Any

from batchscope.tuner.report.console import console_lines
from batchscope.tuner.report.mlperf import scenario_dirs
from batchscope.tuner.report.prediction import WHAT_IF_SUFFIX

if TYPE_CHECKING:
    from batchscope.tuner.report.files import write_report

__all__ = ["WHAT_IF_SUFFIX", "console_lines", "scenario_dirs", "write_report"]


def __getattr__(name: str) -> Any:
    if name == "write_report":
        from batchscope.tuner.report.files import write_report

        return write_report
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
