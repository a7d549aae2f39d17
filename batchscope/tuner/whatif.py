"""What-if runs: one setting of a plan on the simulator's virtual clock, recorded as a RunResult like a real run's.

The plan's workload and prompts, the engine of `batchscope sim serve` stepped from event to event; the client
figures folded through the load generator's own figures and window rule, the server signals the engine's
statistics over the window. Steps carry seeded lognormal noise (STEP_JITTER_CV) so repeats differ by seed. What
differs from a real run and why: docs/tuner.md (What-if runs).
"""

from __future__ import annotations

import functools
import math
import zlib
from dataclasses import dataclass, field

import numpy as np
from pydantic import ValidationError

from batchscope.inputs.secrets import mask_argv
from batchscope.loadgen import (
    ConcurrencyLoad,
    ExactGaps,
    MeasurementWindow,
    OfflineLoad,
    PoissonLoad,
    RequestRecord,
    RunFigures,
    WorkloadSpec,
    counted,
    draw_prompt,
    final_window,
    latencies,
    timed_elsewhere,
)
from batchscope.simulator import (
    VLLM_VERSION,
    ClosedLoop,
    Deployment,
    EngineCore,
    EngineStats,
    FixedArrivals,
    Profile,
    PromptIds,
    RequestSpec,
    ServeConfig,
    Step,
    StepCostModel,
    StepObserver,
    TimedResult,
    run_timed,
    validation_message,
)
from batchscope.simulator import RequestRecord as VirtualRecord
from batchscope.tuner.plan import Plan, ServingParams, SimulatorBackend, Slos
from batchscope.tuner.results import (
    ClientFigures,
    RequestSamples,
    RunResult,
    RunStart,
    ServerReport,
    ServerSignals,
    good_count,
    hit_rate,
    now_iso,
    samples_of,
)
from batchscope.vllm import admission
from batchscope.workload import poisson
from batchscope.workload.prompt_layout import ID_HIGH, ID_LOW, id_range, prompt_ids

DEFAULT_PROFILE = SimulatorBackend().profile
# Step-time noise of a what-if run: a step's duration's standard deviation over its mean (docs/tuner.md, What-if)
STEP_JITTER_CV = 0.03


class JitteredCost(StepCostModel):
    """The profile's step cost times a seeded lognormal factor of mean 1 and CV STEP_JITTER_CV, one per step."""

    SIGMA = math.sqrt(math.log1p(STEP_JITTER_CV ** 2))

    def __init__(self, profile: Profile, rng: np.random.Generator):
        super().__init__(profile)
        self._rng = rng

    def step_seconds(self, new_tokens: np.ndarray, context: np.ndarray) -> float:
        factor = self._rng.lognormal(-self.SIGMA ** 2 / 2, self.SIGMA)  # mean exp(mu + sigma^2 / 2) = 1
        return super().step_seconds(new_tokens, context) * float(factor)


def run_what_if(plan: Plan, setting: str, params: ServingParams, repeat: int,
                on_step: StepObserver | None = None) -> RunResult:
    """Run one setting of ``plan`` on the virtual clock; a configuration the simulator refuses is a failed run.
    ``on_step`` sees every step too (run_timed's observer), after the window's own."""
    spec = plan.run_spec()
    started = now_iso()
    profile, seed = _profile_and_seed(plan)
    command = mask_argv(["batchscope", "sim", "serve", params.model, *params.flags(), "--profile", profile,
                         "--seed", str(seed)])
    base = RunStart(plan=plan.name, setting=setting, repeat=repeat, mode="what-if", params=params, conditions=spec,
                    command_line=command, started_at=started)
    try:
        deployment = _deployment(params, profile, seed)
    except ValueError as exc:  # ValidationError is a ValueError too
        line = validation_message(exc) if isinstance(exc, ValidationError) else str(exc)
        return RunResult(**base, finished_at=now_iso(), status="failed", failure=f"server refused: {line}")
    base["reported"] = _reported(deployment)
    too_long = spec.input_tokens + spec.output_tokens > deployment.max_model_len
    if too_long:
        # vLLM answers 400 to every request, and the load generator's run fails with that answer
        return RunResult(**base, finished_at=now_iso(), status="failed",
                         failure=f"every request is rejected: input_tokens + output_tokens = "
                                 f"{spec.input_tokens + spec.output_tokens} > max_model_len {deployment.max_model_len}")
    engine = deployment.new_engine(JitteredCost(deployment.profile, step_noise(seed, setting, repeat)))
    stats = WindowStats(start=spec.warmup_s)
    run = simulate(spec, engine, repeat, on_step=stats.observe if on_step is None else _both(stats.observe, on_step),
                   vocab_size=deployment.vocab_size)
    # the load generator's window on the virtual clock: the run started at 0 and stopped at its end
    window = final_window(spec, 0.0, run.duration, [record.finished for record in run.records])
    stats.close(engine, window.end_s)
    client, samples = client_figures(run, window, stats.generation_tokens(), plan.slos)
    # the simulator counts a refusal as it answers it, on the same virtual instant: the client's count is its own
    server = stats.signals(deployment.kv_plan.kv_cache_tokens, client.rejected_total)
    failure = None if client.completed else "no request completed in the measurement window"
    return RunResult(**base, finished_at=now_iso(), status="failed" if failure else "ok", failure=failure,
                     client=client, server=server, samples=samples)


