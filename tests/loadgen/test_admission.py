"""vLLM's admission 503 as the load generator's outcome rejected_busy: told from any other 503 by its body, counted
by reason in the window, apart from the failures and their rule, and the sender's pause; no processes but a
loopback server."""

from __future__ import annotations

import io
import json
import logging
from dataclasses import replace

import pytest
from rich.console import Console

from batchscope.loadgen.adapter.llm_tab import RejectionRate, rejection_rows
from batchscope.loadgen.figures.summary import print_summary
from batchscope.loadgen.run import sender as sender_module
from batchscope.loadgen.run.control import RunControl
from batchscope.loadgen.run.faults import FaultLog
from batchscope.loadgen.run.sender import LoadRun
from batchscope.loadgen.spec import load_spec
from batchscope.loadgen.stream.request import OUTCOMES, RECORD_SCHEMA_VERSION, RequestRecord, TokenStream
from batchscope.loadgen.stream.target import Target
from batchscope.testkit.hostile import HostileServer
from batchscope.vllm import admission
from tests.loadgen.support import send, target_for

TARGET = Target(url="http://127.0.0.1:9/v1/completions", headers={}, body={}, chat=False, stream=True,
                prompt_tokens=8, output_tokens=4, timeout_s=5.0)
CLOSED = ["input_tokens=8", "output_tokens=4", "load.mode=concurrency", "load.concurrency=2", "warmup_s=10",
          "duration_s=100", "max_failed_fraction=0.1"]


def ok(i: int, end: float) -> RequestRecord:
    return RequestRecord(request_id=str(i), worker=0, scheduled_s=end - 1, sent_s=end - 1, first_token_s=end - 0.9,
                         last_token_s=end, end_s=end, ttft_s=0.1, tpot_s=0.01, e2e_s=1.0, itl_s=[0.3, 0.3, 0.3],
                         prompt_tokens=8, output_tokens=4, outcome="ok")


def rejected(i: int, end: float, reason: str = "max_num_queued_reqs") -> RequestRecord:
    return RequestRecord(request_id=f"r{i}", worker=0, scheduled_s=end - 0.01, sent_s=end - 0.01, end_s=end,
                         status=503, outcome="rejected_busy", reject_reason=reason,
                         error=json.dumps(admission.error_body(reason)))


def control() -> RunControl:
    return RunControl(spec=load_spec(None, CLOSED), run_id="t", host="h", out_dir=None, request_stop=lambda: None,
                      sender_count=lambda: 1, start_s=1000.0)


def test_rejected_busy_is_an_outcome_of_its_own_in_a_new_record_schema():
    assert "rejected_busy" in OUTCOMES and RECORD_SCHEMA_VERSION >= 4
    assert RequestRecord(request_id="x", worker=0, scheduled_s=0.0).to_dict()["reject_reason"] is None


def test_rejections_are_counted_by_reason_in_the_window_and_are_neither_failures_nor_the_failure_rule():
    ctl = control()
    records = [rejected(0, 1005.0),  # warm-up: an outcome, not in the window's figures
               *(ok(i, 1020.0 + i) for i in range(4)),
               *(rejected(i, 1030.0 + i) for i in range(1, 4)),
               rejected(9, 1040.0, "max_num_queued_tokens")]
    for record in records:
        ctl.accept(record)
    ctl.stop_s = 1110.0
    summary = ctl.summary()
    assert summary.outcomes["rejected_busy"] == 5 and summary.balanced is False  # nothing reported as started
    assert summary.admission_rejections == {"max_num_queued_reqs": 3, "max_num_queued_tokens": 1}
    assert "rejected_busy" not in summary.failed and sum(summary.failed.values()) == 0
    assert summary.rejected_share == pytest.approx(4 / 8)
    assert summary.failure is None  # half rejected, max_failed_fraction 10%: the policy at work is no failure
    assert ctl.stats.good == 4  # a rejection is never good
    out = io.StringIO()
    print_summary(summary, Console(file=out, width=200))
    assert "4 (50.0% of those ended): max_num_queued_reqs 3, max_num_queued_tokens 1" in out.getvalue()


def test_a_run_that_completed_nothing_fails_even_when_all_it_got_were_rejections():
    ctl = control()
    for i in range(3):
        ctl.accept(rejected(i, 1020.0 + i))
    ctl.stop_s = 1110.0
    summary = ctl.summary()
    assert summary.rejected_share == 1.0
    assert summary.failure == "no request completed in the measurement window (rejected_busy 3)"
    empty = control()
    empty.stop_s = 1110.0
    assert empty.summary().rejected_share is None


