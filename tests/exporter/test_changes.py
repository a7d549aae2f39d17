"""exporter.changes in the fast tier: the change tracker on an injected clock, and the Grafana annotator against a
loopback stub of Grafana's API (retries with backoff, dropped after its attempts, never blocking the caller)."""

from __future__ import annotations

import base64
import logging

from batchscope.exporter.changes import ChangeTracker
from batchscope.exporter.config import ServingConfig, parse_command
from batchscope.runs.annotations import GrafanaAnnotator
from tests.conftest import wait_until
from tests.exporter.clock import Clock
from tests.stubs import HttpStub, Reply, json_reply

BASE = ServingConfig(model="m", max_num_seqs="64", max_num_batched_tokens="2048")
COMMAND = parse_command("vllm serve m --max-num-seqs 64 --max-num-batched-tokens 2048")
# what vLLM exposes without a command line: cache_config_info's two, /v1/models' length
EXPOSED = ServingConfig(model="m", block_size="16", gpu_memory_utilization="0.9", max_model_len="4096")


class Posted:
    """Records what the tracker hands to its annotator."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, float, list[str]]] = []

    def post(self, text: str, when_s: float, tags: list[str]) -> None:
        self.posts.append((text, when_s, tags))


def test_the_first_configuration_and_a_repeat_are_no_change():
    tracker = ChangeTracker(clock=Clock(100.0))
    tracker.observe(BASE, started_at=50.0)
    tracker.observe(BASE.model_copy(), started_at=50.0)
    assert (tracker.changes, tracker.last_change_s) == (0, 0.0)


def test_a_new_value_is_one_change_at_the_clocks_time_with_a_readable_annotation():
    clock, posted = Clock(100.0), Posted()
    tracker = ChangeTracker(posted, clock=clock)  # anything with post() will do
    tracker.observe(COMMAND, started_at=50.0)
    clock.now = 160.0
    tracker.observe(COMMAND.model_copy(update={"max_num_batched_tokens": "8192"}), started_at=50.0)
    assert (tracker.changes, tracker.last_change_s) == (1, 160.0)
    assert posted.posts == [("max_num_batched_tokens: 2048 → 8192", 160.0, ["batchscope", "config-change"])]


def test_a_value_one_side_does_not_know_is_not_a_change():
    tracker = ChangeTracker(clock=Clock(1.0))
    tracker.observe(BASE, started_at=None)
    tracker.observe(BASE.model_copy(update={"max_num_seqs": ""}), started_at=None)  # a source that timed out
    assert tracker.changes == 0


def test_a_restart_is_a_change_beyond_the_tolerance_only():
    posted = Posted()
    tracker = ChangeTracker(posted, clock=Clock(1.0))
    tracker.observe(COMMAND, started_at=50.0)
    tracker.observe(COMMAND, started_at=50.9)  # the same start read through another clock: jitter, not a restart
    tracker.observe(COMMAND, started_at=None)  # unknown start (vLLM without process metrics): nothing to compare
    tracker.observe(COMMAND, started_at=80.0)
    assert tracker.changes == 0
    tracker.observe(COMMAND, started_at=120.0)
    assert (tracker.changes, tracker.not_visible) == (1, 0)
    # both command lines read: every knob is known, so "unchanged" is what the exporter knows
    assert posted.posts[0][0] == "vLLM restarted, configuration unchanged"


def test_a_restart_without_a_command_line_is_not_visible_never_unchanged():
    """The issue's case: vLLM's /metrics shows no scheduler knob, so `--max-num-seqs 128` → 32 looks the same."""
    posted = Posted()
    tracker = ChangeTracker(posted, clock=Clock(1.0))
    tracker.observe(ServingConfig(model="m"), started_at=50.0)
    tracker.observe(ServingConfig(model="m"), started_at=120.0, why_not_visible="vLLM's host gpu-1 is not loopback")
    assert (tracker.changes, tracker.not_visible) == (1, 1)
    assert posted.posts[0][0] == ("vLLM restarted, configuration not visible (no command line: vLLM's host gpu-1 is "
                                  "not loopback; pass --vllm-command or --vllm-command-file)")


def test_where_some_knobs_are_exposed_the_diff_lists_them_and_says_the_rest_is_not_visible():
    posted = Posted()
    tracker = ChangeTracker(posted, clock=Clock(1.0))
    tracker.observe(EXPOSED, started_at=50.0)
    tracker.observe(EXPOSED, started_at=120.0)
    tracker.observe(EXPOSED.model_copy(update={"max_model_len": "8192"}), started_at=180.0)
    assert [text for text, _, _ in posted.posts] == [
        "vLLM restarted, configuration not visible (no command line: none was given or found; pass --vllm-command or "
        "--vllm-command-file); as before: gpu_memory_utilization, max_model_len, block_size",
        "max_model_len: 4096 → 8192; the other knobs not visible (no command line: none was given or found; pass "
        "--vllm-command or --vllm-command-file)"]
    assert tracker.not_visible == 2


def test_a_command_line_on_one_side_only_leaves_the_other_knobs_not_visible():
    """A command file that could not be read at the second scrape: its knobs are unknown there, not unchanged."""
    posted = Posted()
    tracker = ChangeTracker(posted, clock=Clock(1.0))
    tracker.observe(COMMAND.merged_over(EXPOSED), started_at=50.0)
    tracker.observe(EXPOSED, started_at=120.0)
    assert posted.posts[0][0].startswith("vLLM restarted, configuration not visible (no command line")
    assert posted.posts[0][0].endswith("; as before: gpu_memory_utilization, max_model_len, block_size")


def test_the_annotator_posts_grafanas_annotation_body_with_the_token():
    grafana = HttpStub(lambda _method, _path: json_reply({"message": "Annotation added", "id": 1})).start()
    try:
        GrafanaAnnotator(grafana.url + "/", token="glsa_token").post("max_num_seqs: 64 → 32", 1_700_000_000.5,
                                                                     ["batchscope", "config-change"])
        request = wait_until(lambda: grafana.requests[0] if grafana.requests else None, timeout_s=5,
                             message="the annotation POST")
    finally:
        grafana.stop()
    assert (request.method, request.path) == ("POST", "/api/annotations")
    assert request.headers["Authorization"] == "Bearer glsa_token"
    assert request.json() == {"time": 1_700_000_000_500, "tags": ["batchscope", "config-change"],
                              "text": "max_num_seqs: 64 → 32"}


def test_without_a_token_the_annotator_uses_basic_auth():
    grafana = HttpStub(lambda _method, _path: json_reply({"id": 1})).start()
    try:
        GrafanaAnnotator(grafana.url, basic_auth=("admin", "pw")).post("x", 1.0, [])
        request = wait_until(lambda: grafana.requests[0] if grafana.requests else None, timeout_s=5,
                             message="the annotation POST")
    finally:
        grafana.stop()
    assert request.headers["Authorization"] == "Basic " + base64.b64encode(b"admin:pw").decode()


def test_a_failing_grafana_is_retried_then_the_annotation_is_dropped_and_logged(caplog):
    caplog.set_level(logging.WARNING, logger="batchscope.exporter")
    replies = iter([Reply(status=503, body=b"starting", content_type="text/plain")] * 2)
    grafana = HttpStub(lambda _method, _path: next(replies, json_reply({"id": 1}))).start()
    refused = HttpStub(lambda _method, _path: Reply(status=500, body=b"no", content_type="text/plain")).start()
    try:
        GrafanaAnnotator(grafana.url, first_backoff_s=0.001).post("first", 1.0, [])
        wait_until(lambda: len(grafana.requests) == 3, timeout_s=5, message="two retries after two 503s")
        GrafanaAnnotator(refused.url, max_attempts=3, first_backoff_s=0.001).post("dropped", 2.0, [])
        wait_until(lambda: any("dropped after 3 attempts" in r.getMessage() for r in caplog.records), timeout_s=5,
                   message="the drop to be logged")
    finally:
        grafana.stop()
        refused.stop()
    assert len(refused.requests) == 3
    warnings = [r.getMessage() for r in caplog.records if "attempt" in r.getMessage()]
    assert "grafana annotation attempt 1/8 failed: HTTP 503: starting" in warnings
