"""Cores, deadlines, the server's flags and the targets of the load generator capacity bench."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVER_CORE, CLIENT_CORE = 0, 1
HTTP_TIMEOUT_S = 5.0
STARTUP_TIMEOUT_S = 40.0
RAMP_TIMEOUT_S = 40.0
STOP_TIMEOUT_S = 15.0
DRAIN_TIMEOUT_S = 20.0
LOCUST_FINAL_S = 35.0  # the load generator waits up to 30 s for its senders' last reports
BUSY_CPU = 0.90  # a process using this share of its core or more is the bottleneck
CONTENDED_CPU = 0.10  # other processes taking this share of a bench core make the absolute rates suspect

# The default profile is the H100 one: 256 streams there are the busiest a real single-GPU server gets (~27k
# tokens/s), paced by its steps, as a load generator meets it. `--profile tiny` makes the simulator's own CPU the
# limit instead (~40k tokens/s here): both processes then fill their cores, and the bias measures their queues.
DEFAULT_PROFILE = "h100-llama-3.1-8b"
SERVER_FLAGS = ("--max-num-seqs", "1024", "--max-num-batched-tokens", "8192", "--gpu-memory-utilization", "0.98")
MIN_RATIO = 1.0  # tokens per CPU-second, the load generator's over the reference's (median of the runs)
MAX_TTFT_BIAS_P99_MS = 2.0
MAX_RSS_MB = 250.0


def progress(message: str) -> None:
    print(f"loadgen_capacity: {message} ...", file=sys.stderr, flush=True)
