"""The sender (batchscope/loadgen/run/sender.py) without a server: arrival schedules, ramp-up, back-off, reports on the
wire."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from batchscope.loadgen.figures.figures import RunFigures
from batchscope.loadgen.figures.window import MeasurementWindow
from batchscope.loadgen.run import sender as sender_module
from batchscope.loadgen.run.report import SenderReport
from batchscope.loadgen.run.sender import LoadRun, arrival_times
from batchscope.loadgen.spec import load_spec
from batchscope.loadgen.stream.request import RequestRecord
from batchscope.loadgen.stream.target import Target

TARGET = Target(url="http://127.0.0.1:9/v1/completions", headers={}, body={}, chat=False, stream=True,
                prompt_tokens=8, output_tokens=4, timeout_s=5.0)


def spec(*fields: str):
    return load_spec(None, ["input_tokens=8", "output_tokens=4", *fields])


def sender(*fields: str, workers: int = 1) -> LoadRun:
    return LoadRun(spec(*fields), TARGET, run_id="r", worker_index=0, workers=workers, on_record=lambda r: None)


def test_offline_shares_add_up_to_the_batch_and_start_at_once():
    batch = spec("load.mode=offline", "load.requests=10")
    shares = [list(arrival_times(batch, 5.0, index, 3)) for index in range(3)]
    assert [len(s) for s in shares] == [4, 3, 3] and {t for s in shares for t in s} == {5.0}


def test_poisson_arrivals_keep_the_rate_over_workers_and_differ_between_them():
    poisson = spec("load.mode=poisson", "load.rate=50")
    streams = [np.array(list(itertools.islice(arrival_times(poisson, 0.0, index, 2), 2000))) for index in range(2)]
    for times in streams:
        assert np.all(np.diff(times) > 0)
        assert np.mean(np.diff(times)) == pytest.approx(2 / 50, rel=0.1)  # λ/W each
    assert not np.allclose(streams[0][:10], streams[1][:10])


def test_ramp_up_spreads_this_process_users_evenly():
    ramped = sender("load.mode=concurrency", "load.concurrency=8", "load.ramp_up_s=4", workers=2)
    assert [ramped.start_delay() for _ in range(5)] == [0.0, 1.0, 2.0, 3.0, 0.0]
    assert sender("load.mode=concurrency", "load.concurrency=8").start_delay() == 0.0


def rejected_record() -> RequestRecord:
    return RequestRecord(request_id="x", worker=0, scheduled_s=0.0, outcome="http_error", status=401)


def test_rejections_back_off_doubling_up_to_the_cap_and_reset_on_anything_else(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(sender_module.time, "time", lambda: now[0])
    load = sender("load.mode=concurrency", "load.concurrency=1")
    waits = []
    for _ in range(8):
        load._note_refusal(rejected_record())
        waits.append(load.pause_after(rejected_record()))
        now[0] += waits[-1]
    assert waits == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0])
    load._note_refusal(RequestRecord(request_id="y", worker=0, scheduled_s=0.0, outcome="ok"))
    load._note_refusal(rejected_record())
    assert load.pause_after(rejected_record()) == pytest.approx(0.1)  # the streak starts over


def refused_connection() -> RequestRecord:
    return RequestRecord(request_id="c", worker=0, scheduled_s=0.0, outcome="connection_error")


def test_a_user_backs_off_a_server_away_doubling_with_jitter_to_the_cap_and_resumes_once_answered(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(sender_module.time, "time", lambda: now[0])
    monkeypatch.setattr(sender_module.random, "uniform", lambda low, high: high)  # the longest draw
    load = sender("load.mode=concurrency", "load.concurrency=1")
    waits = []
    for _ in range(6):
        waits.append(load.pause_after(refused_connection()))
        now[0] += waits[-1]
    assert waits == pytest.approx([1.0, 2.0, 4.0, 4.0, 4.0, 4.0])
    answered = RequestRecord(request_id="a", worker=0, scheduled_s=now[0], sent_s=now[0], status=200, outcome="ok")
    assert load.pause_after(answered) == 0.0
    assert load.pause_after(refused_connection()) == pytest.approx(1.0)  # the streak starts over
    monkeypatch.setattr(sender_module.random, "uniform", lambda low, high: low)
    assert [sender_module.away_wait(n) for n in (1, 2, 3, 4)] == pytest.approx([0.5, 1.0, 2.0, 2.0])


def test_an_open_loop_sends_no_arrival_into_a_server_away_but_one_probe_per_wait(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(sender_module.time, "time", lambda: now[0])
    monkeypatch.setattr(sender_module.random, "uniform", lambda low, high: high)
    load = sender("load.mode=poisson", "load.rate=10")
    old = RequestRecord(request_id="o", worker=0, scheduled_s=990.0, sent_s=990.0, status=200, outcome="ok")
    load.schedule_away.note(refused_connection())
    load.schedule_away.note(refused_connection())  # in flight when the first failed: the same round
    load.schedule_away.note(old)  # sent before the failures began: no sign of the server's return
    assert load.schedule_away.streak == 1
    assert load.not_sent_because(1000.5, full=False) == "server_away"
    assert load.not_sent_because(1001.0, full=False) is None  # the wait is over: a probe goes
    load._probe = load.new_record(1001.0)
    assert load.not_sent_because(1001.1, full=False) == "server_away"  # none beside the probe in flight
    load._probe.status, load._probe.sent_s = 200, 1001.0  # answered, still streaming
    assert load.not_sent_because(1001.2, full=False) is None and load.schedule_away.streak == 0
    assert load.not_sent_because(1001.2, full=True) == "in_flight_cap"


def throttled_record(status: int, retry_after_s: float | None) -> RequestRecord:
    return RequestRecord(request_id="t", worker=0, scheduled_s=0.0, outcome="http_error", status=status,
                         retry_after_s=retry_after_s)


def test_a_429_or_503_backs_off_as_its_retry_after_asks_capped_else_doubling(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(sender_module.time, "time", lambda: now[0])

    def waits_after(load: LoadRun, refusals: list[tuple[int, float | None]]) -> list[float]:
        waits = []
        for status, retry_after in refusals:
            load._note_refusal(throttled_record(status, retry_after))
            waits.append(load.pause_after(throttled_record(status, retry_after)))
            now[0] += waits[-1]
        return waits

    # as asked, capped at 30 s, at least 0.1 s
    asked = [waits_after(sender("load.mode=concurrency", "load.concurrency=1"), [(status, retry_after)])[0]
             for status, retry_after in ((429, 2.0), (503, 100.0), (429, 0.0))]
    assert asked == pytest.approx([2.0, sender_module.RETRY_AFTER_CAP_S, sender_module.BACKOFF_BASE_S])
    load = sender("load.mode=concurrency", "load.concurrency=1")
    assert waits_after(load, [(503, None), (429, None), (503, None)]) == pytest.approx([0.1, 0.2, 0.4])
    load._note_refusal(throttled_record(408, 5.0))  # a request timeout is no refusal: the streak ends
    assert waits_after(load, [(503, None)]) == pytest.approx([0.1])


def test_a_run_refused_from_its_start_with_one_status_is_told_whatever_the_refusal():
    window = MeasurementWindow(start_s=0.0, end_s=100.0)
    for status in (401, 429, 503):
        figures = RunFigures()
        for _ in range(3):
            figures.add(throttled_record(status, None), window)
        assert figures.rejected_throughout() == status
    figures.add(RequestRecord(request_id="o", worker=0, scheduled_s=0.0, outcome="http_error", status=500), window)
    assert figures.rejected_throughout() is None  # a 500 is neither


def test_a_report_is_a_delta_of_records_and_cumulative_counts_and_survives_the_wire():
    load = sender("load.mode=poisson", "load.rate=5")
    load._outbox.append(RequestRecord(request_id="a", worker=0, scheduled_s=1.0, itl_s=[0.1, 0.2], outcome="ok"))
    load.started, load.refused, load._refused_s = 3, 1, [2.5]
    load.not_sent["server_away"] = 1
    first = load.report()
    assert [r.request_id for r in first.records] == ["a"] and first.refused_s == [2.5] and not first.final
    again = load.report(final=True)
    assert again.records == [] and again.refused_s == [] and (again.started, again.refused) == (3, 1)
    assert again.final
    back = SenderReport.from_wire(first.to_wire())
    assert back == first and back.records[0].itl_s == [0.1, 0.2] and back.not_sent["server_away"] == 1


def test_a_request_reaching_the_sender_after_the_stop_is_neither_started_nor_delivered():
    delivered: list[RequestRecord] = []
    load = LoadRun(spec("load.mode=poisson", "load.rate=5"), TARGET, run_id="r", worker_index=0, workers=1,
                   on_record=delivered.append)
    load.stop_now()
    record = load.send(load.connection_pool(), load.new_record(1.0))
    assert record.sent_s is None and load.started == 0 and delivered == [] and load.report(final=True).records == []
