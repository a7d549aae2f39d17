"""The exporter against live processes: the simulator, Locust's load generator, a Grafana stub, a real
Prometheus. Values must equal their sources; a restart with another flag is one change and one annotation."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml

from tests.conftest import free_port, only, samples, wait_until
from tests.stubs import HttpStub, Reply, json_reply

pytestmark = pytest.mark.e2e


@contextlib.contextmanager
def finished_run(sim_url: str, spec: dict, tmp_path: Path, *flags: str) -> Iterator[str]:
    """A Locust run of ``spec`` to its end, whose web UI keeps it up so its final client metrics hold still: yields
    its metrics base URL; SIGTERM afterwards (its summary is written then)."""
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    metrics_port, web_port = free_port(), free_port()
    locust = subprocess.Popen([sys.executable, "-m", "locust", "-f", "batchscope/loadgen/adapter/locustfile.py",
                               "--host", sim_url,
                               "--spec", str(spec_path), "--metrics-port", str(metrics_port), "--autostart",
                               "--web-host", "127.0.0.1", "--web-port", str(web_port), *flags],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def finished() -> bool:
        try:
            state = requests.get(f"http://127.0.0.1:{web_port}/stats/requests", timeout=5).json()["state"]
        except (requests.RequestException, ValueError):
            return False
        return state == "stopped"

    try:
        wait_until(finished, timeout_s=60, message="the load run to end")
        yield f"http://127.0.0.1:{metrics_port}"
    finally:
        locust.terminate()
        locust.wait(timeout=20)


def test_exported_values_equal_their_sources(simulator, exporters, tmp_path):
    sim = simulator("--profile", "tiny")
    spec = {"input_tokens": 64, "output_tokens": 16, "duration_s": 2, "load": {"mode": "concurrency", "concurrency": 2}}
    with finished_run(sim.url, spec, tmp_path) as loadgen_url:
        exporter = exporters("--vllm-url", sim.url, "--loadgen-url", loadgen_url)
        exported = exporter.scrape()
        vllm_source = samples(requests.get(sim.url + "/metrics", timeout=5).text)
        client_source = samples(requests.get(loadgen_url + "/metrics", timeout=5).text)
    assert only("vllm:", exported) == only("vllm:", vllm_source)
    assert only("batchscope_client_", exported) == only("batchscope_client_", client_source)
    assert only("vllm:generation_tokens_total", exported) and only("batchscope_client_requests_total", exported)
    assert exported[("batchscope_up", (("target", "vllm"),))] == 1
    assert exported[("batchscope_up", (("target", "loadgen"),))] == 1
    info = next(dict(labels) for (name, labels) in exported if name == "batchscope_vllm_config_info")
    assert (info["model"], info["max_model_len"], info["block_size"]) == ("sim-model", "4096", "16")
    assert exported[("batchscope_vllm_kv_cache_capacity_tokens", ())] == 177264


def test_the_goodput_counter_equals_the_records_within_both_targets(simulator, exporters, tmp_path):
    """The load's own records judged by the spec's targets (vllm bench serve's rule, the summary's window) give the
    count the exporter serves. A third of the requests are held 0.5 s before the server answers, so they miss the
    0.3 s TTFT target and the rest meet it; the TTFT target is no bound of vLLM's buckets, so it is counted at 0.5 s,
    and the spec's target wins over the exporter's flag."""
    sim = simulator("--profile", "tiny", "--fault-stall-rate", "0.33", "--fault-stall-s", "0.5")
    spec = {"input_tokens": 64, "output_tokens": 16, "warmup_s": 1, "duration_s": 5, "scenario": "good",
            "slo": {"ttft_s": 0.3, "tpot_s": 0.05}, "load": {"mode": "concurrency", "concurrency": 4}}
    out = tmp_path / "out"
    with finished_run(sim.url, spec, tmp_path, "--out", str(out), "--run-id", "g1") as loadgen_url:
        exported = exporters("--vllm-url", sim.url, "--loadgen-url", loadgen_url, "--slo-ttft-seconds", "5").scrape()
    summary = json.loads((out / "summary.json").read_text())  # written as Locust quit, which it has
    start, end = summary["window_start_s"], summary["window_start_s"] + summary["effective_duration_s"]
    window = [r for r in map(json.loads, (out / "records.jsonl").read_text().splitlines())
              if r["outcome"] == "ok" and start <= r["end_s"] <= end]
    good = [r for r in window if r["ttft_s"] <= 0.3 and (r["tpot_s"] is None or r["tpot_s"] <= 0.05)]
    assert 0 < len(good) < len(window), (len(good), len(window))  # both verdicts occur: the count means something
    labels = (("run_id", "g1"), ("scenario", "good"))
    assert exported[("batchscope_client_goodput_requests_total", labels)] == len(good)
    assert exported[("batchscope_client_time_to_first_token_seconds_count", labels)] == len(window)
    assert exported[("batchscope_slo_target_seconds", (("le", "0.5"), ("metric", "ttft"), ("source", "load_spec")))] \
        == 0.3
    assert exported[("batchscope_slo_target_seconds", (("le", "0.05"), ("metric", "tpot"), ("source", "load_spec")))] \
        == 0.05


def test_a_restart_with_another_flag_is_one_change_and_one_annotation(simulator, exporters, tmp_path):
    grafana = HttpStub(lambda method, path: json_reply({"message": "Annotation added", "id": 1})).start()
    port = str(free_port())
    command_file = tmp_path / "vllm-command"
    command_file.write_text("vllm serve sim-model --max-num-batched-tokens 2048")
    first = simulator("--profile", "tiny", "--port", port, "--max-num-batched-tokens", "2048")
    exporter = exporters("--vllm-url", first.url, "--vllm-command-file", str(command_file),
                         "--grafana-url", grafana.url, "--grafana-token", "glsa_test")
    assert exporter.scrape()[("batchscope_config_changes_total", ())] == 0
    first.stop()
    down = exporter.scrape()
    assert down[("batchscope_up", (("target", "vllm"),))] == 0
    command_file.write_text("vllm serve sim-model --max-num-batched-tokens 8192")
    simulator("--profile", "tiny", "--port", port, "--max-num-batched-tokens", "8192")
    after = exporter.scrape()
    assert after[("batchscope_config_changes_total", ())] == 1
    assert after[("batchscope_config_last_change_timestamp_seconds", ())] > time.time() - 60
    info = next(dict(labels) for (name, labels) in after if name == "batchscope_vllm_config_info")
    assert info["max_num_batched_tokens"] == "8192"
    assert exporter.scrape()[("batchscope_config_changes_total", ())] == 1  # no second event
    posts = wait_until(lambda: [r for r in grafana.requests if r.method == "POST"], message="annotation POST")
    assert len(posts) == 1 and posts[0].path == "/api/annotations"
    body = posts[0].json()
    assert body["tags"] == ["batchscope", "config-change"]
    assert "max_num_batched_tokens: 2048 → 8192" in body["text"]
    assert posts[0].headers["Authorization"] == "Bearer glsa_test"
    grafana.stop()


def test_down_malformed_or_slow_targets_give_up_0_and_the_rest_is_served(simulator, exporters):
    sim = simulator("--profile", "tiny")
    malformed = HttpStub(lambda m, p: Reply(body=b'batchscope_client_x{run_id="a" 1\n', content_type="text/plain"))
    slow = HttpStub(lambda m, p: Reply(body=b"", content_type="text/plain", delay_s=3))
    for stub, up_url in ((malformed.start(), None), (slow.start(), None), (None, f"http://127.0.0.1:{free_port()}")):
        loadgen_url = up_url or stub.url
        exporter = exporters("--vllm-url", sim.url, "--loadgen-url", loadgen_url, "--scrape-timeout-s", "0.5")
        started = time.monotonic()
        exported = exporter.scrape()
        assert time.monotonic() - started < 2.5
        assert exported[("batchscope_up", (("target", "loadgen"),))] == 0
        assert exported[("batchscope_up", (("target", "vllm"),))] == 1
        assert only("vllm:num_requests_running", exported)
        if stub:
            stub.stop()


def test_grafana_unreachable_is_logged_and_never_blocks_a_scrape(simulator, exporters):
    port = str(free_port())
    first = simulator("--profile", "tiny", "--port", port, "--gpu-memory-utilization", "0.9")
    exporter = exporters("--vllm-url", first.url, "--grafana-url", f"http://127.0.0.1:{free_port()}")
    exporter.scrape()
    first.stop()
    simulator("--profile", "tiny", "--port", port, "--gpu-memory-utilization", "0.8")
    started = time.monotonic()
    assert exporter.scrape()[("batchscope_config_changes_total", ())] == 1
    assert time.monotonic() - started < 2
    wait_until(lambda: "grafana annotation attempt 1/" in exporter.log.read_text(), message="retry logged")
    assert exporter.process.poll() is None


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian package prometheus is not installed")
def test_a_real_prometheus_stores_the_vllm_names_intact(simulator, exporters, tmp_path):
    sim = simulator("--profile", "tiny")
    exporter = exporters("--vllm-url", sim.url)
    prom_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "batchscope", "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}]}],
    }))
    prometheus = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{prom_port}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def names() -> list[str] | None:
            try:
                reply = requests.get(f"http://127.0.0.1:{prom_port}/api/v1/label/__name__/values", timeout=5)
                found = reply.json()["data"]
            except (requests.RequestException, ValueError, KeyError):
                return None
            # both sides of one scrape: a first look may come while Prometheus is still appending it
            return found if {"vllm:num_requests_running", "batchscope_up"} <= set(found) else None

        stored = wait_until(names, timeout_s=60, interval_s=0.5,
                            message="Prometheus to store the vllm: series and batchscope_up")
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=20)
    assert "vllm:time_to_first_token_seconds_bucket" in stored and "vllm:kv_cache_usage_perc" in stored
    assert not [name for name in stored if name.startswith("vllm_")]
    assert "batchscope_up" in stored
