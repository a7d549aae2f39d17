"""The simulator's serving configuration (the `vllm serve` flags it honours) and engine construction."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from batchscope.inputs.validation import first_error
from batchscope.simulator.admission import AdmissionControl
from batchscope.simulator.cost import StepCostModel
from batchscope.simulator.engine import EngineCore, SchedulerLimits
from batchscope.simulator.frontend import FrontEnd
from batchscope.simulator.memory import KvCachePlan, plan_kv_cache
from batchscope.simulator.profile import CPU_BLOCK_MULTIPLE, DEFAULT_BLOCK_SIZE, Profile, load_profile
from batchscope.vllm import knobs

BlockSize = Literal[1, 8, 16, 32, 64, 128]


def knob_field(name: str) -> typing.Any:
    """A ServeConfig field for one of vLLM's knobs: the simulator's value when unset (batchscope.vllm.knobs'
    baseline, vLLM's SchedulerConfig default rather than `vllm serve`'s device-sized one) and its meaning."""
    knob = knobs.BY_NAME[name]
    return Field(knob.baseline, description=f"{knob.meaning.capitalize()}; unset: {knob.baseline:g} (the seed's "
                                            "baseline, SchedulerConfig's default; `vllm serve` sizes it by device).")


def queue_knob_field(name: str) -> typing.Any:
    """A ServeConfig field for one of vLLM 0.32's queue knobs: unset as `vllm serve` leaves it (knobs' default)."""
    knob = knobs.BY_NAME[name]
    default = None if knob.default is None else bool(knob.default) if knob.switch else int(knob.default)
    return Field(default, description=knob.description)


class ServeConfig(BaseModel):
    """Flags of `batchscope sim serve`; names and defaults mirror `vllm serve` (the seed's baseline)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="Model name or path, as given to `vllm serve`.")
    served_model_name: str | None = Field(None, description="Name the API reports; defaults to model.")
    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8000, ge=0, le=65535, description="Port to listen on (0 picks a free one).")
    max_num_seqs: int = knob_field("max_num_seqs")
    max_num_batched_tokens: int = knob_field("max_num_batched_tokens")
    gpu_memory_utilization: float = knob_field("gpu_memory_utilization")
    max_num_active_seqs: int | None = queue_knob_field("max_num_active_seqs")
    max_num_queued_reqs: int | None = queue_knob_field("max_num_queued_reqs")
    max_num_queued_tokens: int | None = queue_knob_field("max_num_queued_tokens")
    long_prefill_token_threshold: int = queue_knob_field("long_prefill_token_threshold")
    long_prefill_token_threshold_adaptive: bool = queue_knob_field("long_prefill_token_threshold_adaptive")
    max_model_len: int | None = Field(None, gt=0, description="Prompt + output limit; defaults to the profile's.")
    vocab_size: int | None = Field(None, gt=0, description="Simulator only: the model's vocabulary (prompt ids "
                                   "must be below it); defaults to the profile's.")
    num_gpu_blocks_override: int | None = Field(
        None, gt=0, description="KV blocks to use instead of what memory allows (vLLM's flag: a fixed cache size).")
    block_size: BlockSize | None = Field(
        None, description="Tokens per KV cache block; default: the profile's device's (16 on CUDA, 128 on CPU)."
    )
    enable_prefix_caching: bool = Field(True, description="Automatic prefix caching, on by default as in vLLM V1.")
    # SecretStr: a repr, a dump or a log line of the config shows the key as stars, never its value
    api_key: SecretStr | None = Field(None, description="If set, /v1 routes require 'Authorization: Bearer <key>'.")
    seed: int = Field(0, ge=0, description="Seed for EOS draws, output tokens and fault injection.")
    profile: str = Field("h100-llama-3.1-8b", description="Built-in profile name or a profile YAML file.")
    ground_truth_log: str | None = Field(None, description="JSONL file: per-request server-side timestamps.")
    fault_error_rate: float = Field(0.0, ge=0, le=1, description="Fraction of requests answered with HTTP 500.")
    fault_cut_rate: float = Field(0.0, ge=0, le=1, description="Fraction of streams cut half-way, no [DONE].")
    fault_stall_rate: float = Field(0.0, ge=0, le=1, description="Fraction of requests held before responding.")
    fault_stall_s: float = Field(0.0, ge=0, description="How long a stalled request is held, seconds.")
    fault_engine_stall_after_s: float | None = Field(
        None, ge=0, description="Seconds after start-up when the engine core stops stepping (a hung engine: requests "
                                "stay running and waiting, no token is generated); unset: never.")
    fault_engine_stall_s: float = Field(0.0, ge=0, description="How long the engine core stays stopped, seconds.")
    fault_stream_event_cpu_s: float = Field(
        0.0, ge=0, le=1, description="CPU time the API server spends on each stream event (one step's new tokens "
                                     "for one stream, one write), real busy work as a slow detokenizer or output "
                                     "processor costs, seconds; 0: none.")

    @field_validator("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "max_num_active_seqs",
                     "max_num_queued_reqs", "max_num_queued_tokens", "long_prefill_token_threshold")
    @classmethod
    def _check_bounds(cls, value: float | None, info: ValidationInfo) -> float | None:
        knob = knobs.BY_NAME[info.field_name or ""]
        if value is not None and not knob.above < value <= knob.at_most:
            raise ValueError(f"must be in ({knob.above:g}, {knob.at_most:g}], got {value:g}")
        return value

    @model_validator(mode="after")
    def _check_across(self) -> ServeConfig:
        problem = knobs.cross_knob_problem(self.model_dump(include=set(knobs.KNOB_NAMES)))
        if problem:
            raise ValueError(problem)
        return self

    @property
    def name(self) -> str:
        return self.served_model_name or self.model


