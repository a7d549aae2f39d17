"""A run under vLLM's admission limits: its rejections (the client's by reason and share, the server's counter
increase), its prefill throughput as the server and the client see it, and what the comparison, the report and
MLPerf's server scenario make of them."""

from __future__ import annotations

import pytest

from batchscope.tuner.compare import Comparison, compare
from batchscope.tuner.mlperf.rules import PointFlow, ServerRules, judge
from batchscope.tuner.plan import TUNABLE, Plan, ServingParams, Slos
from batchscope.tuner.report import console_lines
from batchscope.tuner.report.files import render_markdown
from batchscope.tuner.report.text import baseline_line, queued_tokens_lines, settings_head, settings_rows
from batchscope.tuner.results import RunResult
from batchscope.tuner.results.signals import MetricsPoint, server_signals
from batchscope.tuner.whatif import run_what_if
from batchscope.vllm.catalogue import ADMISSION_REJECTIONS, PROMPT_TOKENS
from tests.tuner.support import tiny_plan
from tests.tuner.test_compare import make_run


def test_the_server_signals_carry_the_admission_counters_increase_and_none_when_not_exposed():
    def point(t: float, rejected: float | None) -> MetricsPoint:
        values = {PROMPT_TOKENS.exposed_name: 1000.0 * t}
        if rejected is not None:
            values[ADMISSION_REJECTIONS.exposed_name] = rejected
        return MetricsPoint(t=t, values=values)

    signals = server_signals([point(0, 3), point(5, 10), point(10, 21)], 0.0, 10.0, None)
    assert (signals.admission_rejections, signals.prompt_tokens) == (18.0, 10_000.0)
    assert server_signals([point(0, None), point(10, None)], 0.0, 10.0, None).admission_rejections is None


def _capped(run: RunResult, rejected: int, prefill_tokens_per_s: float | None = None) -> RunResult:
    """``run`` with ``rejected`` of its arrivals refused at admission (max_num_queued_reqs)."""
    client = run.client
    share = rejected / (client.completed + client.errors + rejected)
    client = client.model_copy(update={"rejected": {"max_num_queued_reqs": rejected}, "rejected_share": share,
                                       "prefill_tokens_per_s": prefill_tokens_per_s})
    server = run.server.model_copy(update={"admission_rejections": float(rejected)})
    return run.model_copy(update={"client": client, "server": server})


def _queue_plan(**slos) -> Comparison:
    """An overloaded baseline (requests wait seconds in vLLM's queue) against a queue capped at 64: its TTFT is
    won by refusing 36% of the arrivals."""
    baseline = make_run(ttft=5.0, completed=320, server={"queue_time_mean_s": 4.0, "max_waiting": 140,
                                                         "max_running": 128})
    capped = _capped(make_run("mnqr-64", ttft=0.3, completed=320, params={"max_num_queued_reqs": 64},
                              server={"queue_time_mean_s": 0.05, "max_waiting": 3, "max_running": 64}), 180)
    return compare([baseline, capped], Slos(**slos), resamples=500)


def test_a_latency_won_by_rejecting_says_so_in_the_explanation_and_the_recommendation():
    c = _queue_plan()
    v = c.variation("mnqr-64")
    assert [m.metric for m in v.metrics][10:14] == ["goodput_rps", "rejected", "rejected_share",
                                                    "completion_throughput_rps"]  # beside goodput
    assert (v.metric("rejected").value, round(v.metric("rejected_share").value, 2)) == (180, 0.36)
    assert v.metric("rejected").evidence == "indicative"
    assert v.explanation.startswith("TTFT p")
    assert ": the queue is capped at 64 requests (max_num_queued_reqs), below max_num_seqs 128, so it caps the " \
           "running batch too, 36% of arrivals rejected (baseline 0%), and less waiting in the scheduler queue" \
           in v.explanation
    r = c.verdicts.recommendation
    assert r.setting == "mnqr-64"
    assert r.caveats[0] == "it rejects 36% of arrivals at admission (180 in the window, baseline 0%): its figures " \
                           "are those of the requests it let in"
    best_ttft = next(verdict for verdict in c.verdicts.best if verdict.metric == "ttft_p99")
    assert best_ttft.setting == "mnqr-64" and "it rejects 36% of arrivals" in best_ttft.caveat
    assert c.setting("mnqr-64").signals["admission_rejections"] == 180


def test_a_raised_cap_that_rejects_fewer_explains_the_longer_wait():
    baseline = _capped(make_run(ttft=0.3, completed=320, params={"max_num_queued_reqs": 64},
                                server={"queue_time_mean_s": 0.05, "max_waiting": 3}), 180)
    raised = _capped(make_run("mnqr-256", ttft=5.0, completed=320, params={"max_num_queued_reqs": 256},
                              server={"queue_time_mean_s": 4.0, "max_waiting": 128}), 15)
    explanation = compare([baseline, raised], Slos(), resamples=500).variation("mnqr-256").explanation
    assert ": fewer arrivals rejected (36% → 4%), so more of them wait, and requests waited in the scheduler " \
           "queue" in explanation


