"""GPU + model cost profiles: the numbers behind the simulator's memory budget and step times.

A profile is a YAML file (built-ins live in ``batchscope/simulator/profiles/``). Byte fields accept plain integers or
strings with a binary unit (``"14.99 GiB"``) so the files can quote the figures exactly as vLLM logs them.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from batchscope.inputs.validation import first_error, read_input_text
from batchscope.vllm import catalogue

_UNITS = {"": 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([KMGT]iB|B)?\s*$")


def parse_bytes(value: object) -> object:
    """Turn '14.99 GiB' into an int number of bytes; leave numbers alone for pydantic to check."""
    if not isinstance(value, str):
        return value
    match = _SIZE.match(value)
    if not match:
        raise ValueError(f"not a size: {value!r} (use bytes or a number with B, KiB, MiB, GiB or TiB)")
    return int(float(match.group(1)) * _UNITS[match.group(2) or ""])


Bytes = Annotated[int, BeforeValidator(parse_bytes), Field(ge=0)]

Device = Literal["cuda", "cpu"]
# vLLM's block size by device: CacheConfig's default of 16 on CUDA; on the CPU build its attention backend picks
# 128 and takes multiples of 32 only (real-parts.md §1: `--block-size 16` -> "No common block size for 16
# (CPU_ATTN: [MultipleOf(32)])")
DEFAULT_BLOCK_SIZE: dict[str, int] = {"cuda": 16, "cpu": 128}
CPU_BLOCK_MULTIPLE = 32
# the device name vLLM writes in its KV capacity line ("GPU KV cache size: ...", "CPU KV cache size: ...")
KV_LOG_NAME: dict[str, str] = {"cuda": "GPU", "cpu": "CPU"}


class Residual(BaseModel):
    """One probe figure: vLLM's mean over a phase against the fitted profile's prediction of it."""

    model_config = ConfigDict(extra="forbid")

    phase: str = Field(description="Probe phase: its users, prompt and output lengths (e.g. c1-p512-o8).")
    figure: str = Field(description=f"prefill ({catalogue.REQUEST_PREFILL_TIME.name}) or itl "
                        f"({catalogue.INTER_TOKEN_LATENCY.name}), the phase's mean.")
    measured_s: float = Field(description="The server's mean over the phase, seconds.")
    predicted_s: float = Field(description="The fitted cost model's mean over the phase's simulated schedule, s.")
    error: float = Field(description="predicted / measured - 1.")


class Calibration(BaseModel):
    """Where a calibrated profile's numbers come from: the server, its conditions and how well the fit holds."""

    model_config = ConfigDict(extra="forbid")

    measured_at: str = Field(description="When the probe ran, ISO 8601 UTC.")
    conditions: dict[str, str | int | float | bool | None] = Field(
        description="What the probe measured under: model, vLLM version, knobs, KV cache, hardware (None where "
                    "the server does not say).")
    budget_s: float = Field(description="Seconds of probe load asked for (--budget-s).")
    residuals: list[Residual] = Field(description="Every fitted figure, measured against predicted.")
    rms_error: float = Field(description="Root mean square of the residuals' relative errors.")
    repeat_drift: float = Field(description="The repeated phase's change between its two runs (relative, largest "
                                "of its figures): the server's own timing noise over the probe.")
    noise_limit: float = Field(0.15, description="The limit both the drift and the RMS error were held to.")


