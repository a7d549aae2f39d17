"""examples/one-knob.yaml end to end through `batchscope tune`: in real time (windows shortened) and on the
virtual clock (as written), each knob moves the figures the way the seed article says, and the report marks
those moves indicative (one repeat per setting: never significant, tests/tuner/test_significance.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from tests.tuner.support import run_files, tune, write_plan

EXAMPLE = Path(__file__).parents[2] / "examples" / "one-knob.yaml"
SETTINGS = {"baseline", "mnbt-1024", "mnbt-8192", "mns-32", "gmu-0.25"}


@pytest.mark.e2e
@pytest.mark.slow
def test_the_one_knob_example_shows_each_knobs_direction(tmp_path):
    plan = yaml.safe_load(EXAMPLE.read_text())
    plan.update(warmup_s=6, window_s=6)  # the warm-up covers the first round of 48 arrivals
    result = tune(tmp_path, write_plan(tmp_path, plan), timeout_s=240)
    assert result.returncode == 0, result.stderr
    plan_dir = tmp_path / "results" / "one-knob"
    assert_directions(runs_by_setting(plan_dir))
    assert_significant_moves(plan_dir)
    assert "report: " in result.stdout


@pytest.mark.e2e
def test_the_what_if_run_of_the_same_plan_takes_seconds_and_agrees_in_direction(tmp_path):
    started = time.monotonic()
    result = tune(tmp_path, EXAMPLE, "--what-if", timeout_s=60)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert elapsed < 10, f"what-if took {elapsed:.1f}s"
    plan_dir = tmp_path / "results" / "one-knob.what-if"
    runs = runs_by_setting(plan_dir)
    assert {run["mode"] for run in runs.values()} == {"what-if"}
    assert_directions(runs)
    assert_significant_moves(plan_dir)


def runs_by_setting(plan_dir: Path) -> dict[str, dict]:
    runs = {name.removesuffix("-r0"): run for name, run in run_files(plan_dir).items()}
    assert set(runs) == SETTINGS
    assert all(run["status"] == "ok" and run["client"]["completed"] > 0 for run in runs.values())
    return runs


def assert_directions(runs: dict[str, dict]) -> None:
    def ttft(name: str) -> float:
        return runs[name]["client"]["ttft"]["mean"]

    def tpot(name: str) -> float:
        return runs[name]["client"]["tpot"]["mean"]

    def server(name: str, field: str) -> float:
        return runs[name]["server"][field]

    # more prefill tokens per step: a 3,072-token prompt in one step instead of four, but longer steps
    assert ttft("mnbt-8192") < ttft("mnbt-1024") and tpot("mnbt-8192") > tpot("mnbt-1024")
    # 32 sequences per step for 48 users: the rest wait in vLLM's queue
    assert server("mns-32", "max_waiting") >= 10 > server("baseline", "max_waiting")
    assert ttft("mns-32") > ttft("baseline")
    # a KV cache of 8 requests for 48 users: preemptions; none at the baseline
    assert server("gmu-0.25", "preemptions") > 0 == server("baseline", "preemptions")
    assert server("gmu-0.25", "kv_capacity_tokens") < server("baseline", "kv_capacity_tokens") / 10


def assert_significant_moves(plan_dir: Path) -> None:
    """The report's comparison: each expected move against the baseline, in its direction, its within-run interval
    clear of 0: indicative, as one repeat can only be."""
    comparison = json.loads((plan_dir / "comparison.json").read_text())
    moves = {(v["setting"], m["metric"]): m for v in comparison["variations"] for m in v["metrics"]}
    for setting, metric in (("mnbt-1024", "ttft_p99"), ("mns-32", "ttft_p99"), ("gmu-0.25", "preemptions")):
        move = moves[(setting, metric)]
        assert move["delta"] > 0 and move["ci_low"] > 0 and move["evidence"] == "indicative", (setting, metric, move)
        assert move["significant"] is False
    explanation = next(v["explanation"] for v in comparison["variations"] if v["setting"] == "gmu-0.25")
    assert "preemptions" in explanation and "KV" in explanation
