"""The report's one recommendation (tuner.compare.verdicts.recommend, tuner.report.recommendation) and
explanations that lead with the largest effect (tuner.compare.explain), on synthetic runs built as
tests/tuner/test_compare.py builds them."""

from __future__ import annotations

import numpy as np

from batchscope.loadgen.figures.summary import Distribution
from batchscope.tuner.compare.compute import compare
from batchscope.tuner.compare.model import Comparison
from batchscope.tuner.plan import Objective, Slos
from batchscope.tuner.report.recommendation import recommendation_lines
from batchscope.tuner.results.record import RunResult
from tests.tuner.test_compare import N, make_run

SLOS = Slos(ttft_p99_s=2.0, tpot_p99_s=0.2)


def run_compare(*runs: RunResult, objective: Objective = "goodput", slos: Slos = SLOS) -> Comparison:
    return compare(list(runs), slos, resamples=500, objective=objective)


def low_memory(**overrides) -> RunResult:
    """A setting whose decodes are fast because few sequences run: it preempts and completes half as many."""
    return make_run("gmu-0.25", tpot=0.011, completed=600, params={"gpu_memory_utilization": 0.25},
                    server={"preemptions": 40, "kv_usage_peak": 0.99, "max_running": 9}, **overrides)


def test_a_preempting_setting_is_never_recommended_for_a_latency_silently():
    c = run_compare(make_run(tpot=0.036, completed=1200), low_memory(), objective="tpot_p99")
    r = c.verdicts.recommendation
    assert r is not None and r.setting == "gmu-0.25" and r.runner_up == "baseline"
    assert any("preempts (40 preemptions, baseline 0)" in x for x in r.caveats)
    assert any("loses 50% of throughput (20.00 → 10.00 req/s)" in x for x in r.caveats)
    headline = recommendation_lines(c)[0]
    assert headline.startswith("**Recommended: gmu-0.25** — lowest TPOT p99 among the settings that met the SLOs")
    assert "Note: it preempts" in headline and "loses 50% of throughput" in headline
    best = next(v for v in c.verdicts.best if v.objective == "TPOT p99 (lowest)")
    assert best.setting == "gmu-0.25" and best.caveat is not None and "preempts" in best.caveat
    assert best.evidence == "indicative"  # one repeat: its interval excludes 0, no more


def test_goodput_recommends_among_the_settings_that_met_the_slos():
    # 'busy' completes the most but misses the TPOT bound; 'fast' has the most goodput of those within
    c = run_compare(make_run(ttft=0.5, completed=1000),
                    make_run("fast", ttft=0.3, completed=1150, params={"max_num_batched_tokens": 8192}),
                    make_run("busy", tpot=0.3, completed=1500, params={"max_num_seqs": 256}),
                    low_memory())
    r = c.verdicts.recommendation
    assert r is not None and (r.setting, r.runner_up, r.metric) == ("fast", "baseline", "goodput_rps")
    assert r.evidence == "indicative" and r.caveats == []
    lines = recommendation_lines(c)
    assert lines[0].startswith("**Recommended: fast** — highest goodput among the settings that met the SLOs "
                               "(goodput 19.17 req/s)")
    assert "With fewer than 3 runs per setting no difference is called significant" in lines[0]
    why = next(x for x in lines if x.startswith("Why: "))
    assert "vs the baseline (indicative)" in why and "[" in why and "TTFT p99" in why and "≤ 2,000 ms" in why
    runner = next(x for x in lines if x.startswith("Runner-up: **baseline**"))
    assert "gains TTFT mean" in runner
    latency = next(x for x in lines if x.startswith("Latency of fast (mean / p50 / p99): TTFT "))
    assert latency.count(" / ") == 6  # the heading's, then mean / p50 / p99 of TTFT and of TPOT
    within = {v.objective: v for v in c.verdicts.best}
    assert within["goodput within the SLOs (highest)"].setting == "fast"
    # the latency verdicts within the SLOs go to the preempting setting, and say what it costs
    for objective in ("TTFT p99 within the SLOs (lowest)", "TPOT p99 within the SLOs (lowest)"):
        assert within[objective].setting == "gmu-0.25"
        assert "preempts" in (within[objective].caveat or "") and "loses 40% of throughput" in within[objective].caveat


