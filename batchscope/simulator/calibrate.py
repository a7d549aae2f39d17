"""`batchscope sim calibrate --url URL`: probe a running vLLM and write a simulator profile fitted to it.

``design`` chooses the probe's phases, each run as a `batchscope load` subprocess while vLLM's histograms are read
before and after it; the fit is calibrate_fit's. A noisy server or a poor fit is refused in one line, with
nothing written. The phases and the refusal rules: docs/simulator.md, "The calibration probe".
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import requests
import yaml

from batchscope.inputs.validation import read_input_text
from batchscope.simulator.calibrate_fit import (
    PREFILL_OUTPUT,
    ModelFacts,
    Observation,
    Phase,
    PhaseSteps,
    Theta,
    fit,
    fitted_figures,
    nnls,
    phase_steps,
    predicted,
    rate,
)
from batchscope.simulator.engine import SchedulerLimits
from batchscope.simulator.histogram_deltas import histogram_means, sample_delta
from batchscope.simulator.profile import Calibration, Profile, Residual
from batchscope.vllm import catalogue, scrape
from batchscope.wire.bounded_read import METRICS_MAX_BYTES, BodyTooLarge, FetchTimeout, fetch

NOISE_LIMIT = 0.15  # default of both judges: the repeated phase's move, the RMS of the fit's relative errors
MIN_PHASE_S = 2.0
REPLAY_ROUNDS = 6  # fit, replay the phases with the fit's step times, fit again: until the terms move < 0.5%
DECODE_OUTPUT = 256  # long, as served requests are: a step among short requests pays their API-server work
HTTP_TIMEOUT_S = 10.0
_SESSION = requests.Session()  # one connection to the probed server across the phases' reads
IDLE_DEADLINE_S = 60.0
LOAD_GRACE_S = 120.0  # a phase's `batchscope load` may take this long beyond its duration (start-up, its end)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
FIGURES = {"prefill": catalogue.REQUEST_PREFILL_TIME.name, "itl": catalogue.INTER_TOKEN_LATENCY.name,
           "queue": catalogue.REQUEST_QUEUE_TIME.name, "ttft": catalogue.TIME_TO_FIRST_TOKEN.name}


class CalibrationError(Exception):
    """The probe cannot produce a profile; the message is the one line the command prints."""


@dataclass(frozen=True)
class Server:
    """What the server says about itself, and the knobs it cannot say (from the command line)."""

    url: str
    model: str
    root: str
    version: str
    max_model_len: int
    block_size: int
    num_gpu_blocks: int
    gpu_memory_utilization: float
    enable_prefix_caching: bool
    kv_cache_memory_bytes: int | None
    max_num_seqs: int
    max_num_batched_tokens: int

    def limits(self) -> SchedulerLimits:
        return SchedulerLimits(self.max_num_seqs, self.max_num_batched_tokens, self.max_model_len, self.block_size,
                               self.num_gpu_blocks)


@dataclass(frozen=True)
class Reply:
    """A peer's answer, read whole within HTTP_TIMEOUT_S and METRICS_MAX_BYTES (an error's body is not kept)."""

    status_code: int
    text: str

    def json(self):
        return json.loads(self.text)


def _get(url: str, path: str) -> Reply:
    try:
        body = fetch(_SESSION, url.rstrip("/") + path, deadline=time.monotonic() + HTTP_TIMEOUT_S,
                     max_bytes=METRICS_MAX_BYTES)
    except requests.HTTPError as exc:
        return Reply(exc.response.status_code if exc.response is not None else 0, "")
    except (requests.RequestException, FetchTimeout, BodyTooLarge) as exc:
        raise CalibrationError(f"--url: cannot reach {url} ({type(exc).__name__})") from None
    return Reply(200, body.text())


def read_server(url: str, max_num_seqs: int, max_num_batched_tokens: int) -> Server:
    """The server's model, version and KV cache, from /v1/models, /version and vllm:cache_config_info."""
    models = _get(url, "/v1/models")
    if models.status_code == 401:
        raise CalibrationError(f"--url: {url} wants an API key (HTTP 401); calibrate a server without one")
    metrics = _get(url, "/metrics")
    info = scrape.info_labels(metrics.text, catalogue.CACHE_CONFIG_INFO.name) if metrics.status_code == 200 else None
    version = _get(url, "/version")
    if models.status_code != 200 or info is None or version.status_code != 200:
        raise CalibrationError(f"--url: {url} is not vLLM (no /v1/models, /version or "
                               f"{catalogue.CACHE_CONFIG_INFO.name})")
    first = models.json()["data"][0]
    kv_bytes = info.get("kv_cache_memory_bytes")
    return Server(url=url, model=first["id"], root=first.get("root") or first["id"],
                  version=version.json().get("version", "unknown"), max_model_len=int(first["max_model_len"]),
                  block_size=int(info["block_size"]), num_gpu_blocks=int(info["num_gpu_blocks"]),
                  gpu_memory_utilization=float(info["gpu_memory_utilization"]),
                  enable_prefix_caching=info.get("enable_prefix_caching") == "True",
                  kv_cache_memory_bytes=int(kv_bytes) if kv_bytes and kv_bytes.isdigit() else None,
                  max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)


