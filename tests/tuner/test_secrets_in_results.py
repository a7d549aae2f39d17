"""A plan that carries an API key (the workload's `api_key`, the server's `--api-key` in extra_flags): the runs
authenticate, and the key is written nowhere under results/ nor printed."""

from __future__ import annotations

import pytest

from tests.tuner.support import run_files, tiny_plan, tune, write_plan

KEY = "sk-tuner-planted-4d1f"


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["real-time", "what-if"])
def test_the_key_authenticates_and_is_written_nowhere(tmp_path, mode):
    plan = tiny_plan(variations=[])
    plan["workload"]["api_key"] = KEY
    plan["baseline"]["extra_flags"] = ["--api-key", KEY]
    flags = ["--what-if"] if mode == "what-if" else []
    result = tune(tmp_path, write_plan(tmp_path, plan), *flags)
    assert result.returncode == 0, result.stderr
    plan_dir = next((tmp_path / "results").iterdir())
    (run,) = run_files(plan_dir).values()
    assert run["status"] == "ok" and run["client"]["completed"] > 0, run.get("failure")
    assert run["params"]["extra_flags"] == ["--api-key", "***"]
    written = [path for path in plan_dir.rglob("*") if path.is_file()]
    assert written and not [path for path in written if KEY.encode() in path.read_bytes()]
    assert KEY not in result.stdout + result.stderr