def flag_name(field: str) -> str:
    """The command-line flag of a ServeConfig field (MODEL is positional)."""
    return field if field == "model" else "--" + field.replace("_", "-")


def validation_message(exc: ValidationError) -> str:
    """One line naming the first bad flag and what it allows."""
    flag, message, _ = first_error(exc, field_name=flag_name)
    return f"{flag}: {message}" if flag else message  # model-level messages name their fields


class Deployment:
    """A validated config resolved against its profile: the KV plan and a fresh engine core."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        _check_ground_truth_log(config.ground_truth_log)
        self.profile: Profile = load_profile(config.profile)
        self.block_size = _block_size(config.block_size, self.profile)
        self.max_model_len = config.max_model_len or self.profile.max_model_len
        self.vocab_size = config.vocab_size or self.profile.vocab_size
        if self.max_model_len > self.profile.max_model_len:
            raise ValueError(
                f"--max-model-len: {self.max_model_len} is greater than the derived max_model_len "
                f"({self.profile.max_model_len}) of profile {self.profile.name}"
            )
        # vLLM's rules across knobs again, with the max_model_len in effect (the profile's when unset)
        problem = knobs.cross_knob_problem({**config.model_dump(include=set(knobs.KNOB_NAMES)),
                                            "max_model_len": self.max_model_len})
        if problem:
            raise ValueError(problem)
        self.kv_plan: KvCachePlan = plan_kv_cache(
            self.profile,
            config.gpu_memory_utilization,
            config.max_num_batched_tokens,
            self.block_size,
            self.max_model_len,
            config.num_gpu_blocks_override,
        )

    def limits(self) -> SchedulerLimits:
        return SchedulerLimits(
            max_num_seqs=self.config.max_num_seqs,
            max_num_batched_tokens=self.config.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            block_size=self.block_size,
            num_gpu_blocks=self.kv_plan.num_gpu_blocks,
            max_num_active_seqs=self.config.max_num_active_seqs,
            long_prefill_token_threshold=self.config.long_prefill_token_threshold,
            long_prefill_token_threshold_adaptive=self.config.long_prefill_token_threshold_adaptive,
        )

    def new_engine(self, cost: StepCostModel | None = None) -> EngineCore:
        """An engine of this deployment, with its API server's admission check; ``cost`` replaces the profile's
        step cost model (the tuner's what-if adds seeded step-time noise to it)."""
        return EngineCore(self.limits(), cost or StepCostModel(self.profile), self.profile.eos_probability,
                          seed=self.config.seed, enable_prefix_caching=self.config.enable_prefix_caching,
                          frontend=FrontEnd.of(self.profile), admission=self.new_admission())

    def new_admission(self) -> AdmissionControl:
        """The API server's admission check with this deployment's queue limits."""
        return AdmissionControl(self.config.max_num_queued_reqs, self.config.max_num_queued_tokens)


def _block_size(requested: int | None, profile: Profile) -> int:
    """The flag's block size, else the device's default, as vLLM picks it; the CPU build's refusal as one line."""
    size = DEFAULT_BLOCK_SIZE[profile.device] if requested is None else requested
    if profile.device == "cpu" and size % CPU_BLOCK_MULTIPLE:
        allowed = ", ".join(str(s) for s in typing.get_args(BlockSize) if s % CPU_BLOCK_MULTIPLE == 0)
        raise ValueError(f"--block-size: {size} is not allowed on profile {profile.name}'s cpu device: vLLM's CPU "
                         f"attention takes multiples of {CPU_BLOCK_MULTIPLE} only ({allowed})")
    return size


def _check_ground_truth_log(path: str | None) -> None:
    """Fail at start-up, not at the first request, when the log cannot be created where asked."""
    if path is None:
        return
    file = Path(path)
    if file.is_dir():
        raise ValueError(f"--ground-truth-log: {path} is a directory, not a file")
    if not file.parent.is_dir():
        raise ValueError(f"--ground-truth-log: folder {file.parent} does not exist")
    try:
        with open(file, "a"):  # appended to at every request: it must be writable now
            pass
    except OSError as exc:
        raise ValueError(f"--ground-truth-log: cannot write {path} ({exc.strerror})") from None
