"""When the server was away (batchscope/loadgen/figures/away.py) and the failure rule that leaves a restart's
connection errors out (figures/summary.py), from records in any order."""

from __future__ import annotations

import itertools

import pytest

from batchscope.loadgen.figures.away import AWAY_MIN_S, AwayTracker, Gap, away_s
from batchscope.loadgen.figures.figures import RunFigures
from batchscope.loadgen.figures.summary import failure_reason, while_away
from batchscope.loadgen.figures.window import MeasurementWindow
from batchscope.loadgen.spec import load_spec
from batchscope.loadgen.stream.request import RequestRecord

ids = itertools.count()


def refused(at: float) -> RequestRecord:
    return RequestRecord(request_id=str(next(ids)), worker=0, scheduled_s=at, end_s=at, outcome="connection_error")


def answered(sent: float, end: float | None = None) -> RequestRecord:
    return RequestRecord(request_id=str(next(ids)), worker=0, scheduled_s=sent, sent_s=sent, end_s=end or sent + 0.5,
                         status=200, outcome="ok")


def tracked(records: list[RequestRecord]) -> AwayTracker:
    tracker = AwayTracker()
    for record in records:
        tracker.add(record, in_window=True)
    return tracker


def test_a_gap_runs_from_the_first_refusal_to_the_first_answered_send_after_it_in_any_order():
    records = [answered(9.0), refused(10.0), refused(11.0), refused(13.5), answered(14.2), answered(14.0, 20.0),
               answered(12.0 - 3.0)]
    for order in (records, records[::-1], records[2:] + records[:2]):
        tracker = tracked(order)
        assert tracker.gaps(until_s=30.0) == [Gap(10.0, 14.0, 3, 3)]
        assert not tracker.away_now()


def test_a_lone_failure_among_answers_is_no_gap_and_an_open_gap_lasts_to_the_end():
    tracker = tracked([answered(1.0), refused(2.0), answered(2.0 + AWAY_MIN_S / 2), refused(5.0), refused(7.0)])
    gaps = tracker.gaps(until_s=9.0)
    assert gaps == [Gap(5.0, None, 2, 2)] and tracker.away_now()
    assert away_s(gaps, 9.0) == pytest.approx(4.0)


def figures_with(ok: int, errors_in_gap: int, others: int) -> RunFigures:
    figures = RunFigures()
    window = MeasurementWindow(start_s=0.0, end_s=100.0)
    for index in range(ok):
        figures.add(answered(1.0 + index * 0.01), window)
    for index in range(errors_in_gap):
        figures.add(refused(50.0 + index * 0.1), window)
    figures.add(answered(60.0), window)  # the server is back
    for index in range(others):
        figures.add(refused(80.0 + index * 0.001), window)  # no gap: answered right after
    figures.add(answered(80.5), window)
    return figures


def test_the_failure_rule_leaves_out_a_restarts_connection_errors_but_not_others():
    spec = load_spec(None, ["input_tokens=8", "output_tokens=4", "load.mode=concurrency", "load.concurrency=1"])
    restart = figures_with(ok=10, errors_in_gap=40, others=0)
    away = while_away(restart.away.gaps(100.0))
    assert away == 40 and failure_reason(spec, restart, away) is None
    assert "40 of 52" in (failure_reason(spec, restart) or "")  # counted, were it not left out
    flaky = figures_with(ok=10, errors_in_gap=40, others=30)
    reason = failure_reason(spec, flaky, while_away(flaky.away.gaps(100.0)))
    assert reason is not None and reason.startswith("30 of 42") and "40 connection errors while the server" in reason
