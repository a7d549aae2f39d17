"""tuner.compare (compute.py, explain.py) on synthetic runs: known per-request samples, known server signals."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from batchscope.loadgen.figures.summary import Distribution
from batchscope.loadgen.spec import WorkloadSpec
from batchscope.tuner.compare.compute import ConditionsDiffer, compare
from batchscope.tuner.compare.model import Comparison
from batchscope.tuner.compare.verdicts import pareto_front
from batchscope.tuner.plan import ServingParams, Slos
from batchscope.tuner.results.record import ClientFigures, RequestSamples, RunResult, ServerSignals

WORKLOAD = {"model": "auto", "input_tokens": 512, "output_tokens": 128, "seed": 1, "warmup_s": 10,
            "duration_s": 60, "load": {"mode": "concurrency", "concurrency": 64}}
# the seed's baseline, every knob named (a knob left unset would read 'vLLM default')
BASE_PARAMS = {"model": "meta-llama/Llama-3.1-8B-Instruct", "max_model_len": 4096, "max_num_seqs": 128,
               "max_num_batched_tokens": 2048, "gpu_memory_utilization": 0.92}
SERVER = {"preemptions": 0, "prompt_tokens": 1e6, "generation_tokens": 2.5e5, "requests_finished": 2000,
          "queue_time_mean_s": 0.01, "prefill_time_mean_s": 0.05, "decode_time_mean_s": 2.0,
          "tokens_per_step_mean": 1900, "max_waiting": 0, "max_running": 64, "kv_usage_peak": 0.5,
          "kv_usage_mean": 0.4, "kv_capacity_tokens": 500_000}
N = 400  # requests per run: enough for a tight bootstrap, small enough to keep the tests fast


def latencies(mean: float, seed: int, n: int = N, spread: float = 0.2) -> list[float]:
    """n per-request latencies around mean (lognormal, so p99 sits above p50 as in real runs)."""
    rng = np.random.default_rng(seed)
    return list(mean * rng.lognormal(0.0, spread, n))


def make_run(setting: str = "baseline", repeat: int = 0, *, ttft: float = 0.2, tpot: float = 0.02,
             completed: int | None = None, errors: int = 0, seed: int | None = None, window_s: float = 60.0,
             server: dict | None = None, params: dict | None = None, conditions: dict | None = None,
             mode: str = "real-time", status: str = "ok", failure: str | None = None,
             ttft_s: list[float] | None = None, itl: Distribution | None = None) -> RunResult:
    """A RunResult whose samples are drawn around the given means (seeded per setting and repeat), or are the
    given TTFTs; `itl` replaces the pooled ITL figures (the tail of every gap, which per-request means hide).
    Goodput: the share of the samples within the default SLOs, of the completed requests."""
    seed = seed if seed is not None else zlib.crc32(f"{setting}/{repeat}".encode())
    ttft_s = ttft_s if ttft_s is not None else latencies(ttft, seed)
    tpot_s = latencies(tpot, seed + 1)
    itl_s = latencies(tpot, seed + 2)
    e2e_s = [a + b * 127 for a, b in zip(ttft_s, tpot_s, strict=True)]
    completed = N if completed is None else completed
    good = round(completed * Slos().count_met(list(zip(ttft_s, tpot_s, strict=True))) / len(ttft_s))
    common = {"plan": "one-knob", "setting": setting, "repeat": repeat, "mode": mode,
              "params": ServingParams(**{**BASE_PARAMS, **(params or {})}),
              "conditions": WorkloadSpec.model_validate({**WORKLOAD, **(conditions or {})}),
              "started_at": "2026-01-01T00:00:00+00:00", "finished_at": "2026-01-01T00:01:10+00:00"}
    if status == "failed":
        return RunResult(**common, status="failed", failure=failure or "server did not start")
    client = ClientFigures(ttft=Distribution.of(ttft_s), tpot=Distribution.of(tpot_s),
                           itl=itl or Distribution.of(itl_s), e2e=Distribution.of(e2e_s),
                           completion_throughput_rps=completed / window_s,
                           output_tokens_per_s=completed * 128 / window_s, completed=completed, errors=errors,
                           window_s=window_s, good_completed=good, goodput_rps=good / window_s)
    return RunResult(**common, status="ok", client=client, server=ServerSignals(**{**SERVER, **(server or {})}),
                     samples=RequestSamples(ttft_s=ttft_s, tpot_s=tpot_s, itl_s=itl_s, e2e_s=e2e_s))


def run_compare(*runs: RunResult, slos: Slos | None = None) -> Comparison:
    return compare(list(runs), slos or Slos(), resamples=500)


# --- confidence intervals --------------------------------------------------------------------------------

def test_one_repeat_ci_across_requests_excludes_zero_for_a_real_change():
    c = run_compare(make_run(ttft=0.2), make_run("tokens8k", ttft=0.12, params={"max_num_batched_tokens": 8192}))
    ttft = c.variation("tokens8k").metric("ttft_p99")
    assert c.ci_basis == "requests" and ttft.method == "requests"
    assert ttft.ci_high < 0 and ttft.evidence == "indicative" and ttft.significant is False  # one repeat: never ✓
    assert ttft.ci_low <= ttft.delta <= ttft.ci_high
    assert ttft.relative == pytest.approx(ttft.delta / ttft.baseline)


def test_one_repeat_ci_includes_zero_when_only_the_sample_differs():
    c = run_compare(make_run(seed=1), make_run("same", seed=2, params={"max_num_seqs": 64}))
    for key in ("ttft_p50", "ttft_p99", "tpot_p99", "e2e_p99"):
        m = c.variation("same").metric(key)
        assert m.ci_low < 0 < m.ci_high, key
        assert m.significant is False, key


def test_itl_interval_is_centred_on_the_reported_delta():
    c = run_compare(make_run(tpot=0.02), make_run("x", tpot=0.03, params={"max_num_seqs": 64}))
    itl = c.variation("x").metric("itl_p99")
    assert itl.ci_low <= itl.delta <= itl.ci_high and itl.evidence == "indicative"


def test_one_repeat_throughput_uses_poisson_counts_and_gauges_have_no_ci():
    c = run_compare(make_run(completed=1200), make_run("half", completed=600, params={"max_num_seqs": 64}),
                    make_run("close", completed=1210, params={"max_num_seqs": 100}))
    half, close = c.variation("half"), c.variation("close")
    assert half.metric("completion_throughput_rps").method == "poisson"
    assert half.metric("completion_throughput_rps").evidence == "indicative"
    assert close.metric("completion_throughput_rps").evidence == "not significant"
    assert half.metric("max_waiting").method == "n/a" and half.metric("max_waiting").significant is None
    assert half.metric("kv_usage_peak").ci_low is None


def test_three_repeats_a_side_judge_the_runs():
    runs = [make_run(repeat=i, ttft=0.2 + 0.002 * i) for i in range(3)]
    runs += [make_run("fast", repeat=i, ttft=0.1 + 0.002 * i, params={"max_num_batched_tokens": 8192})
             for i in range(3)]
    runs += [make_run("noise", repeat=i, ttft=0.2 + 0.002 * (2 - i), params={"max_num_seqs": 64}) for i in range(3)]
    c = run_compare(*runs)
    assert c.ci_basis == "runs"
    fast = c.variation("fast").metric("ttft_p50")
    assert fast.method == "runs" and fast.significant is True
    noise = c.variation("noise").metric("ttft_p50")
    assert noise.ci_low <= 0 <= noise.ci_high and noise.significant is False
    assert c.setting("fast").runs_ok == 3


def test_bootstrap_is_seeded():
    runs = [make_run(), make_run("x", ttft=0.25, params={"max_num_seqs": 64})]
    assert run_compare(*runs).model_dump() == run_compare(*runs).model_dump()


# --- refusals and failures -------------------------------------------------------------------------------

@pytest.mark.parametrize(("change", "field"), [
    ({"input_tokens": 1024}, "input_tokens"),
    ({"load": {"mode": "concurrency", "concurrency": 32}}, "load.concurrency"),
    ({"load": {"mode": "poisson", "rate": 4}}, "load.mode"),
    ({"stream": False}, "stream"),
    ({"duration_s": 30}, "duration_s"),
    ({"seed": 7}, "seed"),
])
def test_differing_conditions_are_refused_with_the_field_named(change, field):
    with pytest.raises(ConditionsDiffer) as error:
        run_compare(make_run(), make_run("x", conditions=change, params={"max_num_seqs": 64}))
    message = str(error.value)
    assert f"conditions differ: {field} " in message and "\n" not in message


def test_an_api_key_difference_is_not_a_condition():
    c = run_compare(make_run(), make_run("x", conditions={"api_key": "other"}, params={"max_num_seqs": 64}))
    assert [v.setting for v in c.variations] == ["x"]


def test_what_if_and_real_time_runs_are_not_compared():
    with pytest.raises(ConditionsDiffer, match="^mode differs: baseline-r0 is real-time but x-r0 is what-if"):
        run_compare(make_run(), make_run("x", mode="what-if", params={"max_num_seqs": 64}))


def test_failed_runs_are_listed_not_compared():
    c = run_compare(make_run(), make_run(repeat=1, status="failed", failure="health deadline passed"),
                    make_run("tiny-kv", status="failed", params={"gpu_memory_utilization": 0.05},
                             failure="KV cache cannot hold one request of 4096 tokens"))
    assert [(f.setting, f.repeat, f.failure) for f in c.failed] == [
        ("baseline", 1, "health deadline passed"), ("tiny-kv", 0, "KV cache cannot hold one request of 4096 tokens")]
    assert c.setting("baseline").runs_ok == 1 and c.setting("baseline").runs_failed == 1
    tiny = c.variation("tiny-kv")
    assert all(m.value is None and m.significant is None for m in tiny.metrics)
    assert "failed" in tiny.explanation
    assert c.setting("tiny-kv").meets_slos is None


def test_changed_parameters_are_named():
    c = run_compare(make_run(), make_run("seqs32", params={"max_num_seqs": 32}))
    [change] = c.variation("seqs32").changed
    assert (change.name, change.baseline, change.value) == ("max_num_seqs", 128, 32)


def test_plan_order_is_kept():
    runs = [make_run("b-var", params={"max_num_seqs": 64}), make_run("a-var", params={"max_num_seqs": 32}),
            make_run()]
    c = compare(runs, Slos(), order=["b-var", "a-var"], resamples=200)
    assert [s.setting for s in c.settings] == ["baseline", "b-var", "a-var"]


# --- verdicts and SLOs -----------------------------------------------------------------------------------

def test_verdicts_best_per_objective_and_slo_filter():
    c = run_compare(
        make_run(ttft=0.5, tpot=0.02, completed=1000),
        make_run("fast-ttft", ttft=0.1, tpot=0.05, completed=1100, params={"max_num_batched_tokens": 8192}),
        make_run("fast-tpot", ttft=3.0, tpot=0.01, completed=900, params={"max_num_seqs": 32}),
        make_run("busy", ttft=1.0, tpot=0.3, completed=1500, params={"max_num_seqs": 256}),
        slos=Slos(ttft_p99_s=2.0, tpot_p99_s=0.2))
    best = {v.metric if "within" not in v.objective else "within": v for v in c.verdicts.best}
    # one repeat per setting: a delta is at most indicative, never significant
    assert best["ttft_p99"].setting == "fast-ttft" and best["ttft_p99"].significant_vs_baseline is False
    assert best["tpot_p99"].setting == "fast-tpot"
    assert best["completion_throughput_rps"].setting == "busy"
    assert best["within"].setting == "fast-ttft"
    assert c.verdicts.met_slos == ["baseline", "fast-ttft"]
    assert set(c.verdicts.pareto_ttft_tpot) == {"baseline", "fast-ttft", "fast-tpot"}


def test_a_none_bound_is_no_bound():
    runs = [make_run(ttft=5.0), make_run("x", ttft=0.1, tpot=1.0, params={"max_num_seqs": 64})]
    assert run_compare(*runs, slos=Slos(ttft_p99_s=None, tpot_p99_s=None)).verdicts.met_slos == ["baseline", "x"]
    assert run_compare(*runs, slos=Slos(ttft_p99_s=None, tpot_p99_s=0.2)).verdicts.met_slos == ["baseline"]
    assert run_compare(*runs, slos=Slos(ttft_p99_s=2.0, tpot_p99_s=None)).verdicts.met_slos == ["x"]


def test_pareto_front_drops_dominated_settings():
    c = run_compare(make_run(ttft=0.2, tpot=0.02), make_run("worse", ttft=0.4, tpot=0.04, params={"max_num_seqs": 64}))
    assert pareto_front(c.settings) == ["baseline"]


def test_comparison_carries_schema_and_conditions():
    c = run_compare(make_run(), make_run("x", params={"max_num_seqs": 64}))
    data = c.model_dump(mode="json")
    assert data["schema_version"] == 4 and data["mode"] == "real-time"
    assert data["conditions"]["input_tokens"] == 512 and data["slos"]["ttft_p99_s"] == 2.0
    assert Comparison.model_validate_json(c.model_dump_json()) == c


# --- explanations: the canonical cases -------------------------------------------------------------------

def test_token_budget_up_explains_ttft_down_by_tokens_per_step():
    c = run_compare(make_run(ttft=0.5, tpot=0.020),
                    make_run("tokens8k", ttft=0.31, tpot=0.0224, params={"max_num_batched_tokens": 8192},
                             server={"tokens_per_step_mean": 7400}))
    text = c.variation("tokens8k").explanation
    assert text.startswith("TTFT p50 −39% (TTFT p99 −37%): ")  # the largest change leads its group
    assert "3.9× more prefill tokens fit per step (tokens per step 1,900 → 7,400)" in text
    assert "ITL p50 +" in text and "as steps got longer" in text
    assert text.endswith("no preemptions")


def test_max_num_seqs_down_explains_ttft_up_by_the_queue():
    c = run_compare(make_run(ttft=0.3),
                    make_run("seqs32", ttft=0.93, params={"max_num_seqs": 32},
                             server={"max_waiting": 48, "queue_time_mean_s": 0.9, "max_running": 32}))
    text = c.variation("seqs32").explanation
    assert text.startswith("TTFT p99 +")
    assert "requests waited in the scheduler queue (max waiting 0 → 48, queue time mean 10 ms → 0.90 s)" in text
    assert "max_num_seqs 32 caps the running batch" in text


def test_low_memory_explains_throughput_down_by_preemptions_and_kv():
    c = run_compare(make_run(completed=1200),
                    make_run("low-util", completed=960, params={"gpu_memory_utilization": 0.3, "max_num_seqs": 256,
                                                                "max_num_batched_tokens": 4096},
                             server={"preemptions": 1200, "kv_usage_peak": 1.0, "kv_capacity_tokens": 60_000}))
    text = c.variation("low-util").explanation
    assert "throughput −20%" in text
    assert "1,200 preemptions (baseline 0), KV peak 100%" in text
    assert "the KV cache (500,000 → 60,000 tokens) is too small for 256 sequences" in text
    assert text.endswith("Raise gpu_memory_utilization or lower max_num_seqs / max_num_batched_tokens.")


def test_no_significant_change_is_said_so():
    c = run_compare(make_run(seed=1), make_run("same", seed=2, params={"max_num_seqs": 120}))
    assert c.variation("same").explanation == "no significant change in TTFT, TPOT, ITL or throughput (no preemptions)"


def test_signals_are_not_claimed_without_a_significant_effect():
    # tokens per step doubled, but latencies and throughput did not move: no causal claim about steps
    c = run_compare(make_run(seed=1), make_run("same", seed=2, params={"max_num_batched_tokens": 4096},
                                               server={"tokens_per_step_mean": 3800}))
    assert "tokens per step" not in c.variation("same").explanation


def test_preemptions_gone_are_credited():
    c = run_compare(make_run(completed=900, server={"preemptions": 300, "kv_usage_peak": 1.0}),
                    make_run("more-mem", completed=1200, params={"gpu_memory_utilization": 0.95}))
    text = c.variation("more-mem").explanation
    assert "throughput +33%: preemptions gone (300 → 0)" in text
