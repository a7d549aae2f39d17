"""The saturation flag: set when the load generator is starved of CPU, clear in a normal run (summary, console
and the client metrics)."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager

import pytest

from tests.conftest import run_load
from tests.loadgen.support import merged_samples

pytestmark = pytest.mark.e2e
SPIN_S = 30  # each spinner's own bound: it stops by itself even if the test dies
SPIN = f"import time\nend = time.monotonic() + {SPIN_S}\nwhile time.monotonic() < end:\n    pass\n"


def spec(concurrency: int, output_tokens: int) -> dict:
    return {"input_tokens": 16, "output_tokens": output_tokens, "warmup_s": 0.5, "duration_s": 3,
            "load": {"mode": "concurrency", "concurrency": concurrency}}


@contextmanager
def starved_core(spinners: int = 5):
    """This process and its children pinned to one core that ``spinners`` busy loops keep busy."""
    allowed = os.sched_getaffinity(0)
    core = max(allowed)
    busy = [subprocess.Popen([sys.executable, "-c", SPIN], preexec_fn=lambda: os.sched_setaffinity(0, {core}))
            for _ in range(spinners)]
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)
        for process in busy:
            process.kill()
            process.wait(timeout=10)


def test_a_normal_run_is_not_flagged(simulator, tmp_path):
    result = run_load(tmp_path, spec(4, 32), simulator("--profile", "tiny").url)
    assert result.returncode == 0, result.output[-3000:]
    generator = result.summary["generator"]
    assert generator["saturated"] is False and generator["advice"] is None, generator
    assert 0 <= generator["cpu_share"] < 0.9 and generator["read_lag_p50_s"] < 0.005
    assert "kept up" in result.output
    assert merged_samples(result)[("batchscope_client_saturated", None)] == 0


def test_a_starved_generator_is_flagged_with_advice(simulator, tmp_path):
    sim = simulator("--profile", "tiny")  # started before the pinning: the server keeps its cores
    with starved_core():
        result = run_load(tmp_path, spec(128, 64), sim.url)  # more than the sixth of a core it gets can read
    assert result.returncode == 0, result.output[-3000:]
    generator = result.summary["generator"]
    assert generator["saturated"] is True, generator
    assert "--workers" in generator["advice"] and "SATURATED" in result.output
    assert generator["read_lag_p50_s"] > 0.005 or generator["cpu_share"] >= 0.9
    assert merged_samples(result)[("batchscope_client_saturated", None)] == 1
