"""The one simulator launcher: ready when /health answers, a failed start reported with the simulator's words."""

from __future__ import annotations

import pytest
import requests

from batchscope.testkit.processes import SetupError
from batchscope.testkit.simulator import start_simulator

pytestmark = pytest.mark.e2e


def test_started_on_loopback_serving_until_stopped(tmp_path):
    sim = start_simulator(tmp_path, "--profile", "tiny", model="launcher-model", log_name="sim.log")
    try:
        assert sim.url.startswith("http://127.0.0.1:")
        assert requests.get(sim.url + "/v1/models", timeout=5).json()["data"][0]["id"] == "launcher-model"
        assert "Starting vLLM API server 0 on " + sim.url in (tmp_path / "sim.log").read_text()
    finally:
        sim.stop()
    assert sim.process.poll() is not None
    with pytest.raises(requests.ConnectionError):
        requests.get(sim.url + "/health", timeout=5)


def test_a_failed_start_is_reported_with_the_log(tmp_path):
    with pytest.raises(SetupError, match=r"(?s)simulator exited early \(status 2\).*--max-num-seqs"):
        start_simulator(tmp_path, "--max-num-seqs", "0")
