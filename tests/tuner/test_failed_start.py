"""A setting the server refuses (a KV cache that cannot hold one request) is a recorded failed run, and the
plan goes on; here through the command backend, with the simulator as the command."""

from __future__ import annotations

import shlex
import sys

import pytest

from tests.conftest import free_port
from tests.tuner.support import run_files, tiny_plan, tune, write_plan


@pytest.mark.e2e
@pytest.mark.slow
def test_a_refused_start_is_recorded_and_the_plan_goes_on(tmp_path):
    template = shlex.quote(sys.executable) + " -m batchscope.cli sim serve {model} --port {port} {flags} " \
        "--profile tiny"
    plan = tiny_plan(backend={"kind": "command", "command": template, "port": free_port(), "startup_timeout_s": 30},
                     variations=[{"name": "gmu-0.05", "set": {"gpu_memory_utilization": 0.05}},
                                 {"name": "mns-2", "set": {"max_num_seqs": 2}}])
    command_file = tmp_path / "vllm-command"
    result = tune(tmp_path, write_plan(tmp_path, plan), "--exporter-command-file", str(command_file))
    assert result.returncode == 0, result.stderr
    assert "3 runs done (1 failed)" in result.stdout
    runs = run_files(tmp_path / "results" / "tiny")
    failed = runs["gmu-0.05-r0"]
    assert failed["status"] == "failed" and failed["client"] is None and failed["log_tail"]
    assert failed["failure"].startswith("server exited with status 2: ") and "\n" not in failed["failure"]
    for name in ("baseline-r0", "mns-2-r0"):
        ok = runs[name]
        assert ok["status"] == "ok" and ok["client"]["completed"] > 0 and ok["server"]["kv_capacity_tokens"] > 0
        assert ok["command_line"][1:5] == ["-m", "batchscope.cli", "sim", "serve"]
    assert "--max-num-seqs 2 " in command_file.read_text()  # the last setting started, for the exporter
    run_dir = tmp_path / "results" / "tiny" / "baseline-r0"
    for name in ("spec.yaml", "load/summary.json", "load/records.jsonl", "metrics-before.prom",
                 "metrics-after.prom", "metrics-samples.jsonl", "server.log"):
        assert (run_dir / name).is_file(), name
