"""A setting the server refuses (a KV cache that cannot hold one request) is a recorded failed run, and the
plan goes on; here through the command backend, with the simulator as the command. The failure names its cause
as the log gives it (a real vLLM's log ends in lines that are not the cause), and the run records the command
line that was run."""

from __future__ import annotations

import json
import shlex
import sys

import pytest

from batchscope.vllm.log import failure_cause
from tests.conftest import free_port
from tests.tuner.support import run_files, tiny_plan, tune, write_plan

CAUSE = "ValueError: To serve at least one request with the model's max seq len (4096), ..."
# The end of a real vLLM 0.32 start that failed (shared/reference/real-parts.md; the formats are vLLM's own: its
# log prefix on every line of the engine core's traceback, the API server's re-raise, then multiprocessing's
# shutdown warnings).
FAILED_START_LOG = f"""\
(EngineCore_DP0 pid=4242) INFO 12-01 10:00:00 [cpu_worker.py:260] Auto set (1.15/12.34) GiB for KV cache on node 0.
(EngineCore_DP0 pid=4242) ERROR 12-01 10:00:01 [core.py:1510] EngineCore failed to start.
(EngineCore_DP0 pid=4242) ERROR 12-01 10:00:01 [core.py:1510] Traceback (most recent call last):
(EngineCore_DP0 pid=4242) ERROR 12-01 10:00:01 [core.py:1510]   File "vllm/v1/core/kv_cache_utils.py", line 1031
(EngineCore_DP0 pid=4242) ERROR 12-01 10:00:01 [core.py:1510] {CAUSE}
Traceback (most recent call last):
  File "vllm/v1/engine/utils.py", line 1432, in wait_for_engine_startup
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {{'EngineCore_DP0': 1}}
/usr/lib/python3.11/multiprocessing/resource_tracker.py:224: UserWarning: resource_tracker: There appear to be 1 \
leaked shared_memory objects to clean up at shutdown
  warnings.warn('resource_tracker: There appear to be %d '
"""


@pytest.mark.parametrize("prefixed", [True, False])
def test_the_cause_is_the_last_exception_line_not_the_last_line(prefixed):
    lines = FAILED_START_LOG.splitlines()
    if not prefixed:  # as real-parts.md quotes it: the exception line alone
        lines = [CAUSE if line.endswith(CAUSE) else line for line in lines]
    assert failure_cause(lines) == CAUSE
    pointer = "RuntimeError: Engine core initialization failed. See root cause above."
    assert failure_cause([pointer, "warning"]) == pointer  # no other cause given: the pointer is what there is
    assert failure_cause(["Killed", ""]) == "Killed" and failure_cause([]) is None


@pytest.mark.e2e
def test_a_failed_start_is_recorded_with_its_cause_and_the_command_line_run(tmp_path):
    log = tmp_path / "vllm-output.txt"
    log.write_text(FAILED_START_LOG)
    # a stand-in for `vllm serve` that prints the real server's output of a refused start and exits 1
    code = "import sys; sys.stdout.write(open(sys.argv[1]).read()); sys.exit(1)"
    template = f"{shlex.quote(sys.executable)} -c {shlex.quote(code)} {shlex.quote(str(log))} {{model}} " \
        "--port {port} {flags} --api-key sk-refused-0a1b"
    plan = tiny_plan(backend={"kind": "command", "command": template, "port": free_port(), "startup_timeout_s": 30},
                     variations=[])
    result = tune(tmp_path, write_plan(tmp_path, plan))
    assert result.returncode == 4, result.stderr  # recorded; with no baseline, nothing was compared
    failed = run_files(tmp_path / "results" / "tiny")["baseline-r0"]
    assert failed["status"] == "failed" and failed["failure"] == f"server exited with status 1: {CAUSE}"
    assert failed["command_line"][1:3] == ["-c", code] and failed["command_line"][-2:] == ["--api-key", "***"]
    assert "--max-model-len" in failed["command_line"] and failed["log_tail"][-1].startswith("  warnings.warn")
    assert "sk-refused-0a1b" not in json.dumps(failed)