def test_the_suggested_max_num_queued_tokens_is_the_ttft_bound_times_the_measured_prefill_throughput():
    c = _queue_plan(ttft_p99_s=2.0)
    # the server counted 1e6 prompt tokens in the 60 s window (SERVER): 16,667 tokens/s x 2 s
    pick = c.queued_tokens_for()
    assert (pick.setting, pick.source, pick.ttft_target_s) == ("mnqr-64", "server", 2.0)
    assert (round(pick.prefill_tokens_per_s), pick.max_num_queued_tokens) == (16_667, 33_333)
    assert PROMPT_TOKENS.exposed_name in pick.source_text
    lines = console_lines(c)
    assert "rejected (%)" in lines[0]  # shown: some setting rejected
    assert lines[2].startswith("mnqr-64 ") and " 36.0 " in lines[2]
    assert lines[-1].startswith("Suggested max_num_queued_tokens for mnqr-64: 33,333 = TTFT target 2 s (the plan's "
                                "p99 TTFT bound) × prefill throughput 16,667 tokens/s (the server's ")
    assert "Suggested max_num_queued_tokens for mnqr-64: **33,333**" in render_markdown(c)


def test_without_the_servers_prompt_count_the_clients_is_used_and_without_a_ttft_bound_there_is_none():
    baseline = make_run(server={"prompt_tokens": 0.0})
    baseline = baseline.model_copy(update={"client": baseline.client.model_copy(
        update={"prefill_tokens_per_s": 5000.0})})
    c = compare([baseline], Slos(ttft_p99_s=0.5), resamples=500)
    assert (c.queued_tokens[0].source, c.queued_tokens[0].max_num_queued_tokens) == ("client", 2500)
    c = compare([baseline], Slos(ttft_p99_s=None), resamples=500)
    assert c.queued_tokens == [] and queued_tokens_lines(c) == [
        "Suggested max_num_queued_tokens: none (the plan sets no p99 TTFT bound)."]


def test_mlperf_counts_a_query_rejected_at_admission_as_not_completed():
    # the capped server answers the queries it admits within the bounds, and its queue cannot grow: only the kept-up
    # check sees the 100 it refused, and a rate held by refusing them is not sustained
    run = _capped(make_run(ttft=0.3, completed=900, window_s=60.0), 100)
    flow = PointFlow(offered=1000, waiting_first_half=2, waiting_second_half=2, waiting_end=2, running_end=64)
    point = judge(16.0, run, flow, Slos(), ServerRules())
    assert not point.meets and [c.name for c in point.failed_checks()] == ["kept up"]
    assert point.failed_checks()[0].detail == "completed 900 of 1000 offered (90.0% < 95%; 100 rejected at " \
                                              "admission, not completed)"
    assert point.rejected == 100
    assert judge(16.0, make_run(ttft=0.3, completed=990), flow, Slos(), ServerRules()).meets


def test_a_what_if_run_counts_the_simulators_refusals_as_the_load_generator_would():
    # 8 users on a queue capped at 4: each refused user pauses and retries, every refusal a rejected_busy record
    plan = Plan.model_validate(tiny_plan(workload={"input_tokens": 64, "output_tokens": 16, "timeout_s": 30,
                                                   "load": {"mode": "concurrency", "concurrency": 8}}))
    capped = ServingParams(model="sim-model", max_model_len=1024, max_num_queued_reqs=4)
    run = run_what_if(plan, "mnqr-4", capped, 0)
    client = run.client
    assert run.status == "ok" and set(client.rejected) == {"max_num_queued_reqs"} and client.rejected_total > 0
    assert client.rejected_share == pytest.approx(client.rejected_total / (client.completed + client.rejected_total))
    assert run.server.admission_rejections == client.rejected_total
    assert client.prefill_tokens_per_s == pytest.approx(run.server.prompt_tokens / client.window_s, rel=0.2)
    free = run_what_if(plan, "baseline", plan.baseline, 0)
    assert (free.client.rejected, free.client.rejected_share, free.server.admission_rejections) == ({}, 0.0, 0)


def test_the_settings_table_names_the_change_and_the_baseline_line_the_knobs_every_setting_keeps():
    c = _queue_plan()
    head = settings_head(c)
    assert not set(head) & set(TUNABLE)  # no column of one value: the plan's changes are in 'changed'
    rows = {row[0]: row for row in settings_rows(c)}
    assert all(len(row) == len(head) for row in rows.values())
    assert rows["mnqr-64"][1] == "max_num_queued_reqs vLLM default → 64"
    line = baseline_line(c)
    assert line.startswith("Baseline: max_num_seqs ") and "max_num_queued_tokens" not in line  # unset, not reported
