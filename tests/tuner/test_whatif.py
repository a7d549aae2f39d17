"""What-if mode: a one-knob plan on the simulator's virtual clock, in seconds, with the seed's directions."""

from __future__ import annotations

import math
import time

import pytest
import yaml

from batchscope.simulator.config import Deployment, ServeConfig
from batchscope.simulator.profile import load_profile
from batchscope.tuner.plan import CommandBackend, Plan, Slos
from batchscope.tuner.results.record import RunResult
from batchscope.tuner.whatif import run_what_if, simulate

PROFILE = "h100-llama-3.1-8b"
USERS, INPUT, OUTPUT = 64, 2048, 256


def utilization_for(kv_tokens: int, max_num_batched_tokens: int = 2048) -> float:
    """The gpu_memory_utilization whose KV cache holds about ``kv_tokens`` (the simulator's memory model)."""
    profile = load_profile(PROFILE)
    fixed = profile.weight_bytes + profile.activation_peak_bytes(max_num_batched_tokens) + profile.non_torch_bytes
    return math.ceil((fixed + kv_tokens * profile.kv_bytes_per_token) / profile.gpu_memory_bytes * 100) / 100


# a third of what the users hold at their longest: the cache runs out as their outputs grow
LOW_UTILIZATION = utilization_for(USERS * (INPUT + OUTPUT) // 3)


def one_knob_plan(**changes) -> Plan:
    """What examples/one-knob.yaml describes: the seed's baseline and four one-knob variations."""
    return Plan.model_validate({
        "name": "one-knob",
        "workload": {"input_tokens": INPUT, "output_tokens": OUTPUT, "seed": 1,
                     # more users than max_num_seqs 32, spread over about one request's length (no lockstep)
                     "load": {"mode": "concurrency", "concurrency": USERS, "ramp_up_s": 4}},
        "backend": {"kind": "simulator", "profile": PROFILE},
        "baseline": {"model": "meta-llama/Llama-3.1-8B-Instruct", "max_model_len": 4096},
        "variations": [
            {"name": "batched-1024", "set": {"max_num_batched_tokens": 1024}},
            {"name": "batched-8192", "set": {"max_num_batched_tokens": 8192}},
            {"name": "seqs-32", "set": {"max_num_seqs": 32}},
            {"name": "low-memory", "set": {"gpu_memory_utilization": LOW_UTILIZATION}},
        ],
        "warmup_s": 10, "window_s": 30, **changes,
    })


@pytest.fixture(scope="module")
def one_knob() -> tuple[dict[str, RunResult], float]:
    plan = one_knob_plan()
    began = time.perf_counter()
    runs = {name: run_what_if(plan, name, params, 0) for name, params in plan.settings()}
    return runs, time.perf_counter() - began


def test_the_whole_one_knob_plan_runs_in_seconds(one_knob) -> None:
    runs, elapsed = one_knob
    print(f"what-if of the one-knob plan: {elapsed:.2f} s for {len(runs)} settings")
    assert elapsed < 10.0
    assert all(run.status == "ok" and run.mode == "what-if" for run in runs.values())


def test_the_directions_of_the_seed_article(one_knob) -> None:
    runs, _ = one_knob
    client = {name: run.client for name, run in runs.items()}
    server = {name: run.server for name, run in runs.items()}
    # more prefill tokens per step: first tokens sooner, at the price of longer decode steps
    assert client["batched-8192"].ttft.mean < client["batched-1024"].ttft.mean
    assert client["batched-8192"].itl.mean > client["batched-1024"].itl.mean
    # fewer sequences than users: the rest wait in the scheduler's queue
    assert client["seqs-32"].ttft.mean > 5 * client["baseline"].ttft.mean
    assert server["seqs-32"].queue_time_mean_s > server["baseline"].queue_time_mean_s
    assert server["seqs-32"].max_waiting == USERS - 32 and server["seqs-32"].max_running == 32
    # a KV cache cut below what the users hold: preemptions, and it runs full
    assert server["baseline"].preemptions == 0
    assert server["low-memory"].preemptions > 0
    assert server["low-memory"].kv_usage_peak > 0.95
    assert server["low-memory"].kv_capacity_tokens < server["baseline"].kv_capacity_tokens
    assert client["low-memory"].completion_throughput_rps < client["baseline"].completion_throughput_rps


def test_client_figures_follow_the_load_generators_window_rule(one_knob) -> None:
    runs, _ = one_knob
    run = runs["baseline"]
    client, server, samples = run.client, run.server, run.samples
    assert client.window_s == 30.0
    assert client.completion_throughput_rps == pytest.approx(client.completed / 30.0)
    assert client.ttft.count == client.e2e.count == len(samples.ttft_s) == client.completed
    # ITL pools every gap of the window's completed requests: OUTPUT - 1 per request
    assert client.itl.count == client.completed * (OUTPUT - 1)
    assert client.itl.mean == pytest.approx(client.tpot.mean)  # equal-length requests: same mean
    assert samples.itl_s == pytest.approx(samples.tpot_s)
    # the tokens delivered in the window are the engine's generation tokens over it
    assert client.output_tokens_per_s == pytest.approx(server.generation_tokens / 30.0)
    assert server.requests_finished == client.completed
    assert server.kv_capacity_tokens % 16 == 0 and 0 < server.kv_usage_mean <= server.kv_usage_peak <= 1
    assert server.tokens_per_step_mean > USERS * 0.5


def test_repeats_and_poisson_arrivals_are_seeded() -> None:
    plan = one_knob_plan(workload={"input_tokens": 512, "output_tokens": 64,
                                   "load": {"mode": "poisson", "rate": 8}}, warmup_s=2, window_s=10)
    params = plan.baseline
    first, again, other = (run_what_if(plan, "baseline", params, r) for r in (0, 0, 1))
    assert first.client == again.client
    assert first.client != other.client
    assert first.client.completion_throughput_rps == pytest.approx(8, rel=0.25)


def test_offline_runs_until_the_last_request() -> None:
    plan = one_knob_plan(workload={"input_tokens": 512, "output_tokens": 64,
                                   "load": {"mode": "offline", "requests": 200}}, warmup_s=0)
    run = run_what_if(plan, "baseline", plan.baseline, 0)
    assert run.client.completed == 200
    assert run.client.completion_throughput_rps == pytest.approx(200 / run.client.window_s)


def test_a_configuration_the_simulator_refuses_is_a_failed_run() -> None:
    plan = one_knob_plan()
    params = plan.baseline.model_copy(update={"gpu_memory_utilization": 0.2})
    run = run_what_if(plan, "too-small", params, 0)
    assert run.status == "failed" and run.client is None
    assert run.failure.startswith("server refused: ") and "\n" not in run.failure
    assert "gpu_memory_utilization" in run.failure


def test_requests_longer_than_max_model_len_fail_the_run() -> None:
    plan = one_knob_plan()
    run = run_what_if(plan, "short", plan.baseline.model_copy(update={"max_model_len": 2048}), 0)
    assert run.status == "failed" and "max_model_len 2048" in run.failure


def test_other_backends_preview_on_the_default_profile() -> None:
    plan = one_knob_plan(backend=CommandBackend(), window_s=5, warmup_s=1)
    run = run_what_if(plan, "baseline", plan.baseline, 0)
    assert run.status == "ok" and run.server.kv_capacity_tokens > 400_000


def test_a_real_servers_plan_previews_with_the_profile_its_backend_names(tmp_path) -> None:
    # a calibrated profile of another device: the tiny one's numbers on 128-token CPU blocks, 1.5x its step cost
    tiny = load_profile("tiny")
    calibrated = tiny.model_copy(update={"name": "calibrated", "device": "cpu",
                                         "step_overhead_s": tiny.step_overhead_s * 1.5})
    path = tmp_path / "calibrated.yaml"
    path.write_text(yaml.safe_dump(calibrated.model_dump(mode="json")))
    plan = one_knob_plan(backend=CommandBackend(profile=str(path)), window_s=5, warmup_s=1,
                         workload={"input_tokens": 256, "output_tokens": 64, "seed": 1,
                                   "load": {"mode": "concurrency", "concurrency": 4}},
                         baseline={"model": "m", "max_model_len": 1024})
    run = run_what_if(plan, "baseline", plan.baseline, 0)
    assert run.status == "ok"
    assert run.reported.block_size == 128
    assert "--profile" in run.command_line and str(path) in run.command_line
    assert run.reported.kv_capacity_tokens == Deployment(ServeConfig(model="m", max_model_len=1024,
                                                                     profile=str(path))).kv_plan.kv_cache_tokens


def prefix_plan(shared: dict | None) -> Plan:
    """One user at a time (each request after the last) with 528-token prompts; 256 of them shared."""
    workload = {"input_tokens": 528, "output_tokens": 8, "seed": 5,
                "load": {"mode": "concurrency", "concurrency": 1}}
    return one_knob_plan(workload={**workload, "shared_prefix": shared} if shared else workload,
                         warmup_s=0, window_s=5)


def prefix_cache_counts(plan: Plan) -> tuple[int, int, int]:
    """Requests sent, and the prefix cache's queried and hit tokens, in a what-if run of ``plan``'s baseline."""
    params = plan.baseline
    config = ServeConfig(model=params.model, max_model_len=params.max_model_len, profile=PROFILE)
    engine = Deployment(config).new_engine()
    run = simulate(plan.run_spec(), engine, repeat=0)
    return run.issued, engine.stats.prefix_cache_queries, engine.stats.prefix_cache_hits


def test_a_shared_prefix_plans_what_if_hits_the_cache_for_the_shared_tokens() -> None:
    sent, queries, hits = prefix_cache_counts(prefix_plan({"tokens": 256, "distinct": 2}))
    # as in the real run (tests/loadgen/test_shared_prefix.py): every prompt is queried once; each prefix is
    # computed by its first request, and every later request hits its prefix and nothing else
    assert sent > 20 and queries in (sent * 528, (sent - 1) * 528)  # the stop may cut one before it is scheduled
    assert hits == (queries // 528 - 2) * 256
    # the run's signals carry the same hits: the window starts at 0 and the first request of each prefix misses
    plan = prefix_plan({"tokens": 256, "distinct": 2})
    server = run_what_if(plan, "baseline", plan.baseline, 0).server
    assert server is not None and server.prefix_cache_hits == hits
    assert server.prefix_cache_queries is not None and queries - 528 <= server.prefix_cache_queries <= queries
    assert server.prefix_cache_hit_rate == pytest.approx(hits / server.prefix_cache_queries)


def test_unique_prompts_what_if_hits_nothing_and_a_shared_prefix_cuts_ttft() -> None:
    sent, queries, hits = prefix_cache_counts(prefix_plan(None))
    assert sent > 20 and queries >= (sent - 1) * 528 and hits == 0  # the real run's prompts share nothing either
    unique, shared = (run_what_if(prefix_plan(s), "baseline", prefix_plan(s).baseline, 0)
                      for s in (None, {"tokens": 256}))
    assert shared.client.ttft.mean < 0.75 * unique.client.ttft.mean
    assert unique.server is not None and unique.server.prefix_cache_hit_rate == 0.0


def test_goodput_counts_the_requests_within_both_slos() -> None:
    # the SLOs do not change the virtual run, so a bound at the median TTFT keeps about half of its requests
    plan = one_knob_plan(workload={"input_tokens": 512, "output_tokens": 64, "load": {"mode": "poisson", "rate": 8}},
                         warmup_s=2, window_s=10)
    loose = run_what_if(plan, "baseline", plan.baseline, 0)
    ttft_bound = float(sorted(loose.samples.ttft_s)[len(loose.samples.ttft_s) // 2])
    tpot_bound = float(max(loose.samples.tpot_s))  # every request's TPOT within: the TTFT bound decides
    tight = run_what_if(plan.model_copy(update={"slos": Slos(ttft_p99_s=ttft_bound, tpot_p99_s=tpot_bound)}),
                        "baseline", plan.baseline, 0)
    assert loose.client.good_completed == loose.client.completed  # the default SLOs: 2 s, 200 ms
    expected = sum(t <= ttft_bound for t in tight.samples.ttft_s)
    assert tight.client.good_completed == expected and 0 < expected < tight.client.completed
    assert tight.client.goodput_rps == pytest.approx(expected / tight.client.window_s)
