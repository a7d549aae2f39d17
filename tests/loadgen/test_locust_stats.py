"""Locust's own statistics of a `batchscope load` run agree with ours: its REQUEST row counts the requests that
ended, its failures are the failed ones (not those the run's end cut), its total (the web UI's header and the
"Aggregated" row) counts requests only, no gap between tokens is a request, and its table is not printed after
our summary (it goes to locust_stats.json beside the CSV files).
"""

from __future__ import annotations

import csv
import json

import pytest

from tests.conftest import run_load

SPEC = {"input_tokens": 64, "output_tokens": 32, "duration_s": 3, "warmup_s": 0,
        "load": {"mode": "concurrency", "concurrency": 4}}


@pytest.mark.e2e
@pytest.mark.parametrize("workers", [0, 2])
def test_locusts_tables_count_requests_as_the_summary_does(simulator, tmp_path, workers):
    sim = simulator("--profile", "tiny")
    result = run_load(tmp_path, SPEC, sim.url, workers=workers, timeout_s=120)
    assert result.returncode == 0, result.output[-3000:]
    outcomes = result.summary["outcomes"]
    assert outcomes["aborted"] > 0 and outcomes["ok"] > 0  # the run's end cut the requests then in flight
    ended = [r for r in result.records if r["outcome"] != "aborted"]
    entries = {(e["method"], e["name"]): e for e in json.loads((result.out_dir / "locust_stats.json").read_text())}
    request = entries[("REQUEST", "default")]
    assert request["num_requests"] == len(ended) and request["num_failures"] == 0
    assert entries[("TTFT", "default")]["num_requests"] == outcomes["ok"]
    assert not any(method == "ITL" for method, _ in entries)
    with open(result.out_dir / "locust_stats.csv") as table:
        total = next(row for row in csv.DictReader(table) if row["Name"] == "Aggregated")
    assert (int(total["Request Count"]), int(total["Failure Count"])) == (len(ended), 0)
    assert "Aggregated" not in result.output and "REQUEST" not in result.output  # one report on the console
