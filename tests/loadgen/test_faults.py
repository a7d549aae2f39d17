"""Faults end every request in the right outcome, nothing escapes, and the summary still balances."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
import requests
import yaml

from tests.conftest import free_port, run_load, wait_until

pytestmark = pytest.mark.e2e
SPEC = {"input_tokens": 64, "output_tokens": 60, "timeout_s": 10, "duration_s": 4,
        "load": {"mode": "concurrency", "concurrency": 4}}


def test_injected_500s_and_cut_streams_are_outcomes(simulator, tmp_path):
    sim = simulator("--profile", "tiny", "--fault-error-rate", "0.2", "--fault-cut-rate", "0.2", "--seed", "5")
    result = run_load(tmp_path, SPEC, sim.url)
    summary = result.summary
    assert result.returncode == 0 and summary["balanced"], result.output[-3000:]
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
    assert load.returncode == 0 and summary["balanced"], output[-3000:]
    assert summary["outcomes"]["truncated"] >= 1  # the streams cut by the kill
    assert summary["outcomes"]["connection_error"] >= 1  # then nothing answers
    assert "Traceback" not in output


def test_a_stalled_server_ends_requests_as_timeouts(simulator, tmp_path):
    sim = simulator("--profile", "tiny", "--fault-stall-rate", "1", "--fault-stall-s", "2")
    result = run_load(tmp_path, {**SPEC, "timeout_s": 0.5, "duration_s": 2}, sim.url)
    summary = result.summary
    assert result.returncode == 0 and summary["balanced"], result.output[-3000:]
    assert summary["outcomes"]["timeout"] > 0 and summary["outcomes"]["ok"] == 0
    assert all(r["end_s"] - r["sent_s"] < 1.0 for r in result.records if r["outcome"] == "timeout")
