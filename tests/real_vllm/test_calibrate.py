"""`batchscope sim calibrate` against a real vLLM, then what-if previews of settings it never measured against real
runs of them.

The calibration is a fresh server (max_num_seqs 8, max_num_batched_tokens 1024, 1 GiB of KV cache), probed for
45 s of load. The workload: 4 users of 256 + 256 tokens. Held out: max_num_seqs 2 (half the users queue),
max_num_batched_tokens 64 (each prompt prefilled in 4 chunks) and a 10-block cache (9 usable blocks of 128: three
users are admitted on 3 blocks each and outgrow them, so vLLM preempts). Each held-out setting is one real run on a
server of its own.

How the CPU's timing noise is kept out, and how much is left:
- Contention, kept out. Every server here has its cores split (VllmServer.split_cores): the engine core and worker
  on the core vLLM bound its worker to, the API server and our load generator on the other, as a GPU host runs
  them. Unsplit, the engine side's busy polling held 1.8 of the 2 cores, the API server starved, tokens came in
  bursts (up to 68% of requests got all their tokens in one read), users sat idle (1.0-2.9 of 4 in flight) and no
  preview could be judged: issue 23's earlier runs, where only throughput could be bounded and it missed by up
  to +107%.
- Drift, measured. This machine's speed still moves by tens of percent over minutes (a shared host: the same load
  on the same idle server ran 30% slower a minute later), and one setting's runs on two fresh servers moved 25%
  while the baseline's repeats held within 3%. So every setting runs twice, in two rounds (each held-out setting,
  then the baseline again), each run on a server of its own, the two runs of a setting minutes apart; a preview is
  judged against the mean of its setting's two runs. Three figures of noise, per figure: the larger spread of the
  baseline's two repeats against its first run (on the calibrated server, right after the calibration); how far
  the setting's own two runs were apart; and the host's drift, from one user alone on each server
  (``host_speed``: a one-request decode, which no held-out knob changes), its TPOT against the calibrated
  server's. A preview's error (predicted / measured - 1) must be within the goal (15%) plus twice the largest of
  the three, for the client's TTFT, TPOT and output throughput and for vLLM's own mean TTFT and time per output
  token (over the run, its pre-flight left out: ``when_users_are_on``).
- A knob's direction is asserted for every figure the real runs moved by more than twice the noise (preemptions:
  counts, always), and must be the preview's too.
Each real run also records the share of requests whose tokens all reached the client in one read ("stalled") and
the client's mean requests in flight over the window; a run that kept under 90% of its users in flight is run once
more, and must not do so twice. The figures are printed (pytest -s); the measured errors are in README.md
("Calibrating to your server") and issue 23's closing note.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from batchscope.loadgen.spec import WorkloadSpec
from batchscope.simulator.calibrate import wait_idle
from batchscope.simulator.frontend import FrontEnd
from batchscope.simulator.histogram_deltas import histogram_means, sample_delta
from batchscope.simulator.profile import load_profile
from batchscope.tuner.plan import Plan
from batchscope.tuner.whatif import run_what_if
from batchscope.vllm.scrape import sample_sums
from tests.real_vllm.support import SHARED_FLAGS, VllmServer, tier

# the calibration (45 s of load + 9 load generator starts), nine real runs and nine of one user, nine vLLM starts:
# ~8 min here; left out of `make test`, which is at 28 of CI's 30 minutes without it: `make test-calibration`
pytestmark = [pytest.mark.timeout(1500), pytest.mark.calibration]
BUDGET_S = 45
# this shared 2-core machine's drift: the probe's repeated phase moved 13%, 33% and 55% in three split-core probes
# (the fit's RMS error 5-9%); the default limit (15%) refuses such a probe, as it should on a real server
NOISE_LIMIT = 0.6
GOAL = 0.15
WORKLOAD = {"input_tokens": 256, "output_tokens": 256, "timeout_s": 60, "seed": 9101,
            "load": {"mode": "concurrency", "concurrency": 4, "ramp_up_s": 0.4}}
HELD_OUT = {"mns-2": {"max_num_seqs": 2}, "mnbt-64": {"max_num_batched_tokens": 64},
            "kv-10": {"num_gpu_blocks_override": 10}}
FIGURES = ("ttft", "tpot", "throughput")  # the client's means (the load generator's summary)
ENGINE = {"engine_ttft": "vllm:time_to_first_token_seconds",  # vLLM's own means over the same run
          "engine_tpot": "vllm:request_time_per_output_token_seconds"}
SHOWN = FIGURES + tuple(ENGINE)
START_DEADLINE_S = 60.0  # for a load's users to be on: its start-up and pre-flight took ~3 s here
# one user of short prompts, alone: the host's speed on each server (host_speed)
REFERENCE = {"input_tokens": 64, "output_tokens": 256, "seed": 9301, "warmup_s": 0.5, "duration_s": 3,
             "load": {"mode": "concurrency", "concurrency": 1}}
HELD = 0.9  # of the users' requests in flight over the window, at least, for a run to measure vLLM
# what each knob must move, and which way (+1 up, -1 down), in the preview as in the real runs
DIRECTIONS = {"mns-2": {"engine_ttft": +1, "throughput": -1}, "mnbt-64": {"engine_ttft": +1},
              "kv-10": {"preemptions": +1, "throughput": -1}}


def plan(profile: Path) -> Plan:
    return Plan.model_validate({
        "name": "held-out", "workload": WORKLOAD, "backend": {"kind": "command", "profile": str(profile)},
        "baseline": {"model": str(tier().model), "max_model_len": 1024, "max_num_seqs": 8,
                     "max_num_batched_tokens": 1024},
        "variations": [{"name": name, "set": knobs} for name, knobs in HELD_OUT.items()],
        "warmup_s": 2, "window_s": 6})


def calibrate(url: str, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "batchscope.cli", "sim", "calibrate", "--url", url,
                           "--max-num-seqs", "8", "--max-num-batched-tokens", "1024", "--budget-s", str(BUDGET_S),
                           "--noise-limit", str(NOISE_LIMIT), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)


def engine_means(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """vLLM's own means over a run (its histograms' deltas) and its preemptions."""
    delta = sample_delta(before, after)
    means = histogram_means(delta, ENGINE)
    assert None not in means.values(), f"vLLM observed nothing over the run: {means}"
    return {**means, "preemptions": delta["vllm:num_preemptions_total"]}


def real_run(server: VllmServer, the_plan: Plan, workdir: Path, seed: int) -> dict[str, float]:
    """The plan's workload on ``server`` with `batchscope load`: the summary's figures and vLLM's preemptions."""
    spec = the_plan.run_spec().model_copy(update={"seed": seed})
    out = workdir / f"load-{seed}-{server.port}"
    log_path = out.with_suffix(".log")
    with open(log_path, "wb") as log:
        load = subprocess.Popen(load_argv(server, spec, out), stdout=log, stderr=log)
        try:
            before = when_users_are_on(server, load)
            assert load.wait(timeout=180) == 0, log_path.read_text()[-2000:]
        finally:
            if load.poll() is None:
                load.kill()
    wait_idle(server.url)
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    # the API server's delivery stall: every token of a request reaching the client in one read
    stalled = [r for r in records if r.get("outcome") == "ok" and r["itl_s"] and not any(r["itl_s"])]
    return {"ttft": summary["ttft"]["mean"], "tpot": summary["tpot"]["mean"],
            "throughput": summary["output_tokens_per_s"], "stalled": len(stalled) / max(1, len(records)),
            "in_flight": in_flight(records, summary["window_start_s"], summary["effective_duration_s"]),
            **engine_means(before, sample_sums(server.metrics()))}