def read_model_config(path: str) -> dict:
    """The model's config.json (``path`` is the file or the model's folder)."""
    file = Path(path)
    file = file / "config.json" if file.is_dir() else file
    try:
        return json.loads(read_input_text(file))
    except (OSError, ValueError) as exc:  # ValueError: not JSON, not UTF-8
        raise CalibrationError(f"--model-config: cannot read the model's config.json at {file} ({exc}); pass "
                               f"--model-config FILE") from None


def model_facts(config: dict, kv_cache_memory_bytes: int | None, kv_tokens: int) -> ModelFacts:
    """A decoder's sizes from its Hugging Face config (Llama layout: q/k/v/o, gated MLP, an LM head)."""
    try:
        hidden, layers, heads = config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]
        inter, vocab = config["intermediate_size"], config["vocab_size"]
    except KeyError as exc:
        raise CalibrationError(f"--model-config: no {exc.args[0]} in the model's config.json") from None
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    dtype = config.get("dtype") or config.get("torch_dtype") or "bfloat16"
    width = DTYPE_BYTES.get(dtype, 2)
    per_layer = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 3 * hidden * inter
    matmul = layers * per_layer + vocab * hidden  # the LM head is a matmul; the input embedding is a lookup
    weights = (matmul + (0 if config.get("tie_word_embeddings") else vocab * hidden)) * width
    # the server's own figure where it gives one (vLLM 0.32's kv_cache_memory_bytes), else K and V per layer
    kv_per_token = (kv_cache_memory_bytes // kv_tokens if kv_cache_memory_bytes
                    else 2 * layers * kv_heads * head_dim * width)
    return ModelFacts(float(matmul), float(4 * layers * heads * head_dim), int(weights), int(kv_per_token))


