"""The workload spec: what load to send, fixed so every tuning round sends the same thing.

A YAML file (see docs in README) validated by pydantic; ``--set key=value`` flags override fields
(``--set load.rate=8``; ``key=null`` removes a field). A bad field gives one line naming it and what it allows.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

SCHEMA_VERSION = 1


class ConcurrencyLoad(BaseModel):
    """Closed loop: N users, each sending its next request as soon as the previous one ends."""

    model_config = ConfigDict(extra="forbid")
    mode: Literal["concurrency"] = "concurrency"
    concurrency: int = Field(gt=0, description="Requests in flight at all times (one per user).")
    ramp_up_s: float = Field(
        0.0, ge=0, description="Start the users evenly over this many seconds (0: all at once). Users started "
        "together with equal lengths stay in lockstep: every request then arrives in one burst.")


class PoissonLoad(BaseModel):
    """Open loop: arrivals at exponential gaps, independent of completions (MLPerf Server)."""

    model_config = ConfigDict(extra="forbid")
    mode: Literal["poisson"] = "poisson"
    rate: float = Field(gt=0, description="Mean arrival rate λ, requests per second, over all workers.")
    max_in_flight: int = Field(512, gt=0, description="Cap on requests in flight; arrivals beyond it are refused.")


class OfflineLoad(BaseModel):
    """All requests released at t=0 (MLPerf Offline); the run ends when the last one does."""

    model_config = ConfigDict(extra="forbid")
    mode: Literal["offline"] = "offline"
    requests: int = Field(gt=0, description="Number of requests released at once.")


Load = Annotated[ConcurrencyLoad | PoissonLoad | OfflineLoad, Field(discriminator="mode")]


class WorkloadSpec(BaseModel):
    """Everything that must stay identical between tuning rounds."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field("auto", description="Model to request; 'auto' = the first entry of GET /v1/models.")
    endpoint: Literal["completions", "chat"] = Field(
        "completions", description="/v1/completions (token-id prompts) or /v1/chat/completions (text prompts)."
    )
    input_tokens: int = Field(gt=0, description="Exact prompt length in tokens.")
    output_tokens: int = Field(gt=0, description="Exact output length (max_tokens with ignore_eos).")
    stream: bool = Field(True, description="Stream tokens (SSE); TTFT and ITL need it.")
    timeout_s: float = Field(600.0, gt=0, description="Whole-request timeout, seconds.")
    api_key: str | None = Field(None, description="Bearer key; defaults to $BATCHSCOPE_API_KEY or $OPENAI_API_KEY.")
    seed: int = Field(1, description="Seed for prompts and arrival times.")
    warmup_s: float = Field(0.0, ge=0, description="Requests scheduled before this are excluded from the summary.")
    duration_s: float = Field(60.0, gt=0, description="Measurement period after warm-up, seconds (not offline).")
    scenario: str = Field("default", max_length=64, description="Label for this workload in metrics and records.")
    load: Load = Field(description="The load mode: concurrency, poisson or offline.")

    def resolved_api_key(self) -> str | None:
        return self.api_key or os.environ.get("BATCHSCOPE_API_KEY") or os.environ.get("OPENAI_API_KEY")


class SpecError(ValueError):
    """A spec problem, already phrased as one line naming the field."""


def load_spec(path: str | Path | None, overrides: list[str] | None = None) -> WorkloadSpec:
    """Read a spec file (optional) and apply ``key=value`` overrides; raise SpecError on any problem."""
    data: dict = {}
    if path is not None:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as exc:
            raise SpecError(f"spec: cannot read {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise SpecError(f"spec: {path} is not valid YAML ({exc.__class__.__name__})") from None
        if not isinstance(data, dict):
            raise SpecError(f"spec: {path} must hold a mapping of fields")
    for item in overrides or []:
        _apply_override(data, item)
    try:
        return WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(describe_error(exc)) from None


def _apply_override(data: dict, item: str) -> None:
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise SpecError(f"--set: expected key=value, got {item!r}")
    *parents, leaf = key.split(".")
    target = data
    for part in parents:
        target = target.setdefault(part, {})
        if not isinstance(target, dict):
            raise SpecError(f"--set: {key}: {part} is not a mapping")
    value = yaml.safe_load(raw)
    if value is None:
        target.pop(leaf, None)  # key=null removes a field, e.g. when switching load modes
    else:
        target[leaf] = value


def describe_error(exc: ValidationError) -> str:
    """First validation error as 'spec: field: message (allowed: ...)'."""
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"] if p not in ("concurrency", "poisson", "offline") or len(err["loc"]) == 1]
    field = ".".join(loc) or "spec"
    message = err["msg"]
    if err["type"] == "union_tag_invalid" or err["type"] == "union_tag_not_found":
        message = "must be one of: concurrency, poisson, offline"
        field = "load.mode"
    return f"spec: {field}: {message}"