def load_argv(server: VllmServer, spec: WorkloadSpec, out: Path) -> list[str]:
    """`batchscope load` of ``spec`` on ``server``, writing into ``out`` (the spec beside it)."""
    spec_path = out.with_suffix(".yaml")
    spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude={"api_key"})))
    return [sys.executable, "-m", "batchscope.cli", "load", "--spec", str(spec_path), "--host", server.url, "--out",
            str(out), "--metrics-port", "0"]


def host_speed(server: VllmServer, the_plan: Plan, workdir: Path) -> float:
    """The client's mean TPOT of one user alone (REFERENCE): a decode step of one request, which no held-out knob
    changes, so its moves between servers are the host's."""
    spec = WorkloadSpec.model_validate({**the_plan.run_spec().model_dump(mode="json", exclude={"api_key"}),
                                        **REFERENCE})
    out = workdir / f"reference-{server.port}"
    done = subprocess.run(load_argv(server, spec, out), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    wait_idle(server.url)
    return json.loads((out / "summary.json").read_text())["tpot"]["mean"]


def when_users_are_on(server: VllmServer, load: subprocess.Popen) -> dict[str, float]:
    """vLLM's /metrics once two of the load's requests are on. The load generator's pre-flight probes the
    vocabulary with one-token completions, one at a time; vLLM counts them in its histograms (a TPOT of 0 each, a
    short TTFT): over a whole run they read vLLM's TPOT 10-15% low against this workload's client."""
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline and load.poll() is None:
        values = sample_sums(server.metrics())
        if values.get("vllm:num_requests_running", 0.0) + values.get("vllm:num_requests_waiting", 0.0) >= 2:
            return values
        time.sleep(0.05)  # polling interval, bounded by the deadline
    raise AssertionError(f"the load's users were not on within {START_DEADLINE_S:g} s (exit {load.poll()})")


def held_run(server: VllmServer, the_plan: Plan, workdir: Path, seed: int) -> dict[str, float]:
    """``real_run``, run again (once, fresh prompts) when the client did not keep its users' requests in flight:
    such a run measured the client and the API server, not vLLM's scheduling (see the docstring)."""
    run = real_run(server, the_plan, workdir, seed)
    if run["in_flight"] < HELD * WORKLOAD["load"]["concurrency"]:
        run = {**real_run(server, the_plan, workdir, seed + 100), "retried": 1.0}
    return run


def fresh_run(the_plan: Plan, flags: tuple[str, ...] | list[str], workdir: Path, seed: int) -> dict[str, float]:
    """``held_run`` on a server of its own, started with ``flags``, its cores split as the calibrated one's."""
    server = tier().start(workdir, *flags)
    try:
        with server.client_beside():
            return {**held_run(server, the_plan, workdir, seed), "host": host_speed(server, the_plan, workdir)}
    finally:
        server.stop()


def pooled(pair: list[dict[str, float]]) -> dict[str, float]:
    """A setting's two real runs as one: each figure's mean, and how far apart the two were (``spread_<figure>``:
    that setting's own noise). Users in flight: the lower; stalled requests: the higher."""
    first, second = pair
    means = {key: (first[key] + second[key]) / 2 for key in (*SHOWN, "preemptions", "host")}
    spreads = {f"spread_{f}": abs(first[f] / second[f] - 1) if second[f] else math.inf for f in SHOWN}
    retried = {"retried": 1.0} if "retried" in first or "retried" in second else {}
    return {**means, **spreads, **retried, "in_flight": min(first["in_flight"], second["in_flight"]),
            "stalled": max(first["stalled"], second["stalled"])}


def in_flight(records: list[dict], start: float, duration: float) -> float:
    """The client's mean requests in flight over the window (sent to end): a closed loop holds its users'."""
    end = start + duration
    return sum(max(0.0, min(r.get("end_s") or end, end) - max(r["sent_s"], start)) for r in records
               if r.get("sent_s")) / duration


def preview(the_plan: Plan, setting: str) -> dict[str, float]:
    params = dict(the_plan.settings())[setting]
    run = run_what_if(the_plan, setting, params, 0)
    assert run.status == "ok", run.failure
    frontend = FrontEnd.of(load_profile(str(the_plan.backend.profile)))
    return {"ttft": run.client.ttft.mean, "tpot": run.client.tpot.mean,
            "throughput": run.client.output_tokens_per_s, "preemptions": run.server.preemptions,
            # vLLM stamps a request's arrival once it is tokenized: its TTFT leaves out the input path's work
            "engine_ttft": (run.server.queue_time_mean_s or 0.0) + (run.server.prefill_time_mean_s or 0.0)
            + frontend.output_s,
            "engine_tpot": (run.server.decode_time_mean_s or 0.0) / (WORKLOAD["output_tokens"] - 1)}


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory) -> dict:
    """A fresh server calibrated, then the baseline measured on it right after (and the host's speed on it)."""
    workdir = tmp_path_factory.mktemp("calibrate")
    profile = workdir / "calibrated.yaml"
    the_plan = plan(profile)
    server = tier().start(workdir, *SHARED_FLAGS)  # fresh, as each held-out setting's
    try:
        with server.client_beside():
            done = calibrate(server.url, profile)
            assert done.returncode == 0, done.stderr[-3000:]
            baseline = {**held_run(server, the_plan, workdir, 9101), "host": host_speed(server, the_plan, workdir)}
    finally:
        server.stop()
    return {"workdir": workdir, "profile": profile, "plan": the_plan, "stderr": done.stderr, "baseline": baseline}


