"""Simulator throughput benchmark: how much streaming one core of the real-time simulator sustains.

Each run starts a fresh `batchscope sim serve` pinned alone to core 0 and drives it from this process, pinned
to core 1, with a closed loop of streaming /v1/completions requests (a fixed prompt of token ids, ignore_eos;
a new stream starts as soon as one ends, so exactly N are open). After a warm-up, over a measurement window:

- streamed tokens/s, counted by the client from the SSE token events (cross-checked with /sim/stats);
- server and client CPU use (server: /proc utime+stime), and CPU other processes took on either core,
  to tell which side bottlenecks and whether the machine was quiet;
- the real-time loop's step period and step lag (actual wake-up - modelled step end, p50/p99/max from
  /sim/stats, which covers the server's last 100k steps, warm-up included when fewer);
- the server's peak RSS (VmHWM).

Runs: closed loop at 64, 256 and 1024 streams on the tiny profile (the server's capacity; its KV cache, at
--gpu-memory-utilization 1.0, holds only ~600-800 of the 1024 streams at once: the rest wait), then a paced run at
~5,000 tokens/s on h100-llama-3.1-8b: the stream count is first derived from the profile's step-cost model,
then rescaled from the measured rate until it lands within 10%. Last, in-process, the virtual clock's speed
(simulated seconds per wall second) on a Poisson workload that keeps ~240 of max_num_seqs=256 running.

Targets (from the issue): >= 20,000 streamed tokens/s on one core; step-lag p99 <= 5 ms at 5,000 tokens/s;
peak RSS <= 300 MB at 1024 streams; virtual clock >= 100x. The exit status is 0 whatever the figures, and
non-zero only when a server fails to start.

    .venv/bin/python bench/sim_throughput.py [--warmup S] [--duration S] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from throughput.measure import run
from throughput.report import report, to_json
from throughput.runs import closed_loop_specs, paced_run, virtual_clock
from throughput.settings import CLIENT_CORE

from batchscope.testkit.processes import SetupError
from batchscope.testkit.report import add_json_option, argument_parser, write_json


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argument_parser(__doc__)
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load before each window")
    parser.add_argument("--duration", type=float, default=10.0, help="measurement window of each run, seconds")
    parser.add_argument("--prompt-len", type=int, default=128, help="prompt token ids per stream")
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens streamed per request")
    add_json_option(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.sched_setaffinity(0, {CLIENT_CORE})
    started = time.perf_counter()
    try:
        closed = [run(spec, args.warmup, args.duration) for spec in closed_loop_specs(args.prompt_len,
                                                                                       args.max_tokens)]
        paced = paced_run(args.prompt_len, args.max_tokens, args.warmup, args.duration)
    except SetupError as exc:
        print(exc, file=sys.stderr)
        return 1
    virtual = virtual_clock()
    print(report(closed, paced, virtual, args))
    print(f"\nTook {time.perf_counter() - started:.0f} s.")
    if args.json:
        write_json(args.json, to_json(closed, paced, virtual))
    return 0


if __name__ == "__main__":
    sys.exit(main())
