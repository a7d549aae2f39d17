"""Cores, deadlines, runs and targets of the simulator throughput bench."""

from __future__ import annotations

SERVER_CORE, CLIENT_CORE = 0, 1
STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
STATS_TIMEOUT_S = 15.0
ERROR_PAUSE_S = 0.1
BUSY_CPU = 0.90  # a side using this share of its core or more is the bottleneck
CONTENDED_CPU = 0.10  # other processes taking this share of a bench core make its figures suspect
LAGGING = 0.20  # a median step lag of this share of the step period or more is what holds the rate back

CLOSED_LOOP_STREAMS = (64, 256, 1024)
PACED_PROFILE = "h100-llama-3.1-8b"
PACED_TOKENS_PER_S = 5_000
PACED_TOLERANCE = 0.10
PACED_ATTEMPTS = 3

MIN_TOKENS_PER_S = 20_000
MAX_PACED_LAG_P99_MS = 5.0
MAX_RSS_MB = 300
MIN_VIRTUAL_SPEEDUP = 100
