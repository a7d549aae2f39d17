"""Exporter scrape benchmark: what one scrape of `batchscope exporter` costs against a large vLLM /metrics.

The bench process (pinned to core 1) serves two static stubs from threads on loopback ports:

* a vLLM server: /metrics with vLLM V1's real families (names, HELP, ``model_name``/``engine`` labels, bucket
  boundaries, ``_created`` twins, ``vllm:cache_config_info``, process/python collectors and the fastapi
  instrumentator's ``http_*`` families), replicated over data-parallel engines "0".."N-1" until it holds about
  --series sample lines (2,000 by default); plus /v1/models and /version JSON;
* a load generator: /metrics rendered by loadgen.figures.metrics.ClientMetricsCollector over a ClientStats fed with a
  few thousand synthetic RequestRecords (the ``batchscope_client_*`` histograms and counters).

`batchscope exporter` runs as a child pinned to core 0, alone. The bench scrapes its /metrics --scrapes times in
a row (after a few warm-up scrapes) and reports:

* scrape latency p50/p99/max, ms: client-side wall time of each scrape, connect to last byte;
* exporter CPU per scrape, ms: utime + stime of the exporter process (all its threads, /proc/PID/stat) over
  the timed scrapes, divided by their number;
* exporter memory, MB: the largest VmRSS sampled after each scrape and VmHWM at the end (/proc/PID/status).

Targets: p99 <= 50 ms on one core and RSS <= 100 MB. A sanity check confirms once that the exporter re-exposes
every vllm:* series and every client series of the stubs. Also shown: the exporter's own
batchscope_scrape_duration_seconds (fetch + parse of each target, median), and the CPU other processes took on
either core during the timed scrapes, since it inflates the latencies. Exit status 0 whatever the figures;
non-zero when the exporter does not start or answers wrongly.

    .venv/bin/python bench/exporter_scrape.py [--scrapes N] [--warmup N] [--series N] [--json FILE]
"""

from __future__ import annotations

import argparse
import http.client
import sys
from dataclasses import asdict
from pathlib import Path

from scrape.exporter import claim_bench_core
from scrape.measure import run
from scrape.report import report
from scrape.settings import MAX_P99_MS, MAX_RSS_MB

from batchscope.testkit.processes import SetupError
from batchscope.testkit.report import argument_parser, write_json


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argument_parser(__doc__)
    parser.add_argument("--scrapes", type=int, default=300, help="timed scrapes (default 300)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed scrapes first (default 10)")
    parser.add_argument("--series", type=int, default=2000, help="sample lines of the vLLM stub (default 2000)")
    parser.add_argument("--records", type=int, default=3000, help="requests behind the client histograms")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.scrapes < 1 or args.warmup < 0 or args.series < 1 or args.records < 1:
        parser.error("--scrapes, --series and --records must be positive, --warmup not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not claim_bench_core("exporter_scrape"):
        return 2
    try:
        result = run(args)
    except (SetupError, OSError, http.client.HTTPException) as exc:
        print(f"exporter_scrape: setup failed: {exc}", file=sys.stderr)
        return 1
    print(report(result))
    if args.json:
        figures = asdict(result) | {"p99_pass": result.p99_ok, "rss_pass": result.rss_ok,
                                    "targets": {"p99_ms": MAX_P99_MS, "rss_mb": MAX_RSS_MB}}
        write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