@pytest.mark.e2e
@pytest.mark.slow
def test_a_refused_start_is_recorded_and_the_plan_goes_on(tmp_path):
    template = shlex.quote(sys.executable) + " -m batchscope.cli sim serve {model} --port {port} {flags} " \
        "--profile tiny"
    plan = tiny_plan(backend={"kind": "command", "command": template, "port": free_port(), "startup_timeout_s": 30},
                     variations=[{"name": "gmu-0.05", "set": {"gpu_memory_utilization": 0.05}},
                                 {"name": "mns-2", "set": {"max_num_seqs": 2}}])
    live_file = tmp_path / "live.json"
    result = tune(tmp_path, write_plan(tmp_path, plan), "--live-file", str(live_file))
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
    live = json.loads(live_file.read_text())  # the last run started, for an exporter that follows the plan
    assert (live["setting"], live["command_line"]) == ("mns-2", runs["mns-2-r0"]["command_line"])
    assert failed["command_line"] and "--gpu-memory-utilization" in failed["command_line"]
    run_dir = tmp_path / "results" / "tiny" / "baseline-r0"
    for name in ("spec.yaml", "load/summary.json", "load/records.jsonl", "metrics-before.prom",
                 "metrics-after.prom", "metrics-samples.jsonl", "server.log"):
        assert (run_dir / name).is_file(), name


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["real-time", "what-if"])
def test_a_plan_whose_baseline_failed_exits_4_with_its_runs_recorded(tmp_path, mode):
    # a KV cache that cannot hold one request: the simulator refuses to start, as vLLM does
    plan = tiny_plan(baseline={"model": "sim-model", "max_model_len": 1024, "gpu_memory_utilization": 0.05})
    result = tune(tmp_path, write_plan(tmp_path, plan), *(["--what-if"] if mode == "what-if" else []))
    assert result.returncode == 4, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("batchscope tune: error: the baseline failed in every run (") and "Traceback" not in \
        result.stderr
    runs = run_files(next((tmp_path / "results").iterdir()))
    assert set(runs) == {"baseline-r0", "mns-2-r0"} and {run["status"] for run in runs.values()} == {"failed"}
    assert runs["baseline-r0"]["failure"] in last


@pytest.mark.e2e
def test_a_plan_whose_every_variation_failed_exits_4(tmp_path):
    plan = tiny_plan(variations=[{"name": "gmu-0.05", "set": {"gpu_memory_utilization": 0.05}}])
    result = tune(tmp_path, write_plan(tmp_path, plan), "--what-if")
    assert result.returncode == 4, result.stderr
    assert result.stderr.strip().splitlines()[-1] == \
        "batchscope tune: error: every variation failed: nothing was compared with the baseline"
    runs = run_files(tmp_path / "results" / "tiny.what-if")
    assert (runs["baseline-r0"]["status"], runs["gmu-0.05-r0"]["status"]) == ("ok", "failed")


@pytest.mark.e2e
def test_a_command_that_cannot_be_run_is_a_failed_start_not_a_traceback(tmp_path):
    plan = tiny_plan(backend={"kind": "command", "command": "no-such-vllm-7c1e serve {model} --port {port} {flags}",
                              "port": free_port(), "startup_timeout_s": 30}, variations=[])
    result = tune(tmp_path, write_plan(tmp_path, plan))
    assert result.returncode == 4 and "Traceback" not in result.stderr, result.stderr
    failed = run_files(tmp_path / "results" / "tiny")["baseline-r0"]
    assert failed["failure"] == "cannot run no-such-vllm-7c1e: No such file or directory"
    assert failed["command_line"][:2] == ["no-such-vllm-7c1e", "serve"]


@pytest.mark.e2e
@pytest.mark.parametrize(("scenario", "variation_fails"), [("offline", False), ("server", False), ("offline", True)])
def test_a_scenario_that_measured_nothing_to_compare_exits_4(tmp_path, scenario, variation_fails):
    # a KV cache that cannot hold one request fails every start, on the virtual clock as on a server
    small = {"gpu_memory_utilization": 0.05}
    plan = tiny_plan(baseline={"model": "sim-model", "max_model_len": 1024, **({} if variation_fails else small)},
                     variations=[{"name": "gmu-0.05", "set": small}] if variation_fails else [])
    result = tune(tmp_path, write_plan(tmp_path, plan), "--scenario", scenario, "--what-if", "--requests", "8")
    assert result.returncode == 4 and "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    expected = "every variation's runs failed" if variation_fails else "the baseline's runs all failed ("
    assert last.startswith(f"batchscope tune: error: {expected}"), last


@pytest.mark.e2e
def test_a_docker_backend_without_an_engine_is_a_recorded_failed_run_in_one_line(tmp_path):
    socket = tmp_path / "no-engine.sock"  # nothing listens there
    plan = tiny_plan(backend={"kind": "docker", "container": "vllm-1", "url": f"http://127.0.0.1:{free_port()}"},
                     variations=[])
    result = tune(tmp_path, write_plan(tmp_path, plan), env={"DOCKER_HOST": f"unix://{socket}"})
    assert result.returncode == 4 and "Traceback" not in result.stderr, result.stderr
    failed = run_files(tmp_path / "results" / "tiny")["baseline-r0"]
    assert failed["failure"] == f"docker: no Docker engine answers at unix://{socket} (is dockerd running, and " \
        "DOCKER_HOST right?)"
