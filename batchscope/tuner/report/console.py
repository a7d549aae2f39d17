"""What `batchscope tune` and `batchscope report` print after the files: a results table per setting, the
recommendation's headline and the suggested max_num_queued_tokens, in plain text (ms for latencies, labelled)."""

from __future__ import annotations

from batchscope.tuner.compare import METRIC_BY_KEY, Comparison
from batchscope.tuner.report.recommendation import recommendation_lines
from batchscope.tuner.report.text import queued_tokens_lines, shown

# (header, metric key) of the table's columns; the rejected share only when some setting had rejections
COLUMNS = (("TTFT p50 (ms)", "ttft_p50"), ("TTFT p99 (ms)", "ttft_p99"), ("TPOT p50 (ms)", "tpot_p50"),
           ("TPOT p99 (ms)", "tpot_p99"), ("throughput (req/s)", "completion_throughput_rps"),
           ("goodput (req/s)", "goodput_rps"), ("rejected (%)", "rejected_share"), ("preemptions", "preemptions"))


def console_lines(c: Comparison) -> list[str]:
    """The results table (one row per setting with a finished run, meets-SLOs last), the recommendation's
    headline, the suggested max_num_queued_tokens."""
    columns = [(head, key) for head, key in COLUMNS
               if key != "rejected_share" or any(s.values.get(key) for s in c.settings)]
    head = ["setting", *(h for h, _ in columns), "meets SLOs"]
    rows = [[s.setting, *(shown(s.values.get(key), METRIC_BY_KEY[key].unit) for _, key in columns),
             {True: "yes", False: "no", None: "n/a"}[s.meets_slos]] for s in c.settings if s.runs_ok]
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                         for i, (cell, w) in enumerate(zip(cells, widths, strict=True)))

    headline = recommendation_lines(c)[:1]
    return [line(head), *(line(row) for row in rows), *(x.replace("**", "") for x in headline),
            queued_tokens_lines(c)[0].replace("**", "")]
