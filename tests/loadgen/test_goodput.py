"""The client goodput counter and the SLO targets it judges by, as the controller folds records in and the client
/metrics exposes them (a fresh CollectorRegistry per test, values by name with get_sample_value); no processes."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from prometheus_client import CollectorRegistry

from batchscope.loadgen.control import RunControl
from batchscope.loadgen.metrics import ClientMetricsCollector
from batchscope.loadgen.request import RequestRecord
from batchscope.loadgen.spec import DEFAULT_SLO_TPOT_S, DEFAULT_SLO_TTFT_S, SpecError, load_spec
from batchscope.tuner.plan import Slos

SPEC = ["input_tokens=8", "output_tokens=4", "load.mode=concurrency", "load.concurrency=2", "warmup_s=10",
        "duration_s=100"]
LABELS = {"run_id": "t", "scenario": "default"}


def ended(i: int, end: float, ttft: float, tpot: float | None, outcome: str = "ok") -> RequestRecord:
    return RequestRecord(request_id=str(i), worker=0, scheduled_s=end - 1, sent_s=end - 1, first_token_s=end - 0.9,
                         last_token_s=end, end_s=end, ttft_s=ttft, tpot_s=tpot, e2e_s=1.0, itl_s=[0.3],
                         prompt_tokens=8, output_tokens=4, outcome=outcome)


def control(*overrides: str) -> RunControl:
    return RunControl(spec=load_spec(None, [*SPEC, *overrides]), run_id="t", host="h", out_dir=None,
                      request_stop=lambda: None, sender_count=lambda: 1, start_s=1000.0)


def exposed(ctl: RunControl) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(ClientMetricsCollector(ctl.stats, in_flight=lambda: 0, run_id="t", scenario="default",
                                             spec_labels=dict, refresh=lambda: None))
    return registry


# (TTFT, TPOT, outcome, end): judged against targets TTFT 0.5 s, TPOT 0.1 s, window [1010, 1110]
RECORDS = [(0.1, 0.05, "ok", 1005.0),  # within both, but in the warm-up: not in the window's population
           (0.1, 0.05, "ok", 1020.0),  # good
           (0.5, 0.1, "ok", 1030.0),  # good: on both targets exactly (vllm bench serve's <=)
           (0.6, 0.05, "ok", 1040.0),  # TTFT missed
           (0.1, 0.2, "ok", 1050.0),  # TPOT missed
           (0.1, None, "ok", 1060.0),  # one token, no TPOT: passes it, as vLLM counts it 0
           (0.1, 0.05, "timeout", 1070.0),  # not completed
           (0.1, 0.05, "ok", 1115.0)]  # ended after the window


def test_goodput_counts_the_windows_completed_requests_within_both_of_the_specs_targets():
    ctl = control("slo.ttft_s=0.5", "slo.tpot_s=0.1")
    for i, (ttft, tpot, outcome, end) in enumerate(RECORDS):
        ctl.accept(ended(i, end, ttft, tpot, outcome))
    registry = exposed(ctl)
    assert registry.get_sample_value("batchscope_client_goodput_requests_total", LABELS) == 3
    # the same population as the TTFT histogram, which the attainment rule divides by
    assert registry.get_sample_value("batchscope_client_time_to_first_token_seconds_count", LABELS) == 5
    assert registry.get_sample_value("batchscope_client_slo_target_seconds", {**LABELS, "metric": "ttft"}) == 0.5
    assert registry.get_sample_value("batchscope_client_slo_target_seconds", {**LABELS, "metric": "tpot"}) == 0.1


def test_the_tuners_goodput_rule_is_the_load_generators():
    window = [(ttft, tpot) for ttft, tpot, outcome, end in RECORDS if outcome == "ok" and 1010 <= end <= 1110]
    assert Slos(ttft_p99_s=0.5, tpot_p99_s=0.1).count_met(window) == 3
    assert (Slos().ttft_p99_s, Slos().tpot_p99_s) == (DEFAULT_SLO_TTFT_S, DEFAULT_SLO_TPOT_S)


def test_by_default_the_targets_are_the_tuner_plans_and_a_null_target_is_none():
    assert exposed(control()).get_sample_value("batchscope_client_slo_target_seconds",
                                               {**LABELS, "metric": "ttft"}) == DEFAULT_SLO_TTFT_S
    ctl = control("slo={ttft_s: null, tpot_s: 0.1}")  # (--set key=null removes a field: its default)
    for i, (ttft, tpot, outcome, end) in enumerate(RECORDS):
        ctl.accept(ended(i, end, ttft, tpot, outcome))
    registry = exposed(ctl)
    assert registry.get_sample_value("batchscope_client_slo_target_seconds", {**LABELS, "metric": "ttft"}) == math.inf
    assert registry.get_sample_value("batchscope_client_goodput_requests_total", LABELS) == 4  # the 0.6 s TTFT too


@pytest.mark.parametrize("override, message", [
    ("slo.ttft_s=0", "spec: slo.ttft_s: Input should be greater than 0"),
    ("slo.tpot_s=-0.1", "spec: slo.tpot_s: Input should be greater than 0"),
    ("slo.ttft_s=1e6", "spec: slo.ttft_s: Input should be less than or equal to 86400"),
    ("slo.tpot_s=fast", "spec: slo.tpot_s: Input should be a valid number, unable to parse string as a number"),
    ("slo.ttft_s=.inf", "spec: slo.ttft_s: Input should be a finite number"),
    ("slo.e2e_s=1", "spec: slo.e2e_s: Extra inputs are not permitted"),
])
def test_a_bad_slo_target_is_named_with_what_it_allows(override, message):
    with pytest.raises(SpecError) as caught:
        load_spec(None, [*SPEC, override])
    assert str(caught.value) == message


def test_batchscope_load_refuses_a_bad_slo_target_in_one_line_before_starting(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("input_tokens: 8\noutput_tokens: 4\nload: {mode: offline, requests: 1}\nslo: {ttft_s: 0}\n")
    result = subprocess.run([sys.executable, "-m", "batchscope.cli", "load", "--spec", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr.strip().splitlines()) == \
        (2, ["batchscope load: error: spec: slo.ttft_s: Input should be greater than 0"])