@pytest.fixture(scope="module")
def compared(calibrated) -> dict:
    workdir, the_plan = calibrated["workdir"], calibrated["plan"]
    measured = {"baseline": calibrated["baseline"]}
    held_out = [(name, params.flags()) for name, params in the_plan.settings() if name != "baseline"]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in held_out}
    repeats = []
    # two rounds, each setting then the baseline again, every run on a server of its own: a setting's two runs are
    # minutes apart, as the baseline's, and the drift over the test's span is in the noise the previews are judged by
    for seed in (9103, 9105):
        for name, flags in held_out:
            runs[name].append(fresh_run(the_plan, flags, workdir, seed))
        repeats.append(fresh_run(the_plan, SHARED_FLAGS, workdir, seed - 1))
    measured.update({name: pooled(pair) for name, pair in runs.items()})
    noise = {f: max(abs(repeat[f] / measured["baseline"][f] - 1) for repeat in repeats)
             if measured["baseline"][f] else math.inf for f in SHOWN}
    # each setting's host speed (its runs' mean) against the calibrated server's: a drift the baseline's repeats missed
    drift = {name: abs(run["host"] / measured["baseline"]["host"] - 1) for name, run in measured.items()}
    predicted = {name: preview(the_plan, name) for name, _ in the_plan.settings()}
    result = {"profile": calibrated["profile"], "stderr": calibrated["stderr"], "measured": measured,
              "predicted": predicted, "noise": noise, "drift": drift}
    _print(result)
    return result


