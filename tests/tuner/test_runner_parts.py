"""The run loop's pure parts (order, diff, window signals, live quantile) and its two optional HTTP
neighbours, Prometheus and Grafana, against a recording stub."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from batchscope.loadgen import MeasurementWindow, RequestRecord, counted
from batchscope.tuner.plan import Plan, Slos
from batchscope.tuner.plan.order import plan_runs
from batchscope.tuner.results.signals import (
    MetricsPoint,
    cache_config,
    good_count,
    parse_metrics,
    read_records,
    samples_of,
    server_report,
    server_signals,
)
from batchscope.tuner.run.observers import PROMETHEUS_QUERIES, annotate, diff, grafana_annotator, query_prometheus
from batchscope.tuner.run.progress import client_live, quantile
from tests.stubs import HttpStub, json_reply
from tests.tuner.support import tiny_plan

RULES = Path(__file__).resolve().parents[2] / "prometheus" / "rules"


def test_repeats_are_interleaved_with_the_baseline_first():
    plan = Plan.model_validate(tiny_plan(repeats=2))
    assert [run.name for run in plan_runs(plan)] == ["baseline-r0", "mns-2-r0", "baseline-r1", "mns-2-r1"]
    assert [run.index for run in plan_runs(plan)] == [1, 2, 3, 4]


def test_diff_names_the_changed_parameter_as_a_change_log():
    plan = Plan.model_validate(tiny_plan())
    (_, baseline), (_, variation) = plan.settings()
    assert diff(baseline, variation) == ["max_num_seqs: vLLM default → 2"] and diff(baseline, baseline) == []
    seeds = Plan.model_validate(tiny_plan(baseline={"model": "m", "max_num_seqs": 128}))
    (_, baseline), (_, variation) = seeds.settings()
    assert diff(baseline, variation) == ["max_num_seqs: 128 → 2"]


def point(t: float, preemptions: float, waiting: float, kv: float, queue_sum: float, queue_count: float):
    return MetricsPoint(t=t, values={"vllm:num_preemptions_total": preemptions, "vllm:num_requests_waiting": waiting,
                                     "vllm:kv_cache_usage_perc": kv, "vllm:request_queue_time_seconds_sum": queue_sum,
                                     "vllm:request_queue_time_seconds_count": queue_count})


def test_counters_are_differences_across_the_window_and_gauges_its_samples():
    points = [point(0, 5, 9, 0.9, 10, 10),     # before: warm-up traffic, not counted
              point(10, 7, 1, 0.2, 12, 12),    # the last point at or before the window's start
              point(11, 8, 3, 0.5, 20, 14), point(12, 9, 2, 0.7, 26, 16),
              point(13, 10, 8, 0.95, 30, 20)]  # after the window's end: the counters' end, not a gauge sample
    signals = server_signals(points, window_start=10.5, window_end=12.5, kv_capacity_tokens=1000)
    assert signals.preemptions == 3 and signals.queue_time_mean_s == pytest.approx(18 / 8)
    assert (signals.max_waiting, signals.kv_usage_peak, signals.kv_usage_mean) == (3, 0.7, pytest.approx(0.6))
    assert signals.kv_capacity_tokens == 1000 and signals.tokens_per_step_mean is None


# vLLM 0.32's CPU build (shared/reference/vllm-0.32-cpu-metrics.txt), the labels that matter kept
CPU_CACHE_INFO = ('vllm:cache_config_info{block_size="128",engine="0",gpu_memory_utilization="0.92",'
                  'kv_cache_size_tokens="2097152",num_gpu_blocks="16384",num_gpu_blocks_override="None"} 1.0\n')


def test_what_the_server_chose_from_its_cache_config_version_models_and_log():
    reported = server_report(CPU_CACHE_INFO, {"version": "0.32.0"}, {"data": [{"max_model_len": 1024}]}, "")
    assert (reported.vllm_version, reported.block_size, reported.num_gpu_blocks) == ("0.32.0", 128, 16384)
    assert (reported.gpu_memory_utilization, reported.max_model_len, reported.kv_capacity_tokens) == \
        (0.92, 1024, 2_097_152)
    older = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="2000",gpu_memory_utilization="0.9"} 1.0\n'
    assert server_report(older, None, None, "").kv_capacity_tokens == 32000  # no kv_cache_size_tokens label
    log = "INFO 12-01 10:00:00 [kv_cache_utils.py:2327] CPU KV cache size: 2,560 tokens, Maximum concurrency " \
        "for 2,048 tokens per request: 1.25x\n"
    assert server_report(older, None, None, log).kv_capacity_tokens == 2560  # the log's line wins
    assert server_report("", None, None, "") == server_report("not { an exposition", {}, {"data": []}, "")
    assert cache_config("garbage {") == {} and server_report("", None, None, "").block_size is None


def test_live_ttft_p50_and_errors_from_the_client_metrics():
    name = "batchscope_client_time_to_first_token_seconds"
    text = (f"# TYPE {name} histogram\n{name}_bucket{{le=\"0.1\"}} 2\n{name}_bucket{{le=\"0.2\"}} 6\n"
            f"{name}_bucket{{le=\"+Inf\"}} 8\n{name}_count 8\n{name}_sum 1.0\n"
            "# TYPE batchscope_client_requests counter\n"
            'batchscope_client_requests_total{outcome="ok"} 8\n'
            'batchscope_client_requests_total{outcome="http_error"} 2\n'
            'batchscope_client_requests_total{outcome="aborted"} 4\n')
    live = client_live(text)
    assert live.ttft_p50_s == pytest.approx(0.1 + 0.1 * (4 - 2) / (6 - 2))
    assert (live.completed, live.errors) == (8, 2) and quantile(0.5, []) is None


def test_prometheus_rules_are_read_over_the_window():
    stub = HttpStub(lambda method, path: json_reply(
        {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [0, "1.5"]}]}}
    )).start()
    try:
        values = query_prometheus(stub.url, start=1000.0, end=1020.0)
    finally:
        stub.stop()
    assert values == dict.fromkeys(PROMETHEUS_QUERIES, 1.5)
    query = parse_qs(urlparse(stub.requests[0].path).query)
    assert "[20s:]" in query["query"][0] and query["time"] == ["1020.000"]


def test_one_grafana_region_per_run_with_the_change_as_text(monkeypatch):
    stub = HttpStub(lambda method, path: json_reply({"id": 1, "message": "Annotation added"})).start()
    monkeypatch.setenv("GRAFANA_TOKEN", "glsa_x")
    plan = Plan.model_validate(tiny_plan(grafana_url=stub.url))
    annotator = grafana_annotator(plan)
    try:
        annotate(annotator, plan, plan_runs(plan)[1], 1000.0, 1020.5)
        assert annotator is not None and annotator.close(timeout_s=5)  # delivered before the plan ends
    finally:
        stub.stop()
    (request,) = stub.requests
    assert (request.method, request.path) == ("POST", "/api/annotations")
    assert request.headers["Authorization"] == "Bearer glsa_x"
    assert json.loads(request.body) == {"time": 1000000, "timeEnd": 1020500, "tags": ["batchscope", "tuner", "mns-2"],
                                        "text": "tiny mns-2-r0: max_num_seqs: vLLM default → 2"}


def test_request_samples_keep_a_tpot_of_zero(tmp_path):
    # a TPOT of 0.0 (every token after the first in one read) is a value; only a one-token request has none
    records = tmp_path / "records.jsonl"
    rows = [{"request_id": f"r{n}", "worker": 0, "scheduled_s": 10.0 + n, "end_s": 11.0 + n, "ttft_s": 0.1,
             "e2e_s": 0.2, "tpot_s": tpot, "outcome": "ok"} for n, tpot in enumerate((0.0, 0.01, None))]
    records.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    assert samples_of(window_records(records, MeasurementWindow(0.0, 100.0))).tpot_s == [0.0, 0.01]


def test_goodput_counts_each_window_request_by_its_own_ttft_and_tpot(tmp_path):
    # vLLM bench serve's rule: a request is good when its TTFT and its TPOT are both within the bounds; a one-token
    # request has no TPOT and passes that bound; failed requests and those that ended outside the window count not
    records = tmp_path / "records.jsonl"
    cases = [(0.1, 0.01, "ok", 11.0), (3.0, 0.01, "ok", 12.0), (0.1, 0.5, "ok", 13.0), (0.1, None, "ok", 14.0),
             (0.1, 0.01, "timeout", 15.0), (0.1, 0.01, "ok", 150.0)]
    rows = [{"request_id": f"r{n}", "worker": 0, "scheduled_s": end - 1, "end_s": end, "ttft_s": ttft, "e2e_s": 1.0,
             "tpot_s": tpot, "outcome": outcome} for n, (ttft, tpot, outcome, end) in enumerate(cases)]
    records.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    counted_records = window_records(records, MeasurementWindow(0.0, 100.0))
    assert good_count(counted_records, Slos(ttft_p99_s=2.0, tpot_p99_s=0.2)) == 2
    assert good_count(counted_records, Slos(ttft_p99_s=None, tpot_p99_s=None)) == 4


def window_records(path: Path, window: MeasurementWindow) -> list[RequestRecord]:
    """The records a run's figures count (measured_client's selection)."""
    return [record for record in read_records(path) if counted(record, window)]


def test_each_runs_load_counts_its_live_goodput_by_the_plans_slos():
    # the load generator's goodput counter (and so the dashboards' goodput and the SLO rules' targets) judges by the
    # plan's SLOs, not by the workload's defaults
    plan = Plan.model_validate(tiny_plan(slos={"ttft_p99_s": 0.8, "tpot_p99_s": None}))
    assert (plan.workload.slo.ttft_s, plan.workload.slo.tpot_s) == (2.0, 0.2)
    assert (plan.run_spec().slo.ttft_s, plan.run_spec().slo.tpot_s) == (0.8, None)


def vllm_08_metrics(kv: float, queries: float, new_kv: float | None = None) -> str:
    """/metrics as vLLM 0.8 named its families (gpu_cache_usage_perc, gpu_prefix_cache_queries), optionally with
    today's KV gauge beside (a release in its deprecation window)."""
    text = (f'# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{{model_name="m"}} {kv}\n'
            f'# TYPE vllm:gpu_prefix_cache_queries counter\n'
            f'vllm:gpu_prefix_cache_queries_total{{model_name="m"}} {queries}\n')
    if new_kv is not None:
        text += f'# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{model_name="m"}} {new_kv}\n'
    return text


def test_an_older_vllms_renamed_families_read_under_todays_names():
    # vLLM 0.8's KV gauge was read as a missing series (0.0), so a full cache was never said to be full
    points = [parse_metrics(vllm_08_metrics(0.2, 10), 0.0), parse_metrics(vllm_08_metrics(0.97, 30), 1.0),
              parse_metrics(vllm_08_metrics(0.5, 50), 2.0)]
    signals = server_signals(points, 0.0, 2.0, None)
    assert signals.kv_usage_peak == 0.97 and signals.prefix_cache_queries == 40
    both = parse_metrics(vllm_08_metrics(0.9, 1, new_kv=0.4), 0.0)
    assert both.values["vllm:kv_cache_usage_perc"] == 0.4 and "vllm:gpu_cache_usage_perc" not in both.values


def test_every_recording_rule_the_tuner_queries_is_recorded_in_prometheus_rules():
    recorded = {rule["record"] for path in RULES.glob("*.yml")
                for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"] if "record" in rule}
    queried = {name for query in PROMETHEUS_QUERIES.values() for name in re.findall(r"\b\w+:\w+:\w+\b", query)}
    assert len(queried) == len(PROMETHEUS_QUERIES) and queried <= recorded, queried - recorded
