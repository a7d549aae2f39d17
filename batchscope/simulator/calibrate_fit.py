"""The fit behind `batchscope sim calibrate`: the step cost model's parameters from per-phase means.

Each phase's schedule is replayed on the virtual clock (``phase_steps``); the cost model's parameters are then
fitted to vLLM's measured means by non-negative least squares over the roofline's sides. The method:
docs/simulator.md, "The calibration fit".
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from batchscope.simulator.cost import StepCostModel
from batchscope.simulator.engine import EngineCore, SchedulerLimits, Step
from batchscope.simulator.frontend import FrontEnd
from batchscope.simulator.profile import Profile
from batchscope.simulator.virtual import ClosedLoop, run_timed

MAX_BRANCH_ROUNDS = 20
PREFILL_OUTPUT = 8  # the output length of the probe's prefill phases
# a rate the fit found no cost for (its term is zero): written as this, so the term stays zero in effect
UNBOUNDED_RATE = 1e30


@dataclass(frozen=True)
class ModelFacts:
    """The model's sizes the cost model multiplies by (from its config.json and the server's KV cache)."""

    matmul_params: float
    attention_flops_per_token_pair: float
    weight_bytes: int
    kv_bytes_per_token: int


@dataclass(frozen=True)
class Phase:
    """One probe load: ``users`` closed-loop users of ``prompt``-token prompts and ``output``-token outputs."""

    name: str
    users: int
    prompt: int
    output: int
    duration_s: float
    ramp_up_s: float = 0.0  # users start spread over this, as the load generator's do


@dataclass(frozen=True)
class Theta:
    """The fitted terms: seconds per step, per scheduled request, per FLOP and per byte read."""

    overhead_s: float
    per_request_s: float
    s_per_flop: float
    s_per_byte: float

    def as_array(self) -> np.ndarray:
        return np.array([self.overhead_s, self.per_request_s, self.s_per_flop, self.s_per_byte])


@dataclass
class PhaseSteps:
    """A phase's schedule on the virtual clock: per step (requests, new tokens, pairs, KV tokens read) and the
    number of prefill-time and ITL observations each step's duration enters."""

    batch: np.ndarray  # (steps, 4)
    prefill_weight: np.ndarray  # prefill times whose span holds the step
    itl_weight: np.ndarray  # decoding requests in the step
    prefills: int  # prefill times observed

    def weights(self, figure: str) -> tuple[np.ndarray, float]:
        """A figure's per-step weights and its number of observations: its mean is weights @ costs / number."""
        if figure == "prefill":
            return self.prefill_weight, float(self.prefills)
        return self.itl_weight, float(self.itl_weight.sum())

    def mean(self, costs: np.ndarray, figure: str) -> float | None:
        weight, count = self.weights(figure)
        return float(weight @ costs / count) if count else None


class _RecordingCost(StepCostModel):
    """The profile's step cost, keeping every priced batch's features."""

    def __init__(self, profile: Profile) -> None:
        super().__init__(profile)
        self.rows: list[tuple[float, float, float, float]] = []

    def step_seconds(self, new_tokens: np.ndarray, context: np.ndarray) -> float:
        pairs = float((new_tokens * (context + (new_tokens + 1) / 2.0)).sum())
        self.rows.append((float(new_tokens.size), float(new_tokens.sum()), pairs, float((context + new_tokens).sum())))
        return super().step_seconds(new_tokens, context)


@dataclass
class _Observer:
    """Per step: which requests decode (an ITL each) and which prefills end (a prefill time over their steps)."""

    itl: list[int] = field(default_factory=list)
    prefill_spans: list[tuple[int, int]] = field(default_factory=list)
    started: dict[int, int] = field(default_factory=dict)  # slot in prefill -> its first step

    def __call__(self, engine: EngineCore, step: Step) -> None:
        index = len(self.itl)
        computed = engine.slots.num_computed[step.slots]
        prompt = engine.slots.prompt_len[step.slots]
        self.itl.append(int((computed >= prompt).sum()))
        for slot, done, new, length in zip(step.slots.tolist(), computed.tolist(), step.new_tokens.tolist(),
                                           prompt.tolist(), strict=True):
            if done >= length:
                continue
            first = self.started.setdefault(slot, index)
            if done + new >= length:
                self.prefill_spans.append((first, index))
                del self.started[slot]


def fitted_figures(phase: Phase) -> tuple[str, ...]:
    """With many users the ITL only (a prefill time depends on which requests share its step, unknown to the replay);
    not the ITL of 8-token outputs (steps pay the API server's work for requests ending: 3.3 ms vs 1.9 ms here)."""
    return ("prefill",) if phase.output == PREFILL_OUTPUT else ("prefill", "itl") if phase.users == 1 else ("itl",)


