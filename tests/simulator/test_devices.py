"""The device a profile runs on picks vLLM's block size: 16 on CUDA, 128 on the CPU build, which takes multiples of
32 only (real-parts.md §1: `--block-size 16` -> "No common block size for 16 (CPU_ATTN: [MultipleOf(32)])"), and
names the KV capacity line ('GPU KV cache size', 'CPU KV cache size')."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import requests
import yaml

from batchscope.simulator.config import Deployment, ServeConfig
from batchscope.simulator.profile import load_profile

# how the repository's log readers find vLLM's capacity line (batchscope/exporter/docker_source.py,
# batchscope/tuner/run/servers.py)
KV_LINE = re.compile(r"(GPU|CPU) KV cache size: ([\d,]+) tokens")


def profile_file(tmp_path: Path, **changes) -> str:
    """The tiny profile as a YAML file with ``changes`` (None: the field removed)."""
    fields = yaml.safe_load((resources.files("batchscope.simulator") / "profiles" / "tiny.yaml").read_text())
    fields.update(changes)
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in fields.items() if v is not None}))
    return str(path)


def serve(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "batchscope.cli", "sim", "serve", "m", *flags],
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("name", ["h100-llama-3.1-8b", "tiny"])
def test_the_built_in_profiles_are_cuda_devices(name):
    assert load_profile(name).device == "cuda"


def test_without_a_block_size_a_deployment_takes_its_devices_default(tmp_path):
    gpu = Deployment(ServeConfig(model="m", max_model_len=8192))
    assert gpu.block_size == gpu.limits().block_size == gpu.kv_plan.block_size == 16
    cpu = Deployment(ServeConfig(model="m", profile=profile_file(tmp_path, device="cpu")))
    assert cpu.block_size == cpu.limits().block_size == cpu.kv_plan.block_size == 128
    assert cpu.kv_plan.kv_cache_tokens % 128 == 0
    assert Deployment(ServeConfig(model="m", profile="tiny", block_size=32)).block_size == 32  # a flag wins


def test_the_kv_capacity_line_names_the_device_and_stays_parseable(tmp_path):
    for device, name in (("cuda", "GPU"), ("cpu", "CPU")):
        plan = Deployment(ServeConfig(model="m", profile=profile_file(tmp_path, device=device))).kv_plan
        line = next(line for line in plan.log_lines() if "KV cache size" in line)
        assert line == (f"{name} KV cache size: {plan.kv_cache_tokens:,} tokens, Maximum concurrency for 4,096 "
                        f"tokens per request: {plan.max_concurrency:.2f}x")
        match = KV_LINE.search(line)
        assert match is not None and match.groups() == (name, f"{plan.kv_cache_tokens:,}")


@pytest.mark.parametrize("size", ["16", "8"])
def test_a_block_size_the_cpu_build_refuses_is_one_line_and_exit_2(tmp_path, size):
    result = serve("--profile", profile_file(tmp_path, device="cpu"), "--block-size", size)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"batchscope sim serve: error: --block-size: {size} ")
    assert "multiples of 32" in lines[0] and "32, 64, 128" in lines[0], lines[0]


def test_a_profile_must_say_its_device(tmp_path):
    for device, problem in ((None, "device: Field required"), ("tpu", "device: Input should be 'cuda' or 'cpu'")):
        result = serve("--profile", profile_file(tmp_path, device=device))
        assert result.returncode == 2 and problem in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.e2e
def test_sim_serve_on_a_cpu_profile_serves_128_token_blocks(simulator, tmp_path):
    sim = simulator("--profile", profile_file(tmp_path, device="cpu"))
    text = requests.get(sim.url + "/metrics", timeout=5).text
    assert 'block_size="128"' in text
    assert [match[1] for match in map(KV_LINE.search, sim.log().splitlines()) if match] == ["CPU"]
