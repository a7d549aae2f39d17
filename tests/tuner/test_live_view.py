"""The live view during a plan: `batchscope tune --live-file F` and `batchscope exporter --follow F`. Every run
starts its server and its load's client metrics on ports of its own; the exporter, whose flags point nowhere,
shows each run's vLLM and client series while the run is measured."""

from __future__ import annotations

import json

import pytest

from tests.conftest import free_port, wait_until
from tests.tuner.support import kill_group, start_tune, tiny_plan, tune, write_plan

TTFT_COUNT = "batchscope_client_time_to_first_token_seconds_count"


@pytest.mark.e2e
@pytest.mark.slow
def test_an_exporter_following_a_plan_shows_each_runs_client_and_vllm_series(tmp_path, exporters):
    live_file = tmp_path / "live.json"
    exporter = exporters("--vllm-url", f"http://127.0.0.1:{free_port()}", "--follow", str(live_file))
    plan = start_tune(tmp_path, write_plan(tmp_path, tiny_plan(window_s=4)), "--live-file", str(live_file))
    seen: dict[str, dict] = {}  # run id -> what the exporter showed of it

    def tune_alive() -> None:
        if plan.poll() is not None:
            raise AssertionError(f"the plan ended (status {plan.returncode}) before both runs were seen: {seen}")

    def both_runs_seen() -> bool:
        exported = exporter.scrape()
        client = {dict(labels)["run_id"]: value for (name, labels), value in exported.items()
                  if name == TTFT_COUNT and value > 0}
        vllm_up = exported.get(("batchscope_up", (("target", "vllm"),))) == 1
        running = any(name == "vllm:num_requests_running" for name, _ in exported)
        if client and vllm_up and running:
            info = next(dict(labels) for name, labels in exported if name == "batchscope_vllm_config_info")
            seen.update({run_id: {"ttft_count": count, "max_num_seqs": info["max_num_seqs"]}
                         for run_id, count in client.items()})
        return {"tiny-baseline-r0", "tiny-mns-2-r0"} <= set(seen)

    try:
        wait_until(both_runs_seen, timeout_s=120, interval_s=0.2, message="both runs in the exporter",
                   alive=tune_alive)
        assert plan.wait(timeout=120) == 0
    finally:
        if plan.poll() is None:
            kill_group(plan)
    assert seen["tiny-mns-2-r0"]["max_num_seqs"] == "2"  # the run's command line, from the live file
    live = json.loads(live_file.read_text())
    assert (live["plan"], live["setting"], live["repeat"]) == ("tiny", "mns-2", 0)
    assert live["loadgen_url"].startswith("http://127.0.0.1:") and "--max-num-seqs" in live["command_line"]


def test_a_live_file_that_is_a_folder_is_refused_before_any_run(tmp_path):
    result = tune(tmp_path, write_plan(tmp_path, tiny_plan()), "--live-file", str(tmp_path))
    assert result.returncode == 2 and result.stderr.strip().endswith("is a folder, not a file")
    assert "Traceback" not in result.stderr and not (tmp_path / "results").exists()
