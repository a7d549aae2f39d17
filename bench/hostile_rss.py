"""Hostile-server memory benchmark: the load generator's peak RSS against the worst modes of a hostile server.

For each mode (by default the three that once grew the process without limit: a chunk size of -6, a 503 whose
body never ends, an SSE event that never ends) this process, pinned to core 0, serves
batchscope/testkit/hostile.py's server from a thread, and `batchscope load` runs a closed loop of --concurrency
streaming users against it for --seconds, pinned to core 1, under an address space of AS_LIMIT_BYTES (a runaway
fails against it, as it once took 22 GB in 65 s). Reported per mode: the outcomes, the exit status, the requests
the server saw, the wall time, and the load process's peak RSS (its VmHWM once it runs its own program:
batchscope/testkit/bounded.py).

Target: peak RSS <= 300 MB in every mode (at rest the load takes ~85 MB; each mode's caps, a 16 MiB chunk, a
64 KiB error body, a 1 MiB event, per in-flight request, keep it far below). Exit status 0 whatever the
figures; non-zero when a run does not end (it is killed --seconds + 60 s after its start).

    .venv/bin/python bench/hostile_rss.py [--seconds S] [--concurrency N] [--modes a,b] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from batchscope.testkit.bounded import BoundedLoad, bounded_load
from batchscope.testkit.hostile import STREAM_MODES, HostileServer
from batchscope.testkit.report import add_json_option, argument_parser, table, targets_table, write_json

MODES = ("chunk-negative", "error-body-endless", "event-endless")
MAX_RSS_MB = 300.0
AS_LIMIT_BYTES = 2 << 30
SERVER_CORE, LOAD_CORE = 0, 1
KILL_MARGIN_S = 60.0  # beyond --seconds: Locust's start and end, on a busy machine


@dataclass
class Measured:
    """One mode's run, and the streamed completions the server saw (the pre-flight's probe included)."""

    load: BoundedLoad
    requests: int

    @property
    def passed(self) -> bool:
        return self.load.run.peak_rss_mb <= MAX_RSS_MB

    def outcomes(self) -> str:
        counts = self.load.summary.get("outcomes", {})
        return ", ".join(f"{name} {count}" for name, count in counts.items() if count) or "-"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argument_parser(__doc__)
    parser.add_argument("--seconds", type=float, default=10.0, help="load duration per mode (default 10)")
    parser.add_argument("--concurrency", type=int, default=2, help="closed-loop users (default 2)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"hostile modes, comma-separated ({MODES})")
    add_json_option(parser)
    args = parser.parse_args(argv)
    args.modes = args.modes.split(",")
    unknown = [mode for mode in args.modes if mode not in STREAM_MODES]
    if unknown or args.seconds <= 0 or args.concurrency < 1:
        parser.error(f"--modes: one of {', '.join(STREAM_MODES)}; --seconds and --concurrency positive"
                     + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
    return args


def measure(mode: str, args: argparse.Namespace, workdir: Path) -> Measured:
    spec = {"input_tokens": 16, "output_tokens": 8, "timeout_s": 1.0, "duration_s": args.seconds,
            "load": {"mode": "concurrency", "concurrency": args.concurrency}}
    core = LOAD_CORE if LOAD_CORE in os.sched_getaffinity(0) else None
    with HostileServer(mode) as server:
        load = bounded_load(workdir, spec, server.url, timeout_s=args.seconds + KILL_MARGIN_S,
                            address_space_bytes=AS_LIMIT_BYTES, core=core)
        return Measured(load, server.seen["/v1/completions"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if SERVER_CORE in os.sched_getaffinity(0):
        os.sched_setaffinity(0, {SERVER_CORE})
    with tempfile.TemporaryDirectory(prefix="hostile-rss-") as workdir:
        results = {mode: measure(mode, args, Path(workdir)) for mode in args.modes}
    runs = {mode: m.load.run for mode, m in results.items()}
    rows = [[mode, m.outcomes(), str(runs[mode].returncode), str(m.requests), f"{runs[mode].wall_s:.1f}",
             f"{runs[mode].peak_rss_mb:.0f}"] for mode, m in results.items()]
    print(table(["mode", "outcomes", "exit", "requests", "wall s", "peak RSS MB"], rows))
    print()
    print(targets_table([(f"{mode}: peak RSS <= {MAX_RSS_MB:.0f} MB", f"{runs[mode].peak_rss_mb:.0f} MB",
                          m.passed) for mode, m in results.items()]))
    if args.json:
        write_json(args.json, {mode: {"outcomes": m.load.summary.get("outcomes"), "exit": runs[mode].returncode,
                                      "requests": m.requests, "wall_s": runs[mode].wall_s,
                                      "peak_rss_mb": runs[mode].peak_rss_mb, "pass": m.passed}
                               for mode, m in results.items()})
    if any(run.timed_out for run in runs.values()):
        print("hostile_rss: a run did not end and was killed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
