"""`batchscope sim serve`: flags like `vllm serve`, one-line errors, vLLM's start-up lines."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import pytest

from batchscope.simulator.responses import VLLM_VERSION
from tests.conftest import wait_until

# how the repository's log readers find vLLM's capacity line (batchscope/exporter/docker_source.py,
# batchscope/tuner/run/servers.py)
KV_LINE = re.compile(r"(GPU|CPU) KV cache size: ([\d,]+) tokens")


def serve(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "batchscope.cli", "sim", "serve", "m", *flags],
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize(("flags", "field", "code"), [
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization: must be in (0, 1]", 2),
    (["--gpu-memory-utilization", "0"], "--gpu-memory-utilization: must be in (0, 1]", 2),
    (["--max-num-seqs", "256", "--max-num-batched-tokens", "128"],
     "max_num_batched_tokens (128) must be greater than or equal to max_num_seqs (256)", 2),
    (["--block-size", "7"], "--block-size: Input should be 1, 8, 16, 32, 64 or 128", 2),
    (["--max-num-seqs", "many"], "argument --max-num-seqs: invalid int value", 2),
    (["--profile", "nope"], "allowed: h100-llama-3.1-8b, tiny", 2),
    (["--gpu-memory-utilization", "0.25"], "gpu_memory_utilization", 2),
    (["--gpu-memory-utilization", "0.3"], "To serve at least one request with the models's max seq len (131072)", 2),
    (["--max-model-len", "200000"], "--max-model-len: 200000 is greater than the derived max_model_len", 2),
    (["--vocab-size", "0"], "--vocab-size: Input should be greater than 0", 2),
    # vLLM checks the overridden cache like a profiled one: 4 blocks of 16 cannot hold 131,072 tokens
    (["--num-gpu-blocks-override", "4"], "To serve at least one request with the models's max seq len (131072)", 2),
])
def test_bad_flags_give_one_line_naming_the_field_and_exit_2(flags, field, code):
    result = serve(*flags)
    assert result.returncode == code
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], result.stderr


@pytest.mark.e2e
def test_startup_reproduces_the_measured_kv_capacity_line(simulator):
    """vLLM v0.19 on an H100 measured this capacity for Llama-3.1-8B at these settings (docs/calibration-sources.md 1a);
    the simulator logs it as 0.32 does, size and concurrency on one line (real-parts.md §1)."""
    sim = simulator("--gpu-memory-utilization", "0.95", "--max-num-batched-tokens", "8192",
                    "--max-num-seqs", "1024", "--max-model-len", "8192")
    log = wait_until(lambda: "Application startup complete" in sim.log() and sim.log(), message="start-up log")
    lines = log.splitlines()
    assert any(line.endswith("] GPU KV cache size: 476,016 tokens, Maximum concurrency for 8,192 tokens per "
                             "request: 58.11x") for line in lines), log
    assert [match.groups() for match in map(KV_LINE.search, lines) if match] == [("GPU", "476,016")]
    assert "Available KV cache memory: 58.11 GiB" in log
    assert f"vLLM API server version {VLLM_VERSION} " in log and VLLM_VERSION == "0.32.0"


@pytest.mark.e2e
def test_num_gpu_blocks_override_sizes_the_cache_as_vllm_logs_it(simulator):
    sim = simulator("--profile", "tiny", "--max-model-len", "1024", "--num-gpu-blocks-override", "70")
    log = wait_until(lambda: "Application startup complete" in sim.log() and sim.log(), message="start-up log")
    assert re.search(r"Overriding num_gpu_blocks=\d+ with num_gpu_blocks_override=70$", log, re.MULTILINE), log
    assert [match.groups() for match in map(KV_LINE.search, log.splitlines()) if match] == [("GPU", "1,120")]


@pytest.mark.e2e
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_an_interrupt_exits_130_and_a_stop_exits_0(simulator, sig, code):
    sim = simulator("--profile", "tiny")
    sim.process.send_signal(sig)
    assert sim.process.wait(timeout=10) == code
    assert "Traceback" not in sim.log()
