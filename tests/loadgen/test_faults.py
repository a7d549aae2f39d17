"""Faults end every request in the right outcome, nothing escapes, and the summary still balances."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from batchscope.loadgen.cli import LOCUSTFILE
from batchscope.loadgen.run.control import FAIL_FAST_REQUESTS
from tests.conftest import free_port, run_load, wait_until

pytestmark = pytest.mark.e2e
SPEC = {"input_tokens": 64, "output_tokens": 60, "timeout_s": 10, "duration_s": 4,
        "load": {"mode": "concurrency", "concurrency": 4}}


def failure_lines(output: str) -> list[str]:
    """The one-line reasons a failed run logged (Locust's log prefix removed)."""
    return [line.split(": ", 1)[1] for line in output.splitlines() if "ERROR/batchscope.loadgen: run failed" in line]


def server_requests(sim, status: str) -> float:
    """Completion requests the simulator answered with this status class (its http_requests_total)."""
    text = requests.get(sim.url + "/metrics", timeout=5).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "http_requests_total" and s.labels["handler"] == "/v1/completions"
               and s.labels["status"] == status)


def test_injected_500s_and_cut_streams_are_outcomes(simulator, tmp_path):
    sim = simulator("--profile", "tiny", "--fault-error-rate", "0.2", "--fault-cut-rate", "0.2", "--seed", "5")
    result = run_load(tmp_path, SPEC, sim.url)
    summary = result.summary
    # about a third fail: under max_failed_fraction (0.5), so the run itself succeeds
    assert result.returncode == 0 and summary["balanced"], result.output[-3000:]
    assert summary["failure"] is None and failure_lines(result.output) == []
    assert summary["outcomes"]["http_error"] > 0 and summary["outcomes"]["truncated"] > 0
    assert summary["outcomes"]["ok"] > 0
    assert all(r["status"] == 500 for r in result.records if r["outcome"] == "http_error")
    assert "Traceback" not in result.output


