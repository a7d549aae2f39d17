"""batchscope_slo_target_seconds in the fast tier: a fresh CollectorRegistry per test, vLLM and the load generator
served from loopback stubs (the load generator's text is its own collector's, for a spec's targets), values by
name with get_sample_value. The load spec's target wins over the flag, a target that is no bound of vLLM's
buckets gets the next bound up as `le`, and the goodput counter passes through."""

from __future__ import annotations

import logging
import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from batchscope.exporter.changes import ChangeTracker
from batchscope.exporter.collector import BatchscopeCollector, ExporterSources
from batchscope.exporter.slo import SloFlags, bucket_bound
from batchscope.loadgen.figures.metrics import ClientMetricsCollector
from batchscope.loadgen.run.control import RunControl
from batchscope.loadgen.spec import load_spec
from batchscope.vllm.buckets import ITL_BUCKETS, TTFT_BUCKETS
from tests.exporter.clock import Clock
from tests.stubs import HttpStub, Reply

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 1.0
"""
TARGET = "batchscope_slo_target_seconds"


def client_metrics(*spec_overrides: str) -> str:
    """The load generator's own /metrics text for a spec (no request yet)."""
    spec = load_spec(None, ["input_tokens=8", "output_tokens=4", "load.mode=offline", "load.requests=1",
                            *spec_overrides])
    ctl = RunControl(spec=spec, run_id="r1", host="h", out_dir=None, request_stop=lambda: None,
                     sender_count=lambda: 1, start_s=0.0)
    registry = CollectorRegistry()
    registry.register(ClientMetricsCollector(ctl.stats, in_flight=lambda: 0, run_id="r1", scenario="s",
                                             spec_labels=dict, refresh=lambda: None))
    return generate_latest(registry).decode()


@pytest.fixture
def stubs():
    started: list[HttpStub] = []

    def start(text: str) -> str:
        stub = HttpStub(lambda _method, path: Reply(body=text.encode(), content_type="text/plain")
                        if path == "/metrics" else Reply(status=404)).start()
        started.append(stub)
        return stub.url

    yield start
    for stub in started:
        stub.stop()


def registry(stubs, loadgen_text: str | None = None, **flags: float) -> CollectorRegistry:
    sources = ExporterSources(vllm_url=stubs(VLLM_METRICS), loadgen_url=stubs(loadgen_text) if loadgen_text else None,
                              timeout_s=2.0, slo=SloFlags(**flags))
    fresh = CollectorRegistry()
    fresh.register(BatchscopeCollector(sources, ChangeTracker(clock=Clock(0.0))))
    return fresh


def targets(registry: CollectorRegistry) -> dict[tuple[str, str, str], float]:
    """(metric, le, source) -> value of every batchscope_slo_target_seconds sample."""
    return {(s.labels["metric"], s.labels["le"], s.labels["source"]): s.value
            for family in registry.collect() if family.name == TARGET for s in family.samples}


def test_the_load_specs_targets_rounded_up_to_the_next_bound_of_vllms_buckets(stubs):
    exposed = registry(stubs, client_metrics("slo.ttft_s=0.8", "slo.tpot_s=0.12"))
    assert exposed.get_sample_value(TARGET, {"metric": "ttft", "le": "1.0", "source": "load_spec"}) == 0.8
    assert exposed.get_sample_value(TARGET, {"metric": "tpot", "le": "0.15", "source": "load_spec"}) == 0.12
    assert len(targets(exposed)) == 2
    # the goodput counter and the client's own targets pass through as the load generator's families
    assert exposed.get_sample_value("batchscope_client_goodput_requests_total", {"run_id": "r1", "scenario": "s"}) == 0
    assert exposed.get_sample_value("batchscope_client_slo_target_seconds",
                                    {"run_id": "r1", "scenario": "s", "metric": "ttft"}) == 0.8


def test_the_default_targets_are_the_tuner_plans_at_the_bounds_the_rules_constants_use(stubs):
    assert targets(registry(stubs, client_metrics())) == {("ttft", "2.5", "load_spec"): 2.0,
                                                          ("tpot", "0.2", "load_spec"): 0.2}


def test_a_target_beyond_the_largest_bound_or_none_is_counted_at_inf(stubs):
    exposed = registry(stubs, client_metrics("slo={ttft_s: 3000, tpot_s: null}"))
    assert targets(exposed) == {("ttft", "+Inf", "load_spec"): 3000.0, ("tpot", "+Inf", "load_spec"): math.inf}


def test_without_a_load_generator_the_flags_are_the_targets(stubs):
    assert targets(registry(stubs, ttft_s=2.0, tpot_s=0.05)) == {("ttft", "2.5", "flag"): 2.0,
                                                                 ("tpot", "0.05", "flag"): 0.05}


def test_without_a_load_generator_or_flags_no_target_is_exposed_and_the_rules_use_their_constants(stubs):
    assert targets(registry(stubs)) == {}
    assert targets(registry(stubs, tpot_s=0.3)) == {("tpot", "0.3", "flag"): 0.3}


def test_the_load_specs_target_wins_over_the_flag_which_is_logged_once(stubs, caplog):
    exposed = registry(stubs, client_metrics("slo.ttft_s=0.8"), ttft_s=5.0, tpot_s=0.2)
    with caplog.at_level(logging.WARNING, logger="batchscope.exporter"):
        for _ in range(3):
            assert targets(exposed) == {("ttft", "1.0", "load_spec"): 0.8, ("tpot", "0.2", "load_spec"): 0.2}
    # the TPOT flag agrees with the spec's: nothing to say (the stub's missing /v1/models is logged apart)
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("--slo")] == [
        "--slo-ttft-seconds 5: the load generator's spec sets 0.8, which its goodput counter judges by; using the "
        "spec's"]


@pytest.mark.parametrize("metric, target, bound", [
    ("ttft", 0.001, 0.001), ("ttft", 0.0011, 0.005), ("ttft", 2.0, 2.5), ("ttft", 2.5, 2.5),
    ("ttft", TTFT_BUCKETS[-1], TTFT_BUCKETS[-1]), ("ttft", 2561.0, math.inf), ("ttft", math.inf, math.inf),
    ("tpot", 0.001, 0.01), ("tpot", 0.12, 0.15), ("tpot", 0.2, 0.2), ("tpot", ITL_BUCKETS[-1], ITL_BUCKETS[-1]),
    ("tpot", 81.0, math.inf),
])
def test_a_target_is_counted_at_the_smallest_bound_at_or_above_it(metric, target, bound):
    assert bucket_bound(metric, target) == bound