def phase_steps(phase: Phase, profile: Profile, limits: SchedulerLimits, enable_prefix_caching: bool) -> PhaseSteps:
    """Replay ``phase`` on the virtual clock with ``profile``'s costs and record its schedule."""
    cost = _RecordingCost(profile)
    engine = EngineCore(limits, cost, 0.0, enable_prefix_caching=enable_prefix_caching,
                        frontend=FrontEnd.of(profile))
    observer = _Observer()
    users = ClosedLoop(phase.users, phase.prompt, phase.output, ramp_up_s=phase.ramp_up_s,
                       issue_until=phase.duration_s)
    run_timed(engine, users, phase.duration_s, on_step=observer)
    steps = len(observer.itl)
    prefill = np.zeros(steps + 1)
    for first, last in observer.prefill_spans:  # a prefill time spans every step from its first to its last
        prefill[first] += 1
        prefill[last + 1] -= 1
    return PhaseSteps(np.array(cost.rows[:steps]).reshape(steps, 4), np.cumsum(prefill)[:steps],
                      np.array(observer.itl, dtype=float), len(observer.prefill_spans))


def step_costs(theta: Theta, facts: ModelFacts, batch: np.ndarray) -> np.ndarray:
    """batchscope/simulator/cost.py's step time for every row of ``batch``, with ``theta``'s rates."""
    return _design(theta, facts, batch) @ theta.as_array()


def _design(theta: Theta, facts: ModelFacts, batch: np.ndarray) -> np.ndarray:
    """Rows (1, requests, FLOPs on the compute side of the max terms, bytes on the memory side), the sides
    chosen by ``theta``: the cost is this times theta's array."""
    requests, tokens, pairs, kv_tokens = batch.T
    linear_flops, weight_bytes = 2.0 * facts.matmul_params * tokens, np.full(len(batch), float(facts.weight_bytes))
    attention_flops, kv_bytes = facts.attention_flops_per_token_pair * pairs, facts.kv_bytes_per_token * kv_tokens
    linear_compute = linear_flops * theta.s_per_flop >= weight_bytes * theta.s_per_byte
    attention_compute = attention_flops * theta.s_per_flop >= kv_bytes * theta.s_per_byte
    flops = np.where(linear_compute, linear_flops, 0.0) + np.where(attention_compute, attention_flops, 0.0)
    bytes_read = np.where(linear_compute, 0.0, weight_bytes) + np.where(attention_compute, 0.0, kv_bytes)
    return np.column_stack((np.ones(len(batch)), requests, flops, bytes_read))


@dataclass(frozen=True)
class Observation:
    """A measured phase mean (vLLM's histogram over the phase) and the phase's schedule."""

    phase: str
    figure: str  # "prefill" (request_prefill_time_seconds) or "itl" (inter_token_latency_seconds)
    measured_s: float
    steps: PhaseSteps


def predicted(theta: Theta, facts: ModelFacts, observation: Observation) -> float:
    value = observation.steps.mean(step_costs(theta, facts, observation.steps.batch), observation.figure)
    return math.nan if value is None else value


def fit(observations: list[Observation], facts: ModelFacts) -> Theta:
    """The terms minimising the squared relative errors of every observation, each term >= 0."""
    starts = [Theta(0.0, 0.0, 1.0, 0.0), Theta(0.0, 0.0, 0.0, 1.0), Theta(0.0, 0.0, 1e-12, 1e-9)]
    fits = [_fit_from(start, observations, facts) for start in starts]
    return min(fits, key=lambda theta: _loss(theta, observations, facts))


def _fit_from(theta: Theta, observations: list[Observation], facts: ModelFacts) -> Theta:
    for _ in range(MAX_BRANCH_ROUNDS):
        rows = []
        for obs in observations:
            weight, count = obs.steps.weights(obs.figure)
            rows.append(weight @ _design(theta, facts, obs.steps.batch) / count / obs.measured_s)
        following = Theta(*nnls(np.array(rows), np.ones(len(rows))))
        if following == theta:
            break
        theta = following
    return theta


def _loss(theta: Theta, observations: list[Observation], facts: ModelFacts) -> float:
    return sum((predicted(theta, facts, obs) / obs.measured_s - 1.0) ** 2 for obs in observations)


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a few columns: the best of the unconstrained fits on every subset of them
    whose coefficients are all >= 0 (exact, since the optimum is one of them)."""
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0  # columns of FLOPs and of ones side by side: solve in units of each column's largest
    a = a / scale
    best, best_error = np.zeros(a.shape[1]), float(b @ b)
    for size in range(1, a.shape[1] + 1):
        for columns in itertools.combinations(range(a.shape[1]), size):
            coefficients = np.linalg.lstsq(a[:, list(columns)], b, rcond=None)[0]
            if (coefficients < 0).any():
                continue
            error = float(np.sum((a[:, list(columns)] @ coefficients - b) ** 2))
            if error < best_error - 1e-15:
                best = np.zeros(a.shape[1])
                best[list(columns)] = coefficients
                best_error = error
    return best / scale


def rate(seconds_per_unit: float) -> float:
    """FLOP/s or bytes/s from the fitted seconds per unit (a zero term: a rate that makes it vanish)."""
    return UNBOUNDED_RATE if seconds_per_unit <= 0 else 1.0 / seconds_per_unit