def test_a_server_killed_mid_run(simulator, tmp_path):
    sim = simulator("--profile", "tiny")
    spec_path, out = tmp_path / "spec.yaml", tmp_path / "out"
    spec_path.write_text(yaml.safe_dump({**SPEC, "output_tokens": 400, "duration_s": 5}))
    load = subprocess.Popen([sys.executable, "-m", "batchscope.cli", "load", "--spec", str(spec_path), "--host",
                             sim.url, "--out", str(out), "--metrics-port", str(free_port())],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def streaming() -> bool:
            text = requests.get(sim.url + "/metrics", timeout=5).text
            return 'vllm:num_requests_running{engine="0",model_name="sim-model"} 4.0' in text
        wait_until(streaming, timeout_s=30, message="four streams running")
        sim.process.send_signal(signal.SIGKILL)
        output, _ = load.communicate(timeout=120)
    finally:
        load.kill()
    summary = json.loads((out / "summary.json").read_text())
    # nothing completes after the kill, and the users keep trying: far more than half of the requests fail
    assert load.returncode == 4 and summary["balanced"], output[-3000:]
    assert failure_lines(output) == [f"run failed: {summary['failure']}"]
    assert summary["outcomes"]["truncated"] >= 1  # the streams cut by the kill
    assert summary["outcomes"]["connection_error"] >= 1  # then nothing answers
    assert "Traceback" not in output


def test_a_stalled_server_ends_requests_as_timeouts(simulator, tmp_path):
    sim = simulator("--profile", "tiny", "--fault-stall-rate", "1", "--fault-stall-s", "2")
    result = run_load(tmp_path, {**SPEC, "timeout_s": 0.5, "duration_s": 2}, sim.url)
    summary = result.summary
    assert result.returncode == 4 and summary["balanced"], result.output[-3000:]  # no request succeeded
    assert failure_lines(result.output) == ["run failed: no request completed in the measurement window "
                                            f"(timeout {summary['failed']['timeout']})"]
    assert summary["outcomes"]["timeout"] > 0 and summary["outcomes"]["ok"] == 0
    assert all(r["end_s"] - r["sent_s"] < 1.0 for r in result.records if r["outcome"] == "timeout")


@pytest.mark.parametrize("load", [{"mode": "concurrency", "concurrency": 8}, {"mode": "poisson", "rate": 200}])
def test_a_server_rejecting_every_request_is_not_hammered_and_the_run_fails(simulator, tmp_path, load):
    # the server wants a key the spec lacks: every request gets 401, instantly. Without backing off, 8 users
    # would send thousands in 3 s (and the Poisson dispatcher 600)
    sim = simulator("--profile", "tiny", "--api-key", "right-key")
    result = run_load(tmp_path, {**SPEC, "model": "sim-model", "duration_s": 3, "load": load}, sim.url)
    summary = result.summary
    assert result.returncode == 4 and summary["balanced"], result.output[-3000:]
    # the server saw one more: the pre-flight's vocabulary probe (refused too, so the run goes on to show it)
    assert 0 < summary["started"] == summary["outcomes"]["http_error"] == server_requests(sim, "4xx") - 1 < 50
    assert failure_lines(result.output) == [
        f"run failed: all {summary['started']} finished requests were rejected with HTTP 401 "
        '({"error":"Unauthorized"})']
    assert "Traceback" not in result.output


def test_a_stream_rejecting_every_request_in_stream_is_backed_off_and_stopped_by_the_first_rejections(simulator,
                                                                                                    tmp_path):
    # vLLM refuses an id out of its vocabulary inside a 200 stream: the load generator of a run that did not probe
    # (ids 1000-29999 against 8,000 tokens, as `locust -f` is told here) must see the 400 in it, not a cut stream
    sim = simulator("--profile", "tiny", "--vocab-size", "8000")
    spec_path, out = tmp_path / "spec.yaml", tmp_path / "out"
    spec_path.write_text(yaml.safe_dump({**SPEC, "duration_s": 30, "load": {"mode": "concurrency", "concurrency": 8}}))
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
                             "--spec", str(spec_path), "--host", sim.url, "--out", str(out), "--metrics-port",
                             str(free_port()), "--batchscope-ids", "1000,30000"],
                            capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert result.returncode == 4 and summary["balanced"], output[-3000:]
    assert time.monotonic() - started < 20, "stopped by the first rejections, not the 30 s duration"
    assert FAIL_FAST_REQUESTS <= summary["started"] == summary["outcomes"]["http_error"] < 50  # backed off
    assert summary["started"] == server_requests(sim, "2xx")
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert {(r["outcome"], r["status"]) for r in records} == {("http_error", 400)}
    assert all(r["error"].endswith("is out of vocabulary") for r in records)
    assert failure_lines(output) == [f"run failed: all {summary['started']} finished requests were rejected with "
                                     f"HTTP 400 ({records[0]['error']})"]


def test_a_request_longer_than_max_model_len_is_refused_before_sending(simulator, tmp_path):
    truth = tmp_path / "truth.jsonl"
    sim = simulator("--profile", "tiny", "--max-model-len", "256", "--ground-truth-log", str(truth))
    result = run_load(tmp_path, {**SPEC, "input_tokens": 200, "output_tokens": 100}, sim.url)
    assert result.returncode == 2, result.output[-3000:]
    # the one line and nothing else: Locust never started (no banner, no empty tables, no CSV files)
    assert result.output.splitlines() == ["batchscope load: error: input_tokens + output_tokens: 200 + 100 = 300 "
                                          "exceeds the server's max_model_len 256 for sim-model"]
    assert server_requests(sim, "2xx") + server_requests(sim, "4xx") == 0
    assert not truth.exists() or truth.read_text() == ""
    assert result.summary == {} and result.records == [] and not list(result.out_dir.glob("**/*.*"))
