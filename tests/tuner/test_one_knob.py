"""examples/one-knob.yaml end to end through `batchscope tune`: in real time (a copy with short windows, one
max_num_batched_tokens variation) and on the virtual clock as written, each knob moves the figures the way the
plan's comments say; the report marks those moves indicative (one repeat per setting: never significant,
tests/tuner/test_significance.py), and the what-if run shows the figures, the window's request count and the
recommendation the comments state."""

from __future__ import annotations

import json
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
    # mnbt-8192's story is the what-if run's below; real time keeps one max_num_batched_tokens variation
    plan["variations"] = [v for v in plan["variations"] if v["name"] != "mnbt-8192"]
    plan.update(warmup_s=6, window_s=6)  # the warm-up covers the first round of 48 arrivals
    result = tune(tmp_path, write_plan(tmp_path, plan), timeout_s=240)
    assert result.returncode == 0, result.stderr
    plan_dir = tmp_path / "results" / "one-knob"
    assert_directions(runs_by_setting(plan_dir, SETTINGS - {"mnbt-8192"}))
    assert_significant_moves(plan_dir)
    assert "report: " in result.stdout


@pytest.mark.e2e
def test_the_what_if_run_of_the_example_as_written_shows_what_its_comments_say(tmp_path):
    result = tune(tmp_path, EXAMPLE, "--what-if", timeout_s=120)
    assert result.returncode == 0, result.stderr
    plan_dir = tmp_path / "results" / "one-knob.what-if"
    runs = runs_by_setting(plan_dir, SETTINGS)
    assert {run["mode"] for run in runs.values()} == {"what-if"}
    assert_directions(runs)
    assert_significant_moves(plan_dir)
    assert_the_comments(runs, plan_dir)
    assert "Recommended: baseline" in result.stdout and "TTFT p99 (ms)" in result.stdout  # the terminal's table


def assert_the_comments(runs: dict[str, dict], plan_dir: Path) -> None:
    """What examples/one-knob.yaml's comments say its what-if run shows."""
    def p99(name: str, figure: str) -> float:
        return runs[name]["client"][figure]["p99"]

    def p50(name: str, figure: str) -> float:
        return runs[name]["client"][figure]["p50"]

    base = runs["baseline"]["client"]
    # the window: >= 1,000 requests at the baseline, so its p99 rests on 10 or more; ~540 at gmu-0.25
    assert base["completed"] >= 1000 and 500 <= runs["gmu-0.25"]["client"]["completed"] < 600
    assert 0.15 < p50("baseline", "ttft") < 0.2 and 0.2 < p99("baseline", "ttft") < 0.25  # 164 / 225 ms
    assert 9.5 < base["completion_throughput_rps"] < 10.7
    assert 2.8 < p99("mnbt-1024", "ttft") / p99("baseline", "ttft") < 3.4 and p99("mnbt-1024", "ttft") > 0.5
    assert 0.8 < p99("mnbt-1024", "tpot") / p99("baseline", "tpot") < 0.86  # −17%
    assert 1.7 < p50("mnbt-8192", "ttft") / p50("baseline", "ttft") < 2.2
    assert 2.4 < p99("mnbt-8192", "ttft") / p99("baseline", "ttft") < 3.0
    assert 1.03 < p99("mnbt-8192", "tpot") / p99("baseline", "tpot") < 1.1  # +6%
    assert 3.2 < p99("mnbt-8192", "itl") / p99("baseline", "itl") < 3.8
    assert runs["mns-32"]["server"]["max_waiting"] == 16 and 2.1 < p99("mns-32", "ttft") < 2.5
    assert 0.68 < p99("mns-32", "tpot") / p99("baseline", "tpot") < 0.76  # −28%
    assert 7 < p99("gmu-0.25", "ttft") < 8.2 and runs["gmu-0.25"]["server"]["preemptions"] > 0
    assert 0.45 < runs["gmu-0.25"]["client"]["completion_throughput_rps"] / base["completion_throughput_rps"] < 0.6
    comparison = json.loads((plan_dir / "comparison.json").read_text())
    assert comparison["verdicts"]["met_slos"] == ["baseline"]
    report = (plan_dir / "report.md").read_text()
    assert "**Recommended: baseline** — highest goodput among the settings that met the SLOs" in report
    assert "the only setting that met them" in report and "no difference is called significant" in report
    # nothing waited at the baseline: its prefill throughput is the load's, and the suggestion says so
    assert "at baseline no queue formed and none was rejected" in report and "a lower bound" in report


def runs_by_setting(plan_dir: Path, settings: set[str]) -> dict[str, dict]:
    runs = {name.removesuffix("-r0"): run for name, run in run_files(plan_dir).items()}
    assert set(runs) == settings
    assert all(run["status"] == "ok" and run["client"]["completed"] > 0 for run in runs.values())
    return runs


def assert_directions(runs: dict[str, dict]) -> None:
    def ttft(name: str) -> float:
        return runs[name]["client"]["ttft"]["mean"]

    def tpot(name: str) -> float:
        return runs[name]["client"]["tpot"]["mean"]

    def server(name: str, field: str) -> float:
        return runs[name]["server"][field]

    # fewer prefill tokens per step: a 3,072-token prompt takes three steps instead of two, but the steps are
    # shorter; more (8192) shares a long step between several prompts
    assert ttft("mnbt-1024") > ttft("baseline") and tpot("mnbt-1024") < tpot("baseline")
    if "mnbt-8192" in runs:
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