def _print(result: dict) -> None:
    record = load_profile(str(result["profile"])).calibration
    assert record is not None
    print(f"\ncalibration: fit RMS error {record.rms_error:.1%}, repeated phase moved {record.repeat_drift:.1%}")
    print("CPU noise (baseline run three times): " + ", ".join(f"{f} {v:.1%}" for f, v in result["noise"].items()))
    for name, real in result["measured"].items():
        guess = result["predicted"][name]
        cells = [f"{f} {guess[f]:.4g}/{real[f]:.4g} ({_error(guess[f], real[f])})" for f in SHOWN]
        print(f"{name:9s} predicted/measured: " + "; ".join(cells)
              + f"; preemptions {guess['preemptions']:.0f}/{real['preemptions']:.0f}; stalled {real['stalled']:.0%}"
              + f"; in flight {real['in_flight']:.2f}; host drift {result['drift'][name]:.1%}"
              + ("".join(f"; {f} runs {real[f'spread_{f}']:.0%} apart" for f in SHOWN) if name != "baseline" else "")
              + (" (run again)" if "retried" in real else ""))


def _error(guess: float, real: float) -> str:
    return f"{guess / real - 1:+.1%}" if real else "measured 0"


def test_calibrating_a_server_writes_a_profile_of_it(compared):
    profile = load_profile(str(compared["profile"]))
    record = profile.calibration
    assert record is not None and record.rms_error <= NOISE_LIMIT and record.repeat_drift <= NOISE_LIMIT
    assert record.conditions["vllm_version"] == "0.32.0" and record.conditions["block_size"] == 128
    assert record.conditions["model"] == "tiny-llama" and record.conditions["max_num_seqs"] == 8
    assert profile.device == "cpu" and profile.vocab_size == tier().model_facts()["vocab_size"]
    # the KV cache vLLM sized (1 GiB of 512-byte tokens) is the one the profile plans
    assert profile.kv_bytes_per_token == 512
    assert "wrote" in compared["stderr"].splitlines()[-1]


@pytest.mark.parametrize("figure", SHOWN)
@pytest.mark.parametrize("setting", ["baseline", *HELD_OUT])
def test_the_preview_of_each_setting_is_within_the_goal_plus_the_measured_noise(compared, setting, figure):
    measured = compared["measured"][setting]
    real, guess = measured[figure], compared["predicted"][setting][figure]
    assert real > 0, measured
    noise = max(compared["noise"][figure], measured.get(f"spread_{figure}", 0.0), compared["drift"][setting])
    error, bound = guess / real - 1, GOAL + 2 * noise
    assert abs(error) <= bound, f"{setting} {figure}: predicted {guess:.4g}, measured {real:.4g}: {error:+.0%}, " \
                                f"bound {bound:.0%}"


