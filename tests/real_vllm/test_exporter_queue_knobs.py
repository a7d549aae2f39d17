"""The exporter following a plan from the tier's shared server to the tier's queue-knob server (every queue knob:
conftest's queue_knobs_vllm): vLLM 0.32 takes the flags, and the exporter counts the new server as one change whose
annotation is their diff."""

from __future__ import annotations

import os
from datetime import UTC, datetime

from batchscope.runs.live_run import LiveRun
from batchscope.vllm.catalogue import ADMISSION_REJECTIONS
from tests.conftest import free_port, samples, wait_until
from tests.real_vllm.support import tier
from tests.stubs import HttpStub, json_reply

DIFF = ["max_num_active_seqs: vLLM default → 4", "max_num_queued_reqs: vLLM default → 8",
        "max_num_queued_tokens: vLLM default → 4096", "long_prefill_token_threshold: vLLM default → 256",
        "long_prefill_token_threshold_adaptive: vLLM default → true"]


def follow(live_file, server, setting: str) -> None:
    """Point the exporter at ``server`` as the tuner does at a run's start: the live file replaced whole."""
    run = LiveRun(vllm_url=server.url, command_line=tier().serve_argv(server.port, *server.flags), plan="queue",
                  setting=setting, repeat=0, started_at=datetime.now(UTC).isoformat())
    written = live_file.with_suffix(".tmp")
    written.write_text(run.model_dump_json())
    os.replace(written, live_file)


def config_info(scraped: dict) -> dict[str, str]:
    [labels] = [dict(labels) for name, labels in scraped if name == "batchscope_vllm_config_info"]
    return labels


def by_reason(scraped: dict) -> dict[str, float]:
    """The admission counter's samples by reason."""
    return {dict(labels)["reason"]: value for (name, labels), value in scraped.items()
            if name == ADMISSION_REJECTIONS.exposed_name}


def other_flags(info: dict[str, str]) -> set[str]:
    return set(info["other_flags"].split(","))


def test_a_server_started_with_the_queue_knobs_is_one_change_with_their_diff(vllm, queue_knobs_vllm, exporters,
                                                                            tmp_path):
    """The baseline run is the shared server (no queue flag: vLLM's defaults), the next run a server with every
    queue flag, as a plan's variation would start it."""
    queued = queue_knobs_vllm
    grafana = HttpStub(lambda _method, _path: json_reply({"message": "Annotation added", "id": 1})).start()
    live_file = tmp_path / "live.json"
    exporter = exporters("--vllm-url", f"http://127.0.0.1:{free_port()}", "--follow", str(live_file),
                         "--grafana-url", grafana.url, "--grafana-token", "glsa_test")
    try:
        follow(live_file, vllm, "baseline")
        before = exporter.scrape()
        assert config_info(before)["max_num_queued_reqs"] == ""
        assert before[("batchscope_config_changes_total", ())] == 0
        follow(live_file, queued, "queue-knobs")
        after = exporter.scrape()
        info = config_info(after)
        assert {key: info[key] for key in ("max_num_active_seqs", "max_num_queued_reqs", "max_num_queued_tokens",
                                           "long_prefill_token_threshold", "long_prefill_token_threshold_adaptive")} \
            == {"max_num_active_seqs": "4", "max_num_queued_reqs": "8", "max_num_queued_tokens": "4096",
                "long_prefill_token_threshold": "256", "long_prefill_token_threshold_adaptive": "true"}
        # the switch is no other flag: only the new server's port and its lean start's executor differ there
        ports = (f"port={vllm.port}", f"port={queued.port}")
        assert other_flags(info) - other_flags(config_info(before)) == {ports[1], "distributed_executor_backend=uni"}
        assert other_flags(config_info(before)) - other_flags(info) == {ports[0]}
        assert after[("batchscope_config_changes_total", ())] == 1
        # the new server's admission counter, by reason, as vLLM serves it: it took both limits (the load test
        # of tests/real_vllm/test_admission_loadgen.py may have been refused on it already)
        assert set(by_reason(after)) == {"max_num_queued_reqs", "max_num_queued_tokens"}
        assert by_reason(after) == by_reason(samples(queued.metrics()))
        assert exporter.scrape()[("batchscope_config_changes_total", ())] == 1  # counted once

        def posted() -> list[str]:
            return [request.json()["text"] for request in grafana.requests if request.method == "POST"]

        [text] = wait_until(posted, timeout_s=30, message="the change's annotation")
        lines = text.split("; ")
        assert lines[:-1] == DIFF and lines[-1].startswith("other_flags: ") and ports[1] in lines[-1]
    finally:
        grafana.stop()