def simulate(spec: WorkloadSpec, engine: EngineCore, repeat: int, on_step: StepObserver | None = None,
             vocab_size: int = ID_HIGH) -> TimedResult:
    """The load generator's run of ``spec`` (one sender) on ``engine``'s virtual clock, its prompts included, on a
    model of ``vocab_size`` tokens."""
    return run_timed(engine, _source(spec, repeat), _stop(spec), max_in_flight=_cap(spec), on_step=on_step,
                     prompts=prompt_source(spec, vocab_size))


def step_noise(seed: int, setting: str, repeat: int) -> np.random.Generator:
    """The stream of one run's step-time noise: its own per setting and repeat, the same on every rerun."""
    return np.random.default_rng([seed, zlib.crc32(setting.encode()), repeat])


def _both(first: StepObserver, second: StepObserver) -> StepObserver:
    def observe(engine: EngineCore, step: Step) -> None:
        first(engine, step)
        second(engine, step)

    return observe


def prompt_source(spec: WorkloadSpec, vocab_size: int = ID_HIGH) -> PromptIds:
    """The prompt ids of the load generator's requests (one sender): its shared prefixes and unique parts, drawn
    from the spec's seed as it draws them, completions' from the ids its probe finds on a model of ``vocab_size``
    tokens. A chat run's words become ids in the same layout; its prompts share what its completions would (the
    chat template's opening aside: 5 tokens on the simulator, below a block)."""
    ids = id_range(vocab_size) if spec.endpoint == "completions" else (ID_LOW, ID_HIGH)
    prefixes, unique = draw_prompt(spec, np.random.default_rng(spec.seed), ids)
    return functools.partial(prompt_ids, prefixes, unique, ids=ids)


def _profile_and_seed(plan: Plan) -> tuple[str, int]:
    backend = plan.backend
    if isinstance(backend, SimulatorBackend):
        return backend.profile, backend.seed
    # a real server's plan previews with its calibrated profile when it names one
    return backend.profile or DEFAULT_PROFILE, 0


def _deployment(params: ServingParams, profile: str, seed: int) -> Deployment:
    # extra_flags are vLLM flags the simulator has no model of; they are the same in every run of a plan
    # a knob left unset takes the simulator's default, which is vLLM's, as in a real-time run
    knobs = {name: value for name, value in params.knobs().items() if value is not None}
    return Deployment(ServeConfig(model=params.model, profile=profile, seed=seed, **knobs))


def _reported(deployment: Deployment) -> ServerReport:
    """What the simulated server would report choosing (its cache_config_info, /version and /v1/models)."""
    plan = deployment.kv_plan
    return ServerReport(vllm_version=VLLM_VERSION, block_size=plan.block_size, num_gpu_blocks=plan.num_gpu_blocks,
                        gpu_memory_utilization=deployment.config.gpu_memory_utilization,
                        max_model_len=deployment.max_model_len, kv_capacity_tokens=plan.kv_cache_tokens)


def _source(spec: WorkloadSpec, repeat: int) -> ClosedLoop | FixedArrivals:
    load, lengths = spec.load, (spec.input_tokens, spec.output_tokens)
    if isinstance(load, ConcurrencyLoad):
        return ClosedLoop(load.concurrency, *lengths, ramp_up_s=load.ramp_up_s, issue_until=_stop(spec))
    if isinstance(load, OfflineLoad):
        return FixedArrivals([RequestSpec(0.0, *lengths) for _ in range(load.requests)])
    arrivals = poisson.before(_stop(spec), load.rate, spec.seed + repeat)  # the load generator's one sender's
    return FixedArrivals([RequestSpec(t, *lengths) for t in arrivals.tolist()])


def _stop(spec: WorkloadSpec) -> float:
    # offline ends when its last request does; the others stop at the end of the window
    return math.inf if isinstance(spec.load, OfflineLoad) else spec.warmup_s + spec.duration_s


def _cap(spec: WorkloadSpec) -> int | None:
    return spec.load.max_in_flight if isinstance(spec.load, PoissonLoad) else None


