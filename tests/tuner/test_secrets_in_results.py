"""A plan that carries an API key (the server's `--api-key` in the baseline's extra_flags or in a command
backend's template; the client's in the workload's `api_key` or the tuner's $BATCHSCOPE_API_KEY): every setting's
server is started with the real key and every run authenticates, and the key is written nowhere under results/
(plan.json, run.json, spec.yaml, logs, load/, metrics samples, the report) nor printed."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.tuner.support import run_files, tiny_plan, tune, write_plan

KEY = "sk-tuner-planted-4d1f"
# what a real-time run leaves (the grep below must have covered them)
RUN_FILES = {"run.json", "spec.yaml", "server.log", "load.log", "load/summary.json", "load/records.jsonl",
             "metrics-before.prom", "metrics-samples.jsonl", "metrics-after.prom"}
REPORT_FILES = {"plan.json", "report.md", "report.html", "report.csv", "comparison.json"}


def holding_the_key(root: Path) -> list[str]:
    """Every file under root (relative paths) whose bytes hold KEY; fails when root holds no file."""
    written = [path for path in root.rglob("*") if path.is_file()]
    assert written, f"nothing written under {root}"
    return [str(path.relative_to(root)) for path in written if KEY.encode() in path.read_bytes()]


def assert_every_run_authenticated(plan_dir: Path, settings: set[str]) -> dict[str, dict]:
    runs = run_files(plan_dir)
    assert set(runs) == {f"{setting}-r0" for setting in settings}
    for name, run in runs.items():
        assert run["status"] == "ok", (name, run.get("failure"))
        assert run["client"]["completed"] > 0 and run["client"]["errors"] == 0, (name, run["client"])
    return runs


@pytest.mark.e2e
@pytest.mark.parametrize(("mode", "client_key"), [("real-time", "spec"), ("real-time", "env"), ("what-if", "spec")])
def test_a_key_in_the_baselines_flags_starts_every_setting_and_is_written_nowhere(tmp_path, mode, client_key):
    plan = tiny_plan()  # the baseline and one variation (built from the baseline)
    plan["baseline"]["extra_flags"] = ["--api-key", KEY]
    if client_key == "spec":
        plan["workload"]["api_key"] = KEY
    flags = ["--what-if"] if mode == "what-if" else []
    result = tune(tmp_path, write_plan(tmp_path, plan), *flags,
                  env={"BATCHSCOPE_API_KEY": KEY} if client_key == "env" else None)
    assert result.returncode == 0, result.stderr
    plan_dir = next((tmp_path / "results").iterdir())
    runs = assert_every_run_authenticated(plan_dir, {"baseline", "mns-2"})
    for run in runs.values():
        assert run["params"]["extra_flags"] == ["--api-key", "***"]
    if mode == "real-time":
        assert runs["mns-2-r0"]["command_line"][-6:-4] == ["--api-key", "***"]
        assert {f"mns-2-r0/{name}" for name in RUN_FILES} | REPORT_FILES <= \
            {str(p.relative_to(plan_dir)) for p in plan_dir.rglob("*")}
    assert holding_the_key(plan_dir) == []
    assert KEY not in result.stdout + result.stderr


@pytest.mark.e2e
def test_a_key_in_a_command_template_is_passed_to_the_server_and_written_nowhere(tmp_path):
    template = shlex.quote(sys.executable) + " -m batchscope.cli sim serve {model} --port {port} {flags} " \
        f"--profile tiny --api-key {KEY}"
    plan = tiny_plan(backend={"kind": "command", "command": template, "port": free_port(), "startup_timeout_s": 30})
    live_file = tmp_path / "live" / "live.json"
    result = tune(tmp_path, write_plan(tmp_path, plan), "--live-file", str(live_file),
                  env={"BATCHSCOPE_API_KEY": KEY})
    assert result.returncode == 0, result.stderr
    plan_dir = tmp_path / "results" / "tiny"
    runs = assert_every_run_authenticated(plan_dir, {"baseline", "mns-2"})
    assert runs["baseline-r0"]["command_line"][-2:] == ["--api-key", "***"]
    assert (plan_dir / "plan.json").read_text().count("--api-key ***") == 1
    assert holding_the_key(plan_dir) == [] and holding_the_key(live_file.parent) == []
    assert KEY not in result.stdout + result.stderr
