"""Load generator capacity benchmark: what one `batchscope load` worker process sustains, and how exactly it times.

One `batchscope sim serve` (H100 profile: 256 streams at ~27k tokens/s paced by its steps, the busiest a real
single-GPU server gets; `--profile tiny` lets the simulator's own CPU set a higher rate; max_num_seqs 1024,
max_num_batched_tokens 8192, a ground-truth log stamped with the kernel's receive time of each request's bytes)
runs alone on core 0 for the whole benchmark; every client runs on core 1, one at a time, against it:

1. Capacity at N = 256 closed-loop streams (`--streams`), after a warm-up, over a window (`--duration`),
   three times for each client, alternating (`--repeat`); each figure is reported per run, pooled, and as the
   median (min-max) of the runs, and the targets are judged on the medians:
   - a minimal asyncio + aiohttp streaming client (batchscope.testkit.reference_client, run as a child process
     so that its CPU is its own) sending the load generator's exact request body (token-id prompt, max_tokens,
     ignore_eos, stream, stream_options.include_usage) and counting token events cheaply;
   - `batchscope load --workers 0` (Locust's local runner: one process).
   For each: streamed tokens/s as the client received them (the reference's own count; for the load generator
   the token chunk times in records.jsonl, beside summary.json's output_tokens_per_s and the server's
   /sim/stats count), the client's CPU from /proc (its whole process tree), hence tokens per CPU-second, i.e.
   per core, and the server's CPU and step time, to tell which side set the rate.
   Target: the load generator's tokens per core >= 1.0x the reference's.
2. Bias against the ground truth, from the same runs: records joined with the server's log by request id;
   TTFT bias = client (first token - send) - server (first token - arrival), E2E bias likewise, split into
   send -> arrival and server first write -> client first read. Target: TTFT bias p99 <= 2 ms at 256 streams.
   The reference's bias is the floor any client pays on this machine. Both clients start their closed-loop
   users evenly over `--ramp-s` (about one request's duration; the load generator's `ramp_up_s`): started at
   once, a closed loop with a fixed output length runs in lockstep (all streams end and restart together),
   and each TTFT is then taken in a burst of N sends that the server itself queues (`--ramp-s 0` shows it).
   As many pairs of runs at the same request rate with Poisson arrivals give the bias of an open loop, with the
   same target (`--no-poisson` skips them).
3. Memory: `batchscope load` with 1,000 closed-loop streams of long outputs; the Locust process's VmRSS is
   sampled while all 1,000 are in flight (client /metrics and the server's running + waiting both say so),
   and its VmHWM read at the end. Target: <= 250 MB. The RSS growth per streamed token over the capacity
   window is reported too.

Soak mode (`--soak MINUTES`, instead of the above): `batchscope load` alone at the closed loop's full rate for
that long, its RSS sampled every 10 s; target: RSS growth <= 2 MB/min after the first minute, and the summary's
ITL percentiles (the load generator's sketch) within 0.5% of the exact ones from records.jsonl.

When neither client saturates core 1 (here the simulator's step pacing, or a saturated core 0, sets the rate),
the ratio compares CPU per token at the same delivered rate rather than two saturated capacities; the report
says which side bound each run, and how much CPU other processes took on either core.

The exit status is 0 whatever the figures, non-zero only when a process fails to start, ramp up or finish.

    .venv/bin/python bench/loadgen_capacity.py [--streams N] [--warmup S] [--duration S] [--json FILE]
    .venv/bin/python bench/loadgen_capacity.py --soak 10
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import requests
from capacity.phases import run_phases
from capacity.report import report, to_json
from capacity.settings import CLIENT_CORE, DEFAULT_PROFILE
from capacity.soak import run_soak, soak_report

from batchscope.testkit.processes import SetupError
from batchscope.testkit.report import add_json_option, argument_parser, write_json


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argument_parser(__doc__)
    parser.add_argument("--streams", type=int, default=256, help="closed-loop streams of the capacity runs")
    parser.add_argument("--profile", default=DEFAULT_PROFILE,
                        help="the simulator's profile (tiny: its own CPU sets the rate, not its steps)")
    parser.add_argument("--ramp-s", type=float, default=1.5,
                        help="start the closed-loop users evenly over this time (about one request's duration), "
                        "so that they don't run in lockstep; 0: all at once")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load before each window")
    parser.add_argument("--duration", type=float, default=15.0, help="measurement window, seconds")
    parser.add_argument("--input-tokens", type=int, default=32, help="prompt length, token ids")
    parser.add_argument("--output-tokens", type=int, default=256, help="tokens streamed per request")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each client and load, alternating (medians and spread over them)")
    parser.add_argument("--tail", type=float, default=None,
                        help="seconds the load generator runs past its window (default: 1.5 x the reference's "
                             "request duration + 2)")
    parser.add_argument("--no-poisson", action="store_true", help="skip the Poisson runs (bias without bursts)")
    parser.add_argument("--rss-streams", type=int, default=1000, help="in-flight streams of the memory run")
    parser.add_argument("--rss-output-tokens", type=int, default=2000, help="tokens per request of the memory run")
    parser.add_argument("--rss-sample", type=float, default=4.0, help="seconds of RSS sampling at full load")
    parser.add_argument("--soak", type=float, metavar="MINUTES",
                        help="soak mode: one load generator at the full closed-loop rate this long (RSS, figures)")
    parser.add_argument("--workdir", metavar="DIR", help="keep logs, records and the ground truth here")
    add_json_option(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.sched_setaffinity(0, {CLIENT_CORE})
    started = time.perf_counter()
    try:
        if args.workdir:
            Path(args.workdir).mkdir(parents=True, exist_ok=True)
            text, figures = run(args, Path(args.workdir))
        else:
            with tempfile.TemporaryDirectory(prefix="loadgen_capacity-") as tmp:
                text, figures = run(args, Path(tmp))
    except (SetupError, OSError, requests.RequestException) as exc:
        print(f"loadgen_capacity: setup failed: {exc}", file=sys.stderr)
        return 1
    print(text)
    print(f"\nTook {time.perf_counter() - started:.0f} s.")
    if args.json:
        write_json(args.json, figures)
    return 0


def run(args: argparse.Namespace, workdir: Path) -> tuple[str, dict]:
    """The report's text and its figures for --json: the capacity phases, or the soak."""
    if args.soak:
        soak = run_soak(args, workdir)
        return soak_report(soak), asdict(soak) | {"growth_mb_per_min": soak.growth_mb_per_min()}
    results = run_phases(args, workdir)
    return report(results, args), to_json(results)


if __name__ == "__main__":
    sys.exit(main())