@dataclass
class WindowStats:
    """The server's side of the window: a stats snapshot at its start and time-weighted samples within it."""

    start: float
    end: float = math.inf
    before: dict[str, float] | None = None
    max_waiting: int = 0
    max_running: int = 0
    kv_peak: float = 0.0
    kv_area: float = 0.0
    after: dict[str, float] = field(default_factory=dict)

    def observe(self, engine: EngineCore, step: Step) -> None:
        """Called with each step as scheduled, before its results apply (run_timed's on_step)."""
        if self.before is None and step.end >= self.start:
            self.before = snapshot(engine.stats)  # this step delivers in the window: count from here
        if step.end < self.start:
            return
        overlap = min(step.end, self.end) - max(step.start, self.start)
        self.max_waiting = max(self.max_waiting, engine.num_waiting)
        self.max_running = max(self.max_running, engine.num_running)
        self.kv_peak = max(self.kv_peak, engine.kv_cache_usage)
        self.kv_area += engine.kv_cache_usage * overlap  # idle time between steps holds no KV

    def close(self, engine: EngineCore, end: float) -> None:
        self.end = end
        self.after = snapshot(engine.stats)

    def delta(self) -> dict[str, float]:
        before = self.after if self.before is None else self.before  # no step delivered in the window: no change
        return {name: self.after[name] - before[name] for name in self.after}

    def generation_tokens(self) -> float:
        return self.delta()["generation_tokens"]

    def signals(self, kv_capacity_tokens: int, admission_rejections: float) -> ServerSignals:
        delta = self.delta()

        def mean(name: str) -> float | None:
            count = delta[f"{name}_count"]
            return delta[f"{name}_sum"] / count if count else None

        return ServerSignals(
            preemptions=delta["preemptions"], prompt_tokens=delta["prompt_tokens"],
            generation_tokens=delta["generation_tokens"], requests_finished=delta["finished"],
            queue_time_mean_s=mean("queue"), prefill_time_mean_s=mean("prefill"), decode_time_mean_s=mean("decode"),
            tokens_per_step_mean=mean("step_tokens"), max_waiting=self.max_waiting, max_running=self.max_running,
            kv_usage_peak=self.kv_peak, kv_usage_mean=self.kv_area / max(self.end - self.start, 1e-9),
            kv_capacity_tokens=kv_capacity_tokens, prefix_cache_queries=delta["prefix_queries"],
            prefix_cache_hits=delta["prefix_hits"],
            prefix_cache_hit_rate=hit_rate(delta["prefix_queries"], delta["prefix_hits"]),
            admission_rejections=admission_rejections)


def snapshot(stats: EngineStats) -> dict[str, float]:
    """The counters and histogram sums/counts the window's signals are deltas of."""
    values: dict[str, float] = {"preemptions": stats.num_preemptions, "prompt_tokens": stats.prompt_tokens,
              "generation_tokens": stats.generation_tokens,
              "finished": sum(n for reason, n in stats.request_success.items() if reason != "abort"),
              "prefix_queries": stats.prefix_cache_queries, "prefix_hits": stats.prefix_cache_hits}
    for name, histogram in (("queue", stats.request_queue_time), ("prefill", stats.request_prefill_time),
                            ("decode", stats.request_decode_time), ("step_tokens", stats.iteration_tokens)):
        values[f"{name}_sum"], values[f"{name}_count"] = histogram.sum, histogram.count
    return values


def client_figures(run: TimedResult, window: MeasurementWindow, output_tokens: float, slos: Slos
                   ) -> tuple[ClientFigures, RequestSamples]:
    """The virtual records folded through the load generator's figures (batchscope/loadgen/figures/figures.py) as a
    real run's are, every ITL gap kept (ExactGaps: the records are in memory anyway), a refused request as its
    rejected_busy record.

    ``output_tokens``: tokens delivered in the window, cut requests' included (the engine's count); goodput counts
    the requests whose own TTFT and TPOT met ``slos`` (Slos.count_met, as a real run's).
    """
    records = [as_measured(record, run.gaps.get(record.index)) for record in run.records]
    figures = RunFigures(itl=ExactGaps())
    for record in records:
        figures.add(record, window)
    window_records = [record for record in records if counted(record, window)]
    duration = window.duration_s
    good = good_count(window_records, slos)
    rejected = sum(figures.rejected.values())
    ended = figures.completed + sum(figures.failed.values()) + rejected  # the summary's rejected_share
    client = ClientFigures(
        **latencies(figures), completion_throughput_rps=figures.completed / duration,
        output_tokens_per_s=output_tokens / duration, completed=figures.completed,
        errors=sum(figures.failed.values()), window_s=duration, good_completed=good, goodput_rps=good / duration,
        rejected={reason: n for reason, n in figures.rejected.items() if n},
        rejected_share=rejected / ended if ended else None,
        prefill_tokens_per_s=figures.prompt_tokens / duration)
    return client, samples_of(window_records)


def as_measured(record: VirtualRecord, gaps: np.ndarray | None) -> RequestRecord:
    """A virtual request as the load generator records a measured one, sent at its arrival; ``gaps``: its ITL. One
    the admission check refused is the load generator's rejected_busy record (vLLM's 503, its reason), ended when
    its answer came back."""
    if record.rejected is not None:
        return RequestRecord(request_id=str(record.index), worker=0, scheduled_s=record.arrival,
                             sent_s=record.arrival, end_s=record.finished, outcome="rejected_busy",
                             status=admission.STATUS, reject_reason=record.rejected)
    return timed_elsewhere(str(record.index), record.arrival, record.first_token, record.finished,
                           [] if gaps is None else gaps.tolist(), record.prompt_tokens, record.output_tokens)
