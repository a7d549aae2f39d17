"""Stopping a run by signal, as a terminal's Ctrl-C or a supervisor's SIGTERM would: the result is still
written and balanced, the requests in flight count as aborted, and the exit status is 130."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.conftest import free_port, wait_until
from tests.loadgen.support import streams_running

pytestmark = pytest.mark.e2e
# long streams (tiny profile: ~0.4 s each) and a long duration: the signal always lands mid-run, mid-request
SPEC = {"input_tokens": 64, "output_tokens": 400, "timeout_s": 30, "duration_s": 600,
        "load": {"mode": "concurrency", "concurrency": 6}}



# every pair of (signal, receiver, workers) values appears once: four runs cover what eight would, in CI's time
PAIRWISE = [(signal.SIGINT, True, 2), (signal.SIGINT, False, 0), (signal.SIGTERM, False, 2),
            (signal.SIGTERM, True, 0)]


@pytest.mark.parametrize(("signum", "to_group", "workers"), PAIRWISE,
                         ids=[f"{s.name}-{'group' if g else 'master'}-w{w}" for s, g, w in PAIRWISE])
def test_a_signal_ends_the_run_with_a_balanced_result(simulator, tmp_path, signum, to_group, workers):
    sim = simulator("--profile", "tiny")
    spec_path, out = tmp_path / "spec.yaml", tmp_path / "out"
    spec_path.write_text(yaml.safe_dump(SPEC))
    # a session of its own: the process group is the master and its workers only, as under a terminal
    load = subprocess.Popen([sys.executable, "-m", "batchscope.cli", "load", "--spec", str(spec_path), "--host",
                             sim.url, "--workers", str(workers), "--out", str(out), "--metrics-port",
                             str(free_port()), "--master-port", str(free_port())],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_until(lambda: streams_running(sim.url), timeout_s=30, message="requests in flight")
        signalled = time.monotonic()
        if to_group:
            os.killpg(load.pid, signum)
        else:
            load.send_signal(signum)
        output, _ = load.communicate(timeout=60)
        ended_s = time.monotonic() - signalled
    finally:
        if load.poll() is None:
            os.killpg(load.pid, signal.SIGKILL)
            load.wait(timeout=10)
    assert load.returncode == 130, output[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    records = (out / "records.jsonl").read_text().splitlines()
    assert summary["balanced"] and summary["started"] == sum(summary["outcomes"].values()) == len(records)
    assert summary["outcomes"]["aborted"] > 0  # those in flight at the signal
    assert "interrupted" in output and "Traceback" not in output
    # the signal lands while the master spawns users on its workers: a worker with none yet must not be waited
    # for until the final reports' deadline (docker stop gives 10 s before SIGKILL)
    assert ended_s < 10, f"{ended_s:.1f} s from the signal to the exit"
