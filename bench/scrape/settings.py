"""Cores, deadlines, the stubs' model and the targets of the exporter scrape bench."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXPORTER_CORE, BENCH_CORE = 0, 1
MAX_P99_MS = 50.0
MAX_RSS_MB = 100.0
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
MAX_MODEL_LEN = 8192
VLLM_VERSION = "0.11.0"
STARTUP_TIMEOUT_S = 20.0
SCRAPE_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
POLL_S = 0.05
MAX_ENGINES = 64
TARGETS = ("vllm", "loadgen")  # the exporter's target label values
CONTENDED_SHARE = 0.10  # others taking this share of the exporter's core make the latencies suspect
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;"
                     "version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")
