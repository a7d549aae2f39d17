"""A tuner plan over max_num_queued_reqs on real vLLM (the command backend, two starts) ranks its settings as the
simulator's what-if of the same plan does, and its rejections are vLLM's own count.

Sixteen closed-loop users on max_num_seqs 8: without a queue limit eight run and eight wait in vLLM's queue; with
max_num_queued_reqs 8 vLLM answers the other eight 503 (each pauses the load generator's 0.1 s and tries again),
so nobody waits behind a running batch: a lower TTFT, bought with a large rejected share.
"""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from batchscope.vllm.catalogue import ADMISSION_REJECTIONS
from tests.real_vllm.test_tuner import TUNE_TIMEOUT_S, real_plan, tune
from tests.tuner.support import run_files


def _plan() -> dict:
    plan = real_plan(name="queue", variations=[{"name": "mnqr-8", "set": {"max_num_queued_reqs": 8}}],
                     warmup_s=1, window_s=4)
    plan["workload"].update(output_tokens=32, load={"mode": "concurrency", "concurrency": 16})
    return plan


def _rejected_since_start(run_dir) -> float:
    """vLLM's admission counter in the run's last /metrics read (every reason): refusals since its start."""
    text = (run_dir / "metrics-after.prom").read_text()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == ADMISSION_REJECTIONS.exposed_name)


def _rejected_by_the_client(run_dir) -> int:
    """The load generator's rejected_busy records over the whole run (warm-up and the end included)."""
    lines = (run_dir / "load" / "records.jsonl").read_text().splitlines()
    return sum(json.loads(line)["outcome"] == "rejected_busy" for line in lines if line.strip())


@pytest.mark.timeout(TUNE_TIMEOUT_S * 2)
def test_a_queue_limit_plan_on_real_vllm_ranks_as_its_what_if(tmp_path):
    plan = _plan()
    real = tune(tmp_path, plan)
    assert real.returncode == 0, real.stdout[-2000:] + real.stderr[-3000:]
    what_if = tune(tmp_path, plan, "--what-if")
    assert what_if.returncode == 0, what_if.stderr[-3000:]
    plan_dir = tmp_path / "results" / "queue"
    runs = run_files(plan_dir)
    assert "--max-num-queued-reqs 8" in " ".join(runs["mnqr-8-r0"]["command_line"])
    # every refusal the load generator recorded is one vLLM counted, exactly, and the baseline refuses none
    for name in ("baseline-r0", "mnqr-8-r0"):
        assert _rejected_by_the_client(plan_dir / name) == _rejected_since_start(plan_dir / name), name
    assert _rejected_since_start(plan_dir / "baseline-r0") == 0

    for folder in ("queue", "queue.what-if"):
        comparison = json.loads((tmp_path / "results" / folder / "comparison.json").read_text())
        values = {s["setting"]: s["values"] for s in comparison["settings"]}
        capped, free = values["mnqr-8"], values["baseline"]
        assert free["rejected"] == 0 and capped["rejected_share"] > 0.3, (folder, capped["rejected_share"])
        assert capped["ttft_p50"] < free["ttft_p50"], (folder, capped["ttft_p50"], free["ttft_p50"])
        report = (tmp_path / "results" / folder / "report.md").read_text()
        assert "the queue is capped at 8 requests (max_num_queued_reqs)" in report, folder
        assert "Suggested max_num_queued_tokens for " in report, folder
