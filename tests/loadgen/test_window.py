"""The one window rule (batchscope/loadgen/figures/window.py) as the summary, the live metrics and the LLM tab apply it;
no processes."""

from __future__ import annotations

import math

import pytest

from batchscope.loadgen.adapter.llm_tab import Window
from batchscope.loadgen.figures.figures import RunFigures, counted
from batchscope.loadgen.figures.window import final_window, live_window
from batchscope.loadgen.run.control import RunControl
from batchscope.loadgen.spec import load_spec
from batchscope.loadgen.stream.request import RequestRecord, timed_elsewhere

CLOSED = ["input_tokens=8", "output_tokens=4", "load.mode=concurrency", "load.concurrency=2", "warmup_s=10",
          "duration_s=100"]
OFFLINE = ["input_tokens=8", "output_tokens=4", "load.mode=offline", "load.requests=3", "warmup_s=10"]


def ended(i: int, end: float, outcome: str = "ok", ttft: float = 0.01) -> RequestRecord:
    return RequestRecord(request_id=str(i), worker=0, scheduled_s=end - 1, sent_s=end - 1, first_token_s=end - 0.9,
                         last_token_s=end, end_s=end, ttft_s=ttft, tpot_s=0.3, e2e_s=1.0, itl_s=[0.3, 0.3, 0.3],
                         prompt_tokens=8, output_tokens=4, outcome=outcome)


def test_the_window_holds_what_ended_in_it_bounds_included():
    spec = load_spec(None, CLOSED)
    window = live_window(spec, 1000.0, None)
    assert (window.start_s, window.end_s) == (1010.0, 1110.0)
    inside = [window.holds(ended(0, end)) for end in (1009.99, 1010.0, 1050.0, 1110.0, 1110.01)]
    assert inside == [False, True, True, True, False]
    assert not window.holds(RequestRecord(request_id="x", worker=0, scheduled_s=1050.0))  # never ended
    assert live_window(spec, 1000.0, 1040.0).end_s == 1040.0  # an early stop cuts it


def test_offline_window_is_open_until_the_stop_and_closes_at_the_last_end():
    spec = load_spec(None, OFFLINE)
    assert live_window(spec, 1000.0, None).end_s == math.inf
    assert live_window(spec, 1000.0, 1090.0).end_s == 1090.0
    assert final_window(spec, 1000.0, 1090.0, [1020.0, 1075.5]).end_s == 1075.5
    assert final_window(spec, 1000.0, 1090.0, []).duration_s == pytest.approx(1e-9)


def test_summary_live_metrics_and_llm_tab_count_the_same_requests():
    spec = load_spec(None, CLOSED)
    ctl = RunControl(spec=spec, run_id="t", host="h", out_dir=None, request_stop=lambda: None,
                     sender_count=lambda: 1, start_s=1000.0)
    records = [ended(0, 1005.0, ttft=5.0),  # warm-up: in the counts, not in the latencies
               ended(1, 1010.0, ttft=0.02), ended(2, 1060.0, ttft=0.03), ended(3, 1061.0, outcome="timeout"),
               ended(4, 1109.0, ttft=0.04)]
    for record in records:
        ctl.accept(record)
    ctl.stop_s = 1120.0
    ctl.accept(ended(5, 1115.0, ttft=9.0))  # ended after the window: counted, not measured
    summary = ctl.summary()
    assert summary.completed == 3 and summary.ttft.count == 3 and summary.ttft.p50 == pytest.approx(0.03)
    assert summary.failed["timeout"] == 1 and summary.outcomes["ok"] == 5
    ttft = ctl.stats.histograms["ttft"]
    assert ttft.count == 3 and ttft.sum == pytest.approx(0.09)  # the live histogram: same population
    assert ctl.stats.histograms["itl"].count == summary.itl.count == 9
    tab = Window()
    tab.update(ctl)
    assert tab.completed == 3 and tab.latency["ttft"] == summary.ttft


def test_summary_counts_tokens_that_arrived_in_the_window():
    spec = load_spec(None, CLOSED)
    ctl = RunControl(spec=spec, run_id="t", host="h", out_dir=None, request_stop=lambda: None,
                     sender_count=lambda: 1, start_s=1000.0, stop_s=1110.0)
    ctl.accept(ended(0, 1010.0))  # tokens at 1009.1, 1009.4, 1009.7, 1010.0: only the last arrived in the window
    ctl.accept(ended(1, 1050.0))  # all four in the window
    summary = ctl.summary()
    assert summary.output_tokens_per_s == pytest.approx(5 / 100)
    assert summary.total_tokens_per_s == pytest.approx((5 + 8) / 100)  # one prompt first answered in the window


def test_a_request_timed_elsewhere_is_counted_and_timed_as_a_measured_one():
    # a what-if run's request on the virtual clock: sent at 1015, first token at 1015.5, 4 tokens, last at 1016.1
    record = timed_elsewhere("v0", 1015.0, 1015.5, 1016.1, [0.2, 0.2, 0.2], prompt_tokens=8, output_tokens=4)
    assert (record.outcome, record.end_s, record.ttft_s, record.e2e_s) == ("ok", 1016.1, 0.5, 1016.1 - 1015.0)
    assert record.tpot_s == pytest.approx(0.2) and record.dispatch_lag_s == 0.0
    one_token = timed_elsewhere("v1", 1015.0, 1015.5, 1015.5, [], prompt_tokens=8, output_tokens=1)
    assert one_token.tpot_s is None
    window = live_window(load_spec(None, CLOSED), 1000.0, None)
    figures = RunFigures()
    for r in (record, one_token, timed_elsewhere("v2", 1005.0, 1005.5, 1006.1, [0.2] * 3, 8, 4)):  # warm-up's
        figures.add(r, window)
    assert figures.completed == 2 and list(figures.tpot) == [record.tpot_s] and figures.output_tokens == 5.0
    assert [counted(r, window) for r in (record, one_token)] == [True, True]