def test_nothing_is_recommended_when_no_setting_met_the_slos():
    c = run_compare(make_run(ttft=3.0), make_run("near", ttft=2.2, params={"max_num_batched_tokens": 8192}),
                    make_run("far", ttft=6.0, params={"max_num_seqs": 32}))
    r = c.verdicts.recommendation
    assert r is not None and r.setting is None and r.runner_up is None and r.closest == "near"
    headline = recommendation_lines(c)[0]
    assert headline.startswith("**No recommendation**: no setting met the SLOs (p99 TTFT ≤ 2,000 ms")
    assert "Closest, **not recommended**: near (TTFT p99 " in headline


# --- explanations lead with the largest effect -----------------------------------------------------------

def spread_ttft(median: float, tail: float, seed: int) -> list[float]:
    """TTFTs whose median and tail move separately: most requests near `median`, 3% near `tail`."""
    rng = np.random.default_rng(seed)
    body = median * rng.lognormal(0.0, 0.1, N - N * 3 // 100)
    return list(np.concatenate([body, tail * rng.lognormal(0.0, 0.02, N * 3 // 100)]))


def test_a_larger_token_budget_leads_with_tail_itl_and_cites_prefill_time():
    # mnbt-8192 on the one-knob plan: the median gap shrinks, the tail grows 56 -> 201 ms, prefill time doubles
    base_itl = Distribution(count=50_000, mean=0.054, p50=0.053, p90=0.054, p99=0.056)
    budget_itl = Distribution(count=50_000, mean=0.030, p50=0.013, p90=0.013, p99=0.201)
    c = run_compare(make_run(ttft=0.22, tpot=0.036, itl=base_itl, server={"prefill_time_mean_s": 0.13}),
                    make_run("mnbt-8192", ttft=0.40, tpot=0.036, itl=budget_itl,
                             params={"max_num_batched_tokens": 8192}, server={"prefill_time_mean_s": 0.25}))
    text = c.variation("mnbt-8192").explanation
    assert text.startswith("ITL p99 +259%: decodes stall in steps shared with long prefills (ITL p99 56 ms → "
                           "0.20 s) — max_num_batched_tokens 8,192 lets a long prompt's prefill into the same step")
    assert "; TTFT p" in text
    assert "prefill took 1.9× longer (prefill time mean 0.13 s → 0.25 s)" in text
    assert "; ITL p50 −75%" in text  # the median moved the other way: its own effect, after the larger ones
    assert text.index("ITL p99") < text.index("TTFT p") < text.index("ITL p50 −")


def test_a_smaller_token_budget_leads_with_the_median_ttft_that_moved_most():
    # mnbt-1024: TTFT p50 +220% while p99 rose 18%; the queue that made them wait is the cause
    c = run_compare(make_run(ttft_s=spread_ttft(0.22, 1.8, 1), server={"queue_time_mean_s": 0.29, "max_waiting": 1}),
                    make_run("mnbt-1024", ttft_s=spread_ttft(0.70, 2.12, 2), params={"max_num_batched_tokens": 1024},
                             server={"queue_time_mean_s": 0.70, "max_waiting": 6}))
    text = c.variation("mnbt-1024").explanation
    assert text.startswith("TTFT p50 +2")
    assert "(TTFT p99 +1" in text.split(":")[0]
    assert "requests waited in the scheduler queue (max waiting 1 → 6, queue time mean 0.29 s → 0.70 s) — " \
           "max_num_batched_tokens 1,024 admits fewer prompt tokens per step" in text


def test_a_lead_between_two_variations_is_not_claimed_from_their_intervals():
    c = run_compare(make_run(completed=800), make_run("a", completed=1200, params={"max_num_seqs": 64}),
                    make_run("b", completed=1000, params={"max_num_seqs": 96}))
    r = c.verdicts.recommendation
    assert r is not None and (r.setting, r.runner_up) == ("a", "b")
    assert "its own delta to the baseline is indicative (the two variations were each compared with the baseline " \
           "only)" in recommendation_lines(c)[0]
