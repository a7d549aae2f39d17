"""examples/queue-knobs.yaml through `batchscope tune`: on the virtual clock as written, the report and the terminal
show the rejections, goodput and the suggested max_num_queued_tokens its comments describe; in real time against
the simulator (short windows, the queue cap alone) the same ranking of the caps by rejected share and TTFT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from batchscope.tuner.run.metrics_sampler import SAMPLE_INTERVAL_S
from tests.tuner.support import run_files, tune, write_plan

EXAMPLE = Path(__file__).parents[2] / "examples" / "queue-knobs.yaml"


def _settings(plan_dir: Path) -> dict[str, dict]:
    comparison = json.loads((plan_dir / "comparison.json").read_text())
    return {s["setting"]: s for s in comparison["settings"]}


@pytest.mark.e2e
def test_the_queue_knobs_example_reports_rejections_goodput_and_the_suggestion(tmp_path):
    result = tune(tmp_path, EXAMPLE, "--what-if", timeout_s=120)
    assert result.returncode == 0, result.stderr
    plan_dir = tmp_path / "results" / "queue-knobs.what-if"
    settings = _settings(plan_dir)

    def value(setting: str, key: str) -> float:
        return settings[setting]["values"][key]

    # the comments' story: no cap, a queue that only grows; a cap below max_num_seqs buys latency with refusals
    # and a smaller batch; max_num_seqs + a short queue meets the bound with the best goodput; a deep queue
    # fills in the window, then rejects the same excess and makes every admitted request wait; the long-prefill
    # cap lowers ITL p50, lengthens prefill and rejects nothing
    assert value("baseline", "ttft_p99") > 4.0 and value("baseline", "rejected") == 0
    assert value("mnqr-64", "rejected_share") > value("mnqr-136", "rejected_share") > \
        value("mnqr-256", "rejected_share") > 0 == value("lptt-256", "rejected")
    assert 0.2 < value("mnqr-136", "rejected_share") < 0.3 and 0.15 < value("mnqr-256", "rejected_share") < 0.2
    assert value("baseline", "max_waiting") > 300 and value("mnqr-256", "max_waiting") == 128
    assert value("mnqr-64", "ttft_p99") < 0.5 and 9 < value("mnqr-256", "ttft_p99") < 12
    assert value("lptt-256", "ttft_p99") > 0.9 * value("baseline", "ttft_p99")
    prefill = {name: s["signals"]["prefill_time_mean_s"] for name, s in settings.items()}
    assert 3 < prefill["lptt-256"] / prefill["baseline"] < 4
    # the window: ~1,000 completed requests in every setting, so each p99 rests on ~10
    assert all(900 < run["client"]["completed"] < 1200 for run in run_files(plan_dir).values())
    assert value("mnqr-64", "completion_throughput_rps") < 0.95 * value("baseline", "completion_throughput_rps")
    assert value("mnqr-136", "ttft_p99") < 2.0 < value("mnqr-256", "ttft_p99")
    assert value("mnqr-136", "goodput_rps") > 2 * value("baseline", "goodput_rps")
    assert value("lptt-256", "itl_p50") < 0.8 * value("baseline", "itl_p50")
    # the server's counter and the client's records agree, refusal for refusal
    assert all(s["signals"]["admission_rejections"] == s["values"]["rejected"] for s in settings.values())
    report = (plan_dir / "report.md").read_text()
    assert "**Recommended: mnqr-136**" in report and "Note: it rejects 24% of arrivals at admission" in report
    assert "the queue is capped at 64 requests (max_num_queued_reqs), below max_num_seqs 128" in report
    assert "Suggested max_num_queued_tokens for mnqr-136: **" in report
    assert "at mnqr-136 up to 9 requests waited, so the load exceeded what the server took" in report
    lines = result.stdout.splitlines()
    assert "rejected (%)" in next(line for line in lines if line.startswith("setting "))
    share = f"{value('mnqr-136', 'rejected_share') * 100:.1f}"
    assert f" {share} " in next(line for line in lines if line.startswith("mnqr-136 "))  # in the results table
    suggestion = next(line for line in lines if line.startswith("Suggested max_num_queued_tokens"))
    tokens = int(suggestion.split(": ")[1].split(" = ")[0].replace(",", ""))
    assert 40_000 < tokens < 60_000 and "TTFT target 2 s" in suggestion  # 2 s x ~24,600 tokens/s


@pytest.mark.e2e
@pytest.mark.slow
def test_a_real_time_tune_of_the_queue_cap_ranks_as_its_what_if(tmp_path):
    # the example with 32 output tokens, so that a request admitted in a ten-second run ends in its window: the
    # server then completes about 19 a second, 33 running; at 40/s the queue a cap of 40 or 80 bounds builds in
    # the warm-up
    plan = yaml.safe_load(EXAMPLE.read_text())
    plan["workload"].update(output_tokens=32)
    plan["workload"]["load"]["rate"] = 40
    plan["variations"] = [{"name": f"mnqr-{cap}", "set": {"max_num_queued_reqs": cap}} for cap in (40, 80)]
    plan.update(warmup_s=4, window_s=6)
    path = write_plan(tmp_path, plan)
    real = tune(tmp_path, path, timeout_s=240)
    assert real.returncode == 0, real.stderr
    what_if = tune(tmp_path, path, "--what-if", timeout_s=120)
    assert what_if.returncode == 0, what_if.stderr
    for plan_dir in (tmp_path / "results" / "queue-knobs", tmp_path / "results" / "queue-knobs.what-if"):
        settings = _settings(plan_dir)

        def value(setting: str, key: str, values: dict = settings) -> float:
            return values[setting]["values"][key]

        # once either queue is full each refuses the excess over what the server completes (about half of 40/s):
        # shares alike; the longer queue is what the arrivals it admits wait in
        shares = value("mnqr-40", "rejected_share"), value("mnqr-80", "rejected_share")
        assert min(shares) > 0.4 and abs(shares[0] - shares[1]) < 0.05 and value("baseline", "rejected") == 0, \
            plan_dir.name
        assert value("mnqr-40", "ttft_p99") < value("mnqr-80", "ttft_p99") < value("baseline", "ttft_p99"), \
            plan_dir.name
        assert "Suggested max_num_queued_tokens for " in (plan_dir / "report.md").read_text()
    # in real time the load generator's count is the simulator's counter's increase over the window, within the
    # refusals a /metrics read a second apart can put on the other side of the window's edges: half a second's at
    # each edge, a second's in all (16 of 159 in a 6 s window was seen on a loaded machine)
    for run in run_files(tmp_path / "results" / "queue-knobs").values():
        client, server = run["client"], run["server"]
        per_second = server["admission_rejections"] / client["window_s"]
        assert abs(sum(client["rejected"].values()) - server["admission_rejections"]) <= \
            max(3, per_second * SAMPLE_INTERVAL_S), run["setting"]