class Profile(BaseModel):
    """One model on one GPU: memory at start-up and the cost of an engine step."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Profile name, as given to --profile.")
    description: str = Field("", description="What the profile models and where its numbers come from.")
    device: Device = Field(description="What vLLM runs on: cuda (block size 16 by default) or cpu (128, multiples "
                           "of 32 only); also the KV capacity line's name, GPU or CPU.")
    max_model_len: int = Field(gt=0, description="Context length of the model (prompt + output), tokens.")
    vocab_size: int = Field(gt=0, description="Token ids of the model's tokenizer: a prompt id at or above it is "
                            "refused as vLLM refuses it ('Token id N is out of vocabulary').")

    gpu_memory_bytes: Bytes = Field(description="Total device memory as vLLM reports it (total_memory).")
    weight_bytes: Bytes = Field(description="Memory taken by the weights ('Model loading took').")
    non_torch_bytes: Bytes = Field( description="Memory outside PyTorch's allocator (NCCL, CUDA context).")
    activation_base_bytes: Bytes = Field( description="Peak activation memory of the profiling run, intercept.")
    activation_bytes_per_batched_token: float = Field(
        ge=0, description="Growth of the profiled activation peak per token of max_num_batched_tokens."
    )
    kv_bytes_per_token: Bytes = Field(description="KV cache per token: 2 x layers x kv_heads x head_dim x dtype.")

    matmul_params: float = Field(gt=0, description="Parameters used in matrix multiplies (excludes embedding).")
    attention_flops_per_token_pair: float = Field(
        ge=0, description="FLOPs per (query token, context token) pair: 4 x layers x heads x head_dim."
    )
    peak_flops: float = Field(gt=0, description="Dense bf16 peak of the GPU, FLOP/s.")
    memory_bandwidth: float = Field(gt=0, description="HBM bandwidth of the GPU, bytes/s.")
    compute_efficiency: float = Field(gt=0, le=1, description="Achieved fraction of peak_flops in matmuls.")
    bandwidth_efficiency: float = Field(gt=0, le=1, description="Achieved fraction of memory_bandwidth.")
    step_overhead_s: float = Field(ge=0, description="Fixed per-step cost: scheduling, launch, sampling, output.")
    step_per_request_s: float = Field(
        0.0, ge=0, description="Engine-core CPU per request in a step (input preparation, output serialisation)."
    )
    frontend_request_s: float = Field(
        0.0, ge=0, description="API server's fixed cost before a request reaches the engine core, seconds."
    )
    frontend_input_token_s: float = Field(0.0, ge=0, description="Tokenization cost per prompt token, seconds.")
    frontend_output_s: float = Field(
        0.0, ge=0, description="From the end of a step to the token's write: hop back, detokenize, SSE, seconds."
    )
    eos_probability: float = Field(
        0.002, ge=0, le=1, description="Chance per generated token of drawing EOS when ignore_eos is false."
    )
    calibration: Calibration | None = Field(
        None, description="Set by `batchscope sim calibrate`: the probe's conditions and the fit's residuals.")

    def activation_peak_bytes(self, max_num_batched_tokens: int) -> int:
        """Peak activation memory of vLLM's profiling forward pass of max_num_batched_tokens tokens."""
        return int(self.activation_base_bytes + self.activation_bytes_per_batched_token * max_num_batched_tokens)


def builtin_profiles() -> list[str]:
    """Names of the profiles shipped with the simulator."""
    folder = resources.files("batchscope.simulator") / "profiles"
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_profile(name_or_path: str) -> Profile:
    """Load a built-in profile by name, or a YAML file by path; raise ValueError with a one-line reason."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        text = _read_profile_file(path)
    else:
        if name_or_path not in builtin_profiles():
            allowed = ", ".join(builtin_profiles())
            raise ValueError(f"--profile: unknown profile {name_or_path!r} (allowed: {allowed}, or a YAML file)")
        text = (resources.files("batchscope.simulator") / "profiles" / f"{name_or_path}.yaml").read_text()
    try:
        return Profile.model_validate(yaml.safe_load(text))
    except yaml.YAMLError as exc:
        raise ValueError(f"--profile {path.name}: not valid YAML ({_yaml_problem(exc)})") from None
    except ValidationError as exc:
        field, message, _ = first_error(exc)
        # no field: the document is not a mapping
        raise ValueError(f"--profile {path.name}: {field or 'top level'}: {message}") from None


def _read_profile_file(path: Path) -> str:
    if not path.exists():
        raise ValueError(f"--profile: file {path} not found")
    if not path.is_file():
        raise ValueError(f"--profile: {path} is not a file")
    try:
        return read_input_text(path)
    except OSError as exc:
        raise ValueError(f"--profile: cannot read {path} ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ValueError(f"--profile: {path} is not a UTF-8 text file") from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's message spans several lines; keep its problem and where it is."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark else problem