def design(server: Server, budget_s: float) -> list[Phase]:
    """The probe's phases for this server's limits, sharing ``budget_s`` seconds of load (MIN_PHASE_S each at
    least); the first is the warm-up, the last repeats the first single-user phase."""
    seqs = server.max_num_seqs
    longest = min(server.max_model_len - PREFILL_OUTPUT, server.max_num_batched_tokens)
    short = max(16, longest // 16)
    decode_output = min(DECODE_OUTPUT, server.max_model_len - short)
    # the long-context decode keeps every sequence's blocks in the cache (no preemption during the probe)
    long_prompt = min(longest // 2, server.max_model_len - decode_output)
    long_users = max(1, min(seqs, (server.num_gpu_blocks - 1) * server.block_size // (long_prompt + decode_output)))
    shapes = [(seqs, short, decode_output),  # warm-up
              (1, longest // 2, PREFILL_OUTPUT), (1, max(16, longest // 8), PREFILL_OUTPUT),
              (1, longest, PREFILL_OUTPUT),
              (min(2, seqs), short, decode_output), (max(1, seqs // 2), short, decode_output),
              (seqs, short, decode_output), (long_users, long_prompt, decode_output),
              (1, longest // 2, PREFILL_OUTPUT)]
    each = max(MIN_PHASE_S, budget_s / len(shapes))
    names = ["warmup"] + [f"c{u}-p{p}-o{o}" for u, p, o in shapes[1:-1]] + ["repeat"]
    return [Phase(name, users, prompt, output, each)
            for name, (users, prompt, output) in zip(names, shapes, strict=True)]


@dataclass
class Measured:
    """One phase's means from vLLM's histograms (None: no observation) and the client's mean TTFT."""

    phase: Phase
    means: dict[str, float | None]
    client_ttft_s: float | None


def run_phase(server: Server, phase: Phase, workdir: Path, seed: int) -> Measured:
    """Run ``phase`` with `batchscope load` and read vLLM's histograms over it (the server idle before and after)."""
    wait_idle(server.url)
    before = scrape.sample_sums(_get(server.url, "/metrics").text)
    out = workdir / phase.name
    spec = {"model": server.model, "endpoint": "completions", "input_tokens": phase.prompt,
            "output_tokens": phase.output, "stream": True, "timeout_s": 60, "seed": seed, "warmup_s": 0,
            "duration_s": phase.duration_s,
            "load": {"mode": "concurrency", "concurrency": phase.users, "ramp_up_s": phase.ramp_up_s}}
    spec_path = workdir / f"{phase.name}.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    argv = [sys.executable, "-m", "batchscope.cli", "load", "--spec", str(spec_path), "--host", server.url,
            "--out", str(out), "--metrics-port", "0"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=phase.duration_s + LOAD_GRACE_S)
    except subprocess.TimeoutExpired:
        raise CalibrationError(f"probe phase {phase.name}: the load did not end in time") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise CalibrationError(f"probe phase {phase.name}: batchscope load failed ({last})")
    wait_idle(server.url)
    means = phase_means(before, scrape.sample_sums(_get(server.url, "/metrics").text))
    summary = json.loads((out / "summary.json").read_text())
    return Measured(phase, means, summary["ttft"]["mean"])


def phase_means(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """A phase's means from /metrics read before and after it (``sample_sums``); the ITL per decoded token, not per
    observation: vLLM observes one per output message, and its engine core sends the tokens of several steps in
    one message when it falls behind (1.05-1.6 steps a message on the CPU build here)."""
    delta = sample_delta(before, after)
    means = histogram_means(delta, FIGURES)
    decoded = (delta.get(catalogue.GENERATION_TOKENS.exposed_name, 0)
               - delta.get(catalogue.TIME_TO_FIRST_TOKEN.sample("_count"), 0))
    if means["itl"] is not None and decoded > 0:
        means["itl"] = delta[FIGURES["itl"] + "_sum"] / decoded
    return means


def wait_idle(url: str) -> None:
    """Poll until no request is running or waiting (a phase's cut requests end after its load does)."""
    deadline = time.monotonic() + IDLE_DEADLINE_S
    while time.monotonic() < deadline:
        values = scrape.sample_sums(_get(url, "/metrics").text)
        in_flight = (values.get(catalogue.NUM_REQUESTS_RUNNING.name, 0.0)
                     + values.get(catalogue.NUM_REQUESTS_WAITING.name, 0.0))
        if in_flight == 0:
            return
        time.sleep(0.1)  # polling interval, bounded by the deadline
    raise CalibrationError(f"--url: {url} kept requests running for {IDLE_DEADLINE_S:g} s: is another load on it?")


def base_profile(server: Server, config: dict, facts: ModelFacts, theta: Theta,
                 frontend: tuple[float, float, float]) -> Profile:
    """A profile of ``server`` with ``theta``'s costs: its memory sized so the simulator's KV plan gives the
    server's block count at its gpu_memory_utilization (no activation growth is measured)."""
    kv_bytes = server.num_gpu_blocks * server.block_size * facts.kv_bytes_per_token
    half_block = server.block_size * facts.kv_bytes_per_token // 2  # int() rounding in the plan never loses a block
    return Profile(
        name=f"calibrated-{Path(server.model).name}",
        description=f"Fitted by batchscope sim calibrate to {server.model} on vLLM {server.version}. peak_flops and "
                    f"memory_bandwidth are the achieved rates (efficiencies 1).",
        device="cuda" if server.block_size == 16 else "cpu",
        max_model_len=int(config.get("max_position_embeddings") or server.max_model_len),
        vocab_size=int(config["vocab_size"]),
        gpu_memory_bytes=math.ceil((kv_bytes + facts.weight_bytes + half_block) / server.gpu_memory_utilization),
        weight_bytes=facts.weight_bytes, non_torch_bytes=0, activation_base_bytes=0,
        activation_bytes_per_batched_token=0.0, kv_bytes_per_token=facts.kv_bytes_per_token,
        matmul_params=facts.matmul_params, attention_flops_per_token_pair=facts.attention_flops_per_token_pair,
        peak_flops=rate(theta.s_per_flop), memory_bandwidth=rate(theta.s_per_byte), compute_efficiency=1.0,
        bandwidth_efficiency=1.0, step_overhead_s=theta.overhead_s, step_per_request_s=theta.per_request_s,
        frontend_request_s=frontend[0], frontend_input_token_s=frontend[1], frontend_output_s=frontend[2],
        eos_probability=0.0)


def fit_frontend(measured: list[Measured]) -> tuple[float, float, float]:
    """The front end's input path (fixed, per prompt token) and output path: the single-user phases' client TTFT
    outside vLLM's queue and prefill times, against prompt length; of it, the output path is the part inside vLLM's
    own TTFT (the hops between its processes: vLLM stamps a request's arrival after its input path)."""
    rows, gaps, inside = [], [], []
    for m in measured:
        if m.phase.output == PREFILL_OUTPUT and m.client_ttft_s is not None and m.means["prefill"] is not None:
            engine = m.means["prefill"] + (m.means["queue"] or 0.0)
            rows.append([1.0, float(m.phase.prompt)])
            gaps.append(m.client_ttft_s - engine)
            inside.append(max(0.0, (m.means.get("ttft") or engine) - engine))
    if not rows:
        return 0.0, 0.0, 0.0
    fixed, per_token = nnls(np.array(rows), np.array(gaps))
    output = min(float(np.mean(inside)), float(fixed))
    return float(fixed) - output, float(per_token), output


def probe(server: Server, budget_s: float, seed: int, progress: Callable[[str], None] = lambda line: None
          ) -> list[Measured]:
    """Run the probe's phases on ``server`` (``design``), the multi-user ones staggered by the first single-user
    phase's ITL."""
    measured: list[Measured] = []
    phases = design(server, budget_s)
    with tempfile.TemporaryDirectory(prefix="batchscope-calibrate-") as folder:
        for index, phase in enumerate(phases):
            if phase.users > 1 and len(measured) > 1:
                phase = replace(phase, ramp_up_s=stagger(phase, measured[1]))
            progress(f"phase {phase.name}: {phase.users} users, {phase.prompt} + {phase.output} tokens, "
                     f"{phase.duration_s:g} s")
            # a seed per phase: prompts one phase sent would hit the prefix cache in the next
            measured.append(run_phase(server, phase, Path(folder), seed * len(phases) + index))
    return measured


def fit_profile(server: Server, config: dict, budget_s: float, measured: list[Measured],
                noise_limit: float = NOISE_LIMIT) -> Profile:
    """The profile fitted to a probe's phases (warm-up first, repeat last) with its calibration record;
    CalibrationError when the server's timing was too noisy or the fit misses (the module docstring's rule)."""
    facts = model_facts(config, server.kv_cache_memory_bytes, server.num_gpu_blocks * server.block_size)
    fitted, repeat = measured[1:-1], measured[-1]
    drift = repeat_drift(fitted[0], repeat)
    if drift > noise_limit:
        raise CalibrationError(f"too noisy to fit: phase {fitted[0].phase.name} moved {drift:.0%} between its two "
                               f"runs (limit {noise_limit:.0%}); calibrate when the server's host is quieter")
    frontend = fit_frontend(fitted)
    itl_1 = fitted[0].means["itl"] or fitted[0].means["prefill"] or 1e-3
    theta = Theta(itl_1, 0.0, 0.0, 0.0)  # a first schedule's step times; the fit's own replace it
    for _ in range(REPLAY_ROUNDS):  # the replayed schedule depends on the step times: replay with the fit's
        observations = observe(fitted, base_profile(server, config, facts, theta, frontend), server)
        previous, theta = theta, fit(observations, facts)
        if np.allclose(theta.as_array(), previous.as_array(), rtol=0.005, atol=0.0):
            break
    residuals = [Residual(phase=o.phase, figure=o.figure, measured_s=o.measured_s,
                          predicted_s=predicted(theta, facts, o), error=predicted(theta, facts, o) / o.measured_s - 1)
                 for o in observations]
    rms = math.sqrt(sum(r.error ** 2 for r in residuals) / len(residuals))
    if rms > noise_limit:
        worst = max(residuals, key=lambda r: abs(r.error))
        raise CalibrationError(f"too noisy to fit: the fitted model misses vLLM's figures by {rms:.0%} RMS (limit "
                               f"{noise_limit:.0%}; worst {worst.phase} {worst.figure} {worst.error:+.0%})")
    profile = base_profile(server, config, facts, theta, frontend)
    profile.calibration = Calibration(
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"), conditions=conditions(server), budget_s=budget_s,
        residuals=residuals, rms_error=rms, repeat_drift=drift, noise_limit=noise_limit)
    return profile


def stagger(phase: Phase, single: Measured) -> float:
    """Users started over about one request's time at one user: started together, same-length requests would
    prefill in the same steps for ever in the replay, and drift apart on the server."""
    itl = single.means["itl"] or 0.0
    return min(phase.duration_s / 2, phase.output * itl)


def observe(measured: list[Measured], profile: Profile, server: Server) -> list[Observation]:
    """The fitted figures: each phase's prefill and ITL means with the phase's schedule replayed on ``profile``."""
    observations = []
    for m in measured:
        steps: PhaseSteps = phase_steps(m.phase, profile, server.limits(), server.enable_prefix_caching)
        for figure in fitted_figures(m.phase):
            value = m.means[figure]
            if value and steps.mean(steps.batch[:, 0], figure) is not None:
                observations.append(Observation(m.phase.name, figure, value, steps))
    if not observations:
        raise CalibrationError("the probe measured nothing to fit (no prefill or inter-token latency observed)")
    return observations


def repeat_drift(first: Measured, again: Measured) -> float:
    """The largest relative change of a figure between a phase's two runs."""
    changes = []
    for figure in ("prefill", "itl"):
        before, after = first.means[figure], again.means[figure]
        if before and after:
            changes.append(abs(after / before - 1))
    return max(changes, default=math.inf)


def conditions(server: Server) -> dict[str, str | int | float | bool | None]:
    """The calibration's conditions: what a profile is only good for."""
    return {"model": server.model, "vllm_version": server.version, "max_num_seqs": server.max_num_seqs,
            "max_num_batched_tokens": server.max_num_batched_tokens, "max_model_len": server.max_model_len,
            "block_size": server.block_size, "num_gpu_blocks": server.num_gpu_blocks,
            "gpu_memory_utilization": server.gpu_memory_utilization,
            "enable_prefix_caching": server.enable_prefix_caching,
            "hardware": None}  # vLLM's API names no device; the operator's note belongs in the description


def write_profile(profile: Profile, path: Path) -> None:
    path.write_text(yaml.safe_dump(profile.model_dump(mode="json"), sort_keys=False))