@pytest.mark.parametrize("setting", list(HELD_OUT))
def test_every_knob_moves_its_figures_the_way_the_real_runs_do(compared, setting):
    base_real, base_guess = compared["measured"]["baseline"], compared["predicted"]["baseline"]
    real, guess = compared["measured"][setting], compared["predicted"][setting]
    for figure, sign in DIRECTIONS[setting].items():
        real_move, guess_move = real[figure] - base_real[figure], guess[figure] - base_guess[figure]
        noise = 2 * compared["noise"].get(figure, 0.0) * base_real[figure]
        if figure in compared["noise"] and abs(real_move) <= noise:
            continue  # the real runs moved it less than the machine's own noise: no direction to compare
        assert real_move * sign > 0, f"{setting}: the real runs did not move {figure} as expected ({real_move:+g})"
        assert guess_move * sign > 0, f"{setting}: the preview moved {figure} by {guess_move:+g}, real {real_move:+g}"



@pytest.mark.parametrize("setting", ["baseline", *HELD_OUT])
def test_each_real_run_kept_its_users_requests_in_flight(compared, setting):
    held, users = compared["measured"][setting]["in_flight"], WORKLOAD["load"]["concurrency"]
    assert held >= HELD * users, f"{setting}: {held:.2f} of {users} users' requests in flight over the window " \
                                 f"(twice): vLLM's API server held them (docstring); no preview can be judged on it"


# A Poisson load above capacity on a server that refuses past max_num_queued_reqs (its 8 running + 4 waiting): the
# share refused, real and previewed with the calibrated profile (docs/simulator.md, "Rejection share on a Poisson load")
QUEUE_CAP, RATE = 12, 6.0
POISSON = {"input_tokens": 128, "output_tokens": 128, "timeout_s": 60, "seed": 9401,
           "load": {"mode": "poisson", "rate": RATE, "max_in_flight": 400}}
SIGMAS = 3  # of the share's binomial sampling noise


def poisson_plan(profile: Path) -> Plan:
    return Plan.model_validate({
        "name": "poisson-over-a-queue-cap", "workload": POISSON,
        "backend": {"kind": "command", "profile": str(profile)},
        "baseline": {"model": str(tier().model), "max_model_len": 1024, "max_num_seqs": 8,
                     "max_num_batched_tokens": 1024, "max_num_queued_reqs": QUEUE_CAP},
        "warmup_s": 10, "window_s": 50})


@pytest.fixture(scope="module")
def poisson(calibrated) -> dict:
    workdir, the_plan = calibrated["workdir"], poisson_plan(calibrated["profile"])
    (name, params), = the_plan.settings()
    server = tier().start(workdir, *params.flags())
    try:
        with server.client_beside():
            out = workdir / "poisson"
            done = subprocess.run(load_argv(server, the_plan.run_spec(), out), capture_output=True, text=True,
                                  timeout=300)
            assert done.returncode == 0, done.stderr[-2000:]
            host = host_speed(server, the_plan, workdir)
    finally:
        server.stop()
    summary = json.loads((out / "summary.json").read_text())
    run = run_what_if(the_plan, name, params, 0)
    assert run.status == "ok" and run.client is not None, run.failure
    record = load_profile(str(calibrated["profile"])).calibration
    assert record is not None
    result = {"real": (summary["rejected_share"], summary["completed"] + sum(summary["failed"].values())
                       + sum(summary["admission_rejections"].values())),
              "preview": (run.client.rejected_share, run.client.completed + run.client.errors
                          + sum(run.client.rejected.values())),
              "offered_rate": summary["offered_rate_rps"], "rms_error": record.rms_error,
              "drift": abs(host / calibrated["baseline"]["host"] - 1)}
    print(f"\nPoisson at {RATE:g}/s over max_num_queued_reqs {QUEUE_CAP}: rejected share real {result['real'][0]:.3f} "
          f"of {result['real'][1]}, preview {result['preview'][0]:.3f} of {result['preview'][1]}; calibration RMS "
          f"error {record.rms_error:.1%}, host drift {result['drift']:.1%}, offered {result['offered_rate']}/s")
    return result


def test_a_poisson_load_over_the_queue_cap_is_refused_in_the_share_the_calibrated_preview_gives(poisson):
    (real, n), (guess, _) = poisson["real"], poisson["preview"]
    assert real is not None and guess is not None and 0 < real < 1, poisson
    # share = 1 - served / offered: a throughput error e moves it by (1 - share) x e (docs/simulator.md)
    tolerance = SIGMAS * math.sqrt(real * (1 - real) / n) + (1 - real) * (poisson["rms_error"] + poisson["drift"])
    assert abs(guess - real) <= tolerance, f"rejected share: preview {guess:.3f}, real {real:.3f} of {n}, " \
                                           f"tolerance {tolerance:.3f}"
