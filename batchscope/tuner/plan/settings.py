"""One setting of a plan and how it is applied: the `vllm serve` parameters (ServingParams; a knob left unset is
vLLM's default) and the server restarted with them (the simulator, a command line, a docker container)."""

from __future__ import annotations

import shlex
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from batchscope.inputs.secrets import mask_argv, mask_command
from batchscope.vllm import knobs as vllm_knobs

# The serving parameters a variation may change: every knob of batchscope.vllm.knobs (the seed's three, the lengths
# and cache size they depend on, the queue's own).
TUNABLE = vllm_knobs.KNOB_NAMES


def _knob(name: str) -> Any:
    """A knob's field: unset (None) by default, vLLM's bounds and description (batchscope.vllm.knobs)."""
    knob = vllm_knobs.BY_NAME[name]
    if knob.switch:
        return Field(None, description=knob.description)
    return Field(None, gt=knob.above, le=knob.at_most, description=knob.description)


class ServingParams(BaseModel):
    """What `vllm serve` is started with for one run (flag names as vLLM's, underscores). A knob left unset is
    not passed: vLLM's own default applies, and the run reads back what the server chose."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, description="Model name or path given to `vllm serve`.")
    max_model_len: int | None = _knob("max_model_len")
    max_num_seqs: int | None = _knob("max_num_seqs")
    max_num_batched_tokens: int | None = _knob("max_num_batched_tokens")
    gpu_memory_utilization: float | None = _knob("gpu_memory_utilization")
    block_size: int | None = _knob("block_size")
    num_gpu_blocks_override: int | None = _knob("num_gpu_blocks_override")
    max_num_active_seqs: int | None = _knob("max_num_active_seqs")
    max_num_queued_reqs: int | None = _knob("max_num_queued_reqs")
    max_num_queued_tokens: int | None = _knob("max_num_queued_tokens")
    long_prefill_token_threshold: int | None = _knob("long_prefill_token_threshold")
    long_prefill_token_threshold_adaptive: bool | None = _knob("long_prefill_token_threshold_adaptive")
    extra_flags: list[str] = Field(default_factory=list,
                                   description="Other `vllm serve` flags, kept identical across runs.")

    @field_validator(*TUNABLE, mode="before")
    @classmethod
    def _switch_or_number(cls, value: object, info: ValidationInfo) -> object:
        # pydantic would take `true` for 1 and 1 for `true`: a switch is written true/false, a number as a number
        if value is None:
            return value
        if vllm_knobs.BY_NAME[info.field_name or ""].switch:
            if not isinstance(value, bool):
                raise ValueError("is a switch: true or false")
        elif isinstance(value, bool):
            raise ValueError("must be a number, not true or false")
        return value

    @model_validator(mode="after")
    def _vllm_rules(self) -> ServingParams:
        problem = vllm_knobs.cross_knob_problem(self.knobs())
        if problem:
            raise ValueError(problem)
        return self

    @field_serializer("extra_flags")
    def _mask_secret_flags(self, flags: list[str]) -> list[str]:
        # every dump is written somewhere (plan.json, run.json, the report): `--api-key K` shows as `--api-key ***`
        return mask_argv(flags)

    def knobs(self) -> dict[str, int | float | None]:
        """Every knob's value, None where unset."""
        return {name: getattr(self, name) for name in TUNABLE}

    def flags(self) -> list[str]:
        """The `vllm serve` arguments after the model: the set knobs (in vllm_knobs.KNOBS order), then
        extra_flags."""
        return [*vllm_knobs.knob_flags(self.knobs()), *self.extra_flags]


class SimulatorBackend(BaseModel):
    """Restart `batchscope sim serve` per setting (the embedded default)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["simulator"] = "simulator"
    profile: str = Field("h100-llama-3.1-8b", description="Simulator profile name or YAML file.")
    seed: int = Field(0, ge=0, description="Simulator seed.")


class CommandBackend(BaseModel):
    """Run a `vllm serve ...` command line as a subprocess per setting (a GPU box)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["command"] = "command"
    command: str = Field("vllm serve {model} --host {host} --port {port} {flags}",
                         description="Template; {model}, {host}, {port} and {flags} are filled in per run.")
    host: str = Field("127.0.0.1", description="Address the server listens on.")
    port: int = Field(8000, gt=0, lt=65536, description="Port the server listens on.")
    startup_timeout_s: float = Field(1800.0, gt=0, description="Deadline for /health after a start, seconds.")
    profile: str | None = Field(None, description="Simulator profile of this server for --what-if previews (a "
                                "`batchscope sim calibrate` file); None: the simulator's default H100 profile.")

    @field_validator("command")
    @classmethod
    def _splits(cls, command: str) -> str:
        try:
            words = shlex.split(command)
        except ValueError as exc:  # run without a shell, split as one would: an open quote is a bad plan
            raise ValueError(f"does not split like a shell command line ({exc})") from None
        if not words:
            raise ValueError("is empty")
        return command

    @field_serializer("command")
    def _mask_secrets(self, command: str) -> str:
        # plan.json and every other dump: `--api-key K` in the template shows as `--api-key ***`; the process
        # started (tuner.run.servers.command_argv) gets the field itself
        return mask_command(command)


class DockerBackend(BaseModel):
    """Stop and re-create a vLLM container with the new flags (docker SDK), keeping everything else."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["docker"] = "docker"
    container: str = Field(description="Name of the running vLLM container to re-create per setting.")
    url: str = Field("http://127.0.0.1:8000", description="Base URL where the container's API answers.")
    startup_timeout_s: float = Field(1800.0, gt=0, description="Deadline for /health after a start, seconds.")
    profile: str | None = Field(None, description="Simulator profile of this server for --what-if previews (a "
                                "`batchscope sim calibrate` file); None: the simulator's default H100 profile.")


Backend = Annotated[SimulatorBackend | CommandBackend | DockerBackend, Field(discriminator="kind")]
