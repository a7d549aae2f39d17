"""Helpers shared by the load generator's end-to-end tests."""

from __future__ import annotations

import time

import requests
from prometheus_client.parser import text_string_to_metric_families

from batchscope.loadgen.figures.metrics import ClientStats
from batchscope.loadgen.figures.window import in_window
from batchscope.loadgen.spec import load_spec
from batchscope.loadgen.stream.http import ConnectionPool, Follow
from batchscope.loadgen.stream.request import RequestRecord, measure
from batchscope.loadgen.stream.target import Target, build_target


def merged_samples(result) -> dict[tuple, float]:
    """The master's final client metrics (metrics.prom), keyed by (sample name, le or outcome)."""
    text = (result.out_dir / "metrics.prom").read_text()
    return {(s.name, s.labels.get("le") or s.labels.get("outcome")): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def per_worker_stats(records: list[dict], summary: dict) -> dict[int, ClientStats]:
    """Each worker's records accounted as the master does: latencies of the summary's window only."""
    start = summary["window_start_s"]
    end = start + summary["effective_duration_s"]
    stats: dict[int, ClientStats] = {}
    for data in records:
        record = RequestRecord(**data)
        stats.setdefault(data["worker"], ClientStats()).observe(record, in_window=in_window(record, start, end))
    return stats


def streams_running(sim_url: str) -> bool:
    """The run's requests are running on the simulator: more than one (the pre-flight's vocabulary probe, before
    the run, is one)."""
    text = requests.get(sim_url + "/metrics", timeout=5).text
    running = [line for line in text.splitlines() if line.startswith("vllm:num_requests_running{")]
    return bool(running) and float(running[0].split()[-1]) > 1


def target_for(url: str, **spec_fields) -> Target:
    fields = {"input_tokens": 50, "output_tokens": 20, "timeout_s": 10, "load.mode": "offline", "load.requests": 1}
    fields.update(spec_fields)
    return build_target(load_spec(None, [f"{k}={v}" for k, v in fields.items()]), url)


def send(target: Target, pool: ConnectionPool | None = None, follow: Follow | None = None) -> RequestRecord:
    record = RequestRecord(request_id="t", worker=0, scheduled_s=time.time())
    pool = pool or ConnectionPool(target.endpoint, target.timeout_s)
    connection = pool.acquire()
    try:
        return measure(connection, target, record, {}, follow)
    finally:
        pool.release(connection)