def test_a_rejection_backs_off_no_sender_and_pauses_its_user_a_bounded_time(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(sender_module.time, "time", lambda: now[0])
    load = LoadRun(load_spec(None, CLOSED), TARGET, run_id="r", worker_index=0, workers=1, on_record=lambda r: None)
    for _ in range(5):
        load._note_refusal(rejected(0, 1000.0))
    assert load.backoff_until == 0.0  # the open loop's schedule and the other users go on
    asked = [load.pause_after(replace(rejected(0, 1000.0), retry_after_s=wait)) for wait in (None, 0.01, 0.5, 60.0)]
    assert asked == [sender_module.ADMISSION_PAUSE_S, sender_module.ADMISSION_PAUSE_S, 0.5,
                     sender_module.ADMISSION_PAUSE_CAP_S]
    assert load.pause_after(ok(1, 1000.0)) == 0.0
    proxy = RequestRecord(request_id="p", worker=0, scheduled_s=0.0, outcome="http_error", status=503)
    load._note_refusal(proxy)  # any other 503 backs the sender off, as before; a rejected user waits that out too
    assert load.backoff_until == pytest.approx(1000.0 + sender_module.BACKOFF_BASE_S)
    assert load.pause_after(rejected(0, 1000.0)) == pytest.approx(sender_module.ADMISSION_PAUSE_S)
    load.backoff_until = 1003.0
    assert load.pause_after(rejected(0, 1000.0)) == pytest.approx(3.0)


def test_measure_tells_vllms_admission_503_from_any_other_by_its_body():
    for mode, outcome, reason in (("admission-503", "rejected_busy", "max_num_queued_reqs"),
                                  ("admission-event", "rejected_busy", "max_num_queued_reqs"),
                                  ("storm-503", "http_error", None)):
        with HostileServer(mode) as server:
            record = send(target_for(server.url))
        assert (record.outcome, record.status, record.reject_reason) == (outcome, 503, reason)


def test_the_prefill_backlog_is_the_prompts_sent_and_not_answered_yet():
    load = LoadRun(load_spec(None, CLOSED), TARGET, run_id="r", worker_index=0, workers=1, on_record=lambda r: None)
    waiting = RequestRecord(request_id="w", worker=0, scheduled_s=0.0, sent_s=1.0)
    answering = RequestRecord(request_id="a", worker=0, scheduled_s=0.0, sent_s=1.0)
    unsent = RequestRecord(request_id="u", worker=0, scheduled_s=0.0)
    for record in (waiting, answering, unsent):
        load._active[record.request_id] = (record, None)
    stream = TokenStream(chat=False, record=answering)
    stream.feed(b'data: {"choices":[{"text":"x"}]}\n\n', 2.0)  # its first token: out of the backlog at once
    assert answering.first_token_s == 2.0
    assert load.prefill_backlog_tokens == TARGET.prompt_tokens == load.report().prefill_backlog_tokens


def test_the_llm_tab_shows_the_windows_rejections_their_rate_and_share():
    ctl = control()
    for record in (ok(0, 1020.0), rejected(1, 1021.0), rejected(2, 1022.0, "max_num_queued_tokens")):
        ctl.accept(record)
    assert {r["figure"]: r["value"] for r in rejection_rows(ctl, measured=4.0)} == {
        "rejected by admission (in window)": "2 (max_num_queued_reqs 1, max_num_queued_tokens 1)",
        "rejection rate (req/s)": "0.500", "rejected share (of ended in window)": "66.7%"}


def test_the_log_says_a_rejection_is_a_refusal_by_the_limit_and_stays_a_few_lines_under_thousands(caplog):
    now = [0.0]
    faults = FaultLog(every_s=10.0, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="batchscope.loadgen")
    for i in range(3000):  # 100 a second for 30 s, far above the cap
        now[0] = i / 100
        faults.note(rejected(i, 1000.0 + now[0]))
    faults.note(rejected(0, 1030.0, "max_num_queued_tokens"))
    faults.note(RequestRecord(request_id="e", worker=0, scheduled_s=0.0, outcome="http_error", status=500,
                              error="boom"))
    faults.flush()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    refused = "requests refused by vLLM's admission limit (max_num_queued_reqs), 503: "
    assert lines == [  # 3,002 requests, six lines: the first of each kind, then a count every 10 s and at the end
        (logging.INFO, "request refused by vLLM's admission limit (max_num_queued_reqs), 503: "
         + json.dumps(admission.error_body("max_num_queued_reqs")) + " (more of this kind are counted every 10 s)"),
        (logging.INFO, refused + "1000 more in the last 10 s"), (logging.INFO, refused + "1000 more in the last 10 s"),
        (logging.INFO, "request refused by vLLM's admission limit (max_num_queued_tokens), 503: "
         + json.dumps(admission.error_body("max_num_queued_tokens")) + " (more of this kind are counted every 10 s)"),
        (logging.WARNING, "request failed, http_error 500: boom (more of this kind are counted every 10 s)"),
        (logging.INFO, refused + "999 more in the last 10 s")]


def test_the_llm_tabs_rejection_chart_plots_each_reasons_rate_between_its_points():
    ctl, rate = control(), RejectionRate()
    for record in (rejected(0, 1001.0), rejected(1, 1001.5), ok(2, 1001.5)):
        ctl.accept(record)
    assert rate.per_s(ctl, 1002.0) == {"rejected_max_num_queued_reqs": 1.0, "rejected_max_num_queued_tokens": 0.0}
    for i in range(2, 8):
        ctl.accept(rejected(i, 1003.0, "max_num_queued_tokens"))
    assert rate.per_s(ctl, 1004.0) == {"rejected_max_num_queued_reqs": 0.0, "rejected_max_num_queued_tokens": 3.0}
    assert rate.per_s(ctl, 1004.0) == {"rejected_max_num_queued_reqs": None, "rejected_max_num_queued_tokens": None}
