"""examples/one-knob.yaml end to end in real time (windows shortened) through `batchscope tune`: each knob moves
the figures the way the seed article says."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.tuner.support import run_files, tune, write_plan

EXAMPLE = Path(__file__).parents[2] / "examples" / "one-knob.yaml"


def test_the_one_knob_example_shows_each_knobs_direction(tmp_path):
    plan = yaml.safe_load(EXAMPLE.read_text())
    plan.update(warmup_s=6, window_s=6)  # the warm-up covers the first round of 48 arrivals
    result = tune(tmp_path, write_plan(tmp_path, plan), timeout_s=240)
    assert result.returncode == 0, result.stderr
    runs = {name.removesuffix("-r0"): run for name, run in run_files(tmp_path / "results" / "one-knob").items()}
    assert set(runs) == {"baseline", "mnbt-1024", "mnbt-8192", "mns-32", "gmu-0.25"}
    assert all(run["status"] == "ok" and run["client"]["completed"] > 0 for run in runs.values())

    def ttft(name: str) -> float:
        return runs[name]["client"]["ttft"]["mean"]

    def server(name: str, field: str) -> float:
        return runs[name]["server"][field]

    def tpot(name: str) -> float:
        return runs[name]["client"]["tpot"]["mean"]

    # more prefill tokens per step: a 3,072-token prompt in one step instead of four, but longer steps
    assert ttft("mnbt-8192") < ttft("mnbt-1024") and tpot("mnbt-8192") > tpot("mnbt-1024")
    # 32 sequences per step for 48 users: the rest wait in vLLM's queue
    assert server("mns-32", "max_waiting") >= 10 > server("baseline", "max_waiting")
    assert ttft("mns-32") > ttft("baseline")
    # a KV cache of 8 requests for 48 users: preemptions; none at the baseline
    assert server("gmu-0.25", "preemptions") > 0 == server("baseline", "preemptions")
    assert server("gmu-0.25", "kv_capacity_tokens") < server("baseline", "kv_capacity_tokens") / 10
    assert "report: " in result.stdout
