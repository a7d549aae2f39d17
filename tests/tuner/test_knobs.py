"""Only the knobs a plan sets are passed to the server (vLLM's defaults for the rest, as the CPU build needs: its
block size must be a multiple of 32, and 0.92 of its node's memory is refused), in every backend's argv, and
what the server chose is read back and recorded."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from batchscope.simulator.responses import VLLM_VERSION
from batchscope.tuner.plan import CommandBackend, Plan, ServingParams, SimulatorBackend
from batchscope.tuner.run.observers import diff
from batchscope.tuner.run.servers import SimulatorServer, command_argv, replace_knobs, simulator_argv
from batchscope.vllm.knobs import KNOBS, without_knobs
from tests.tuner.support import run_files, tiny_plan, tune, write_plan

MODEL = "/tmp/tinymodel"


def test_a_baseline_that_sets_no_knob_passes_no_knob_flag():
    params = ServingParams(model=MODEL)
    assert params.flags() == []
    assert ServingParams(model=MODEL, block_size=32, extra_flags=["--enforce-eager"]).flags() == \
        ["--block-size", "32", "--enforce-eager"]
    argv = simulator_argv(SimulatorBackend(profile="tiny"), params, 8123)
    assert not any(word in argv for word in (knob.flag for knob in KNOBS))
    argv = command_argv(CommandBackend(port=8123), params)
    assert argv == ["vllm", "serve", MODEL, "--host", "127.0.0.1", "--port", "8123"]


def test_the_cross_knob_rule_applies_only_when_both_knobs_are_set():
    assert ServingParams(model=MODEL, max_num_seqs=4096).max_num_batched_tokens is None  # vLLM picks a fit one
    assert ServingParams(model=MODEL, max_num_batched_tokens=16).max_num_seqs is None
    with pytest.raises(ValidationError, match="max_num_batched_tokens"):
        ServingParams(model=MODEL, max_num_seqs=64, max_num_batched_tokens=32)


def test_a_variation_may_set_a_knob_the_baseline_leaves_unset():
    plan = Plan.model_validate(tiny_plan(baseline={"model": MODEL},
                                         variations=[{"name": "bs-32", "set": {"block_size": 32}}]))
    (_, baseline), (_, variation) = plan.settings()
    assert baseline.flags() == [] and variation.flags() == ["--block-size", "32"]
    assert diff(baseline, variation) == ["block_size: vLLM default → 32"]


def test_a_container_loses_the_knobs_a_setting_leaves_unset_in_every_spelling():
    # the previous run's re-created container: its knob values are another setting's, never this one's
    command = [MODEL, "--block-size=16", "--gpu_memory_utilization", "0.9", "--max-num_seqs", "8", "--api-key",
               "sk-1", "--enable-prefix-caching"]
    assert without_knobs(command) == [MODEL, "--api-key", "sk-1", "--enable-prefix-caching"]
    replaced = replace_knobs(command, ServingParams(model=MODEL, max_num_seqs=32))
    assert replaced == [MODEL, "--api-key", "sk-1", "--enable-prefix-caching", "--max-num-seqs", "32"]


@pytest.mark.e2e
def test_what_the_server_chose_is_read_back_after_a_start(tmp_path):
    server = SimulatorServer(SimulatorBackend(profile="tiny"))
    started = server.start(ServingParams(model="sim-model"), tmp_path / "server.log")
    server.stop()
    reported = started.reported
    assert (reported.vllm_version, reported.block_size, reported.gpu_memory_utilization) == (VLLM_VERSION, 16, 0.92)
    assert reported.max_model_len == 4096  # the tiny profile's context length: no --max-model-len was passed
    assert reported.num_gpu_blocks and reported.kv_capacity_tokens == reported.num_gpu_blocks * 16
    assert not any(knob.flag in started.command_line for knob in KNOBS)


@pytest.mark.e2e
@pytest.mark.slow
def test_a_plan_without_knobs_runs_and_its_runs_record_what_the_server_chose(tmp_path):
    plan = tiny_plan(baseline={"model": "sim-model"}, variations=[{"name": "bs-32", "set": {"block_size": 32}}])
    result = tune(tmp_path, write_plan(tmp_path, plan))
    assert result.returncode == 0, result.stderr
    runs = run_files(tmp_path / "results" / "tiny")
    assert {name: run["status"] for name, run in runs.items()} == {"baseline-r0": "ok", "bs-32-r0": "ok"}
    assert "--block-size" not in runs["baseline-r0"]["command_line"]
    assert runs["baseline-r0"]["params"]["block_size"] is None and runs["baseline-r0"]["schema_version"] == 2
    assert [run["reported"]["block_size"] for run in runs.values()] == [16, 32]
    assert {run["reported"]["vllm_version"] for run in runs.values()} == {VLLM_VERSION}
    assert runs["bs-32-r0"]["reported"]["kv_capacity_tokens"] == runs["bs-32-r0"]["server"]["kv_capacity_tokens"]
    report = (tmp_path / "results" / "tiny" / "report.md").read_text()
    assert "block_size vLLM default → 32" in report and "default (16)" in report
