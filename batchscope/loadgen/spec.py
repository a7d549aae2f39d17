"""The workload spec: what load to send, fixed so every tuning round sends the same thing.

A YAML file (see docs in README) validated by pydantic; ``--set key=value`` flags override fields
(``--set load.rate=8``; ``key=null`` removes a field). A bad field gives one line naming it and what it allows.
Numbers are bounded (finite, below the MAX_* limits) so an absurd value is refused here, not hours into a run.
Secret fields (``api_key``) are masked in every dump: the spec is written into summary.json and sent to workers.
The latency targets (``slo``) and their one rule, vLLM bench serve's goodput (``within_slo``), live here: the load
generator counts its good requests by them and the tuner's plan (batchscope/tuner/plan/file.py Slos) takes its
defaults and rule.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
)

from batchscope.inputs.secrets import mask_mapping
from batchscope.inputs.validation import TAGGED_UNION_ERRORS, first_error, read_yaml_mapping

MAX_TOKENS = 10_000_000  # per request, prompt or output: beyond any model's context
MAX_CONCURRENCY = 100_000  # users, or requests in flight
MAX_RATE = 1e6  # requests/s
MAX_REQUESTS = 10_000_000  # offline batch
MAX_TIMEOUT_S = 86_400.0  # a day per request
MAX_PERIOD_S = 2_592_000.0  # 30 days of warm-up or measurement
MAX_PREFIXES = 10_000  # distinct shared prefixes
MAX_PREFIX_IDS = 50_000_000  # their tokens together: every sender holds them all
# The SLO targets' defaults, the tuner plan's too (MLPerf's llama2-70b Server bounds: p99 TTFT 2 s, TPOT 200 ms)
DEFAULT_SLO_TTFT_S = 2.0
DEFAULT_SLO_TPOT_S = 0.2
# inf and nan are refused everywhere: rate .inf would release arrivals in an endless burst
STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


# The closed loop's default ramp: users start RAMP_PER_USER_S apart, at most RAMP_CAP_S in all. Started at once,
# N first requests reach the server together, which queues them (real queueing, but the start's alone: the
# demo's 64 users read TTFT p99 1.5 s against p50 0.1 s), and users with equal lengths then stay in lockstep
RAMP_PER_USER_S = 0.01
RAMP_CAP_S = 10.0


def default_ramp_s(fields: dict) -> float:
    """``ramp_up_s`` when the spec leaves it out: proportional to the users (0 when concurrency is invalid)."""
    users = fields.get("concurrency")
    return min(RAMP_CAP_S, users * RAMP_PER_USER_S) if isinstance(users, int) else 0.0


class ConcurrencyLoad(BaseModel):
    """Closed loop: N users, each sending its next request as soon as the previous one ends."""

    model_config = STRICT
    mode: Literal["concurrency"] = "concurrency"
    concurrency: int = Field(gt=0, le=MAX_CONCURRENCY, description="Requests in flight at all times (one per user).")
    ramp_up_s: float = Field(
        default_factory=default_ramp_s, ge=0, le=MAX_TIMEOUT_S,
        description=f"Start the users evenly over this many seconds; default {RAMP_PER_USER_S * 1e3:g} ms per user, "
        f"at most {RAMP_CAP_S:g} s; 0: all at once. Users started together with equal lengths stay in lockstep: "
        "every request then arrives in one burst the server queues. Keep warmup_s >= ramp_up_s + one request.")


class PoissonLoad(BaseModel):
    """Open loop: arrivals at exponential gaps, independent of completions (MLPerf Server)."""

    model_config = STRICT
    mode: Literal["poisson"] = "poisson"
    rate: float = Field(gt=0, le=MAX_RATE, description="Mean arrival rate λ, requests per second, over all workers.")
    max_in_flight: int = Field(512, gt=0, le=MAX_CONCURRENCY,
                               description="Cap on requests in flight; arrivals beyond it are refused.")


class OfflineLoad(BaseModel):
    """All requests released at t=0 (MLPerf Offline); the run ends when the last one does."""

    model_config = STRICT
    mode: Literal["offline"] = "offline"
    requests: int = Field(gt=0, le=MAX_REQUESTS, description="Number of requests released at once.")


Load = Annotated[ConcurrencyLoad | PoissonLoad | OfflineLoad, Field(discriminator="mode")]


class SharedPrefix(BaseModel):
    """Prompts that open alike, as with a common system prompt: a prefix a server's prefix cache can reuse.

    Request n of worker w opens with prefix (n + w) mod ``distinct`` (round-robin), then a part of its own; the
    prompt keeps exactly ``input_tokens`` tokens (see stream/prompts.py). On chat the prefix is a system
    message: ``tokens`` counts the templated prompt's opening up to the user message's first word.
    """

    model_config = STRICT
    tokens: int = Field(gt=0, le=MAX_TOKENS, description="Tokens of each shared prefix; below input_tokens (on "
                        "chat: the template's opening and the framed system message, up to the user's words).")
    distinct: int = Field(1, gt=0, le=MAX_PREFIXES, description="How many different prefixes the requests share.")


def within_slo(ttft_s: float, tpot_s: float | None, ttft_target_s: float | None, tpot_target_s: float | None) -> bool:
    """One request within both targets, vLLM bench serve's goodput rule (``<=``; a target None is no bound). A
    one-token request has no TPOT: it passes that target, as vLLM counts its TPOT as 0."""
    return (ttft_target_s is None or ttft_s <= ttft_target_s) and \
        (tpot_target_s is None or tpot_s is None or tpot_s <= tpot_target_s)


class SloTargets(BaseModel):
    """The latency targets a request must meet to count as good (batchscope_client_goodput_requests_total)."""

    model_config = STRICT
    ttft_s: float | None = Field(DEFAULT_SLO_TTFT_S, gt=0, le=MAX_TIMEOUT_S,
                                 description="Target on each request's own TTFT, seconds; null: no TTFT target.")
    tpot_s: float | None = Field(DEFAULT_SLO_TPOT_S, gt=0, le=MAX_TIMEOUT_S,
                                 description="Target on each request's own TPOT, seconds; null: no TPOT target.")

    def met_by(self, ttft_s: float, tpot_s: float | None) -> bool:
        return within_slo(ttft_s, tpot_s, self.ttft_s, self.tpot_s)


class WorkloadSpec(BaseModel):
    """Everything that must stay identical between tuning rounds."""

    model_config = STRICT

    model: str = Field("auto", description="Model to request; 'auto' = the first entry of GET /v1/models.")
    endpoint: Literal["completions", "chat"] = Field(
        "completions", description="/v1/completions (token-id prompts) or /v1/chat/completions (text prompts)."
    )
    input_tokens: int = Field(gt=0, le=MAX_TOKENS, description="Exact prompt length in tokens.")
    output_tokens: int = Field(gt=0, le=MAX_TOKENS, description="Exact output length (max_tokens with ignore_eos).")
    shared_prefix: SharedPrefix | None = Field(
        None, description="A prefix shared by the prompts (on chat: a system message); none: every prompt is its own.")
    stream: bool = Field(True, description="Stream tokens (SSE); TTFT and ITL need it.")
    timeout_s: float = Field(600.0, gt=0, le=MAX_TIMEOUT_S, description="Whole-request timeout, seconds.")
    api_key: SecretStr | None = Field(
        None, description="Bearer key; defaults to $BATCHSCOPE_API_KEY or $OPENAI_API_KEY. Masked in every dump.")
    seed: int = Field(1, ge=0, description="Seed for prompts and arrival times.")
    warmup_s: float = Field(0.0, ge=0, le=MAX_PERIOD_S, description="Seconds before the measurement window: "
                            "requests that end in them are left out of the summary's figures.")
    duration_s: float = Field(60.0, gt=0, le=MAX_PERIOD_S,
                              description="Measurement period after warm-up, seconds (not offline).")
    scenario: str = Field("default", max_length=64, description="Label for this workload in metrics and records.")
    max_failed_fraction: float = Field(
        0.5, ge=0, le=1, description="The run fails (exit status 4) when more than this fraction of the requests "
        "that ended in the measurement window are not ok (aborted ones aside), or when none is ok.")
    load: Load = Field(description="The load mode: concurrency, poisson or offline.")
    slo: SloTargets = Field(default_factory=SloTargets, description="Latency targets of a good request (goodput); "
                            "the exporter passes them on to the SLO recording rules and alerts.")

    @field_validator("shared_prefix")
    @classmethod
    def _prefix_fits(cls, prefix: SharedPrefix | None, info: ValidationInfo) -> SharedPrefix | None:
        length = info.data.get("input_tokens")
        if prefix is None:
            return prefix
        if length is not None and prefix.tokens >= length:
            raise ValueError(f"tokens ({prefix.tokens}) must be below input_tokens ({length}): every prompt "
                             "keeps a part of its own")
        if prefix.tokens * prefix.distinct > MAX_PREFIX_IDS:
            raise ValueError(f"tokens x distinct ({prefix.tokens * prefix.distinct}) must be at most {MAX_PREFIX_IDS}")
        return prefix

    def resolved_api_key(self) -> str | None:
        key = self.api_key.get_secret_value() if self.api_key else None
        return key or os.environ.get("BATCHSCOPE_API_KEY") or os.environ.get("OPENAI_API_KEY")

    @model_serializer(mode="wrap")
    def _mask_secrets(self, handler):
        # every dump leaves the process that read the spec (summary.json, the spawn message to workers)
        return mask_mapping(handler(self))


class SpecError(ValueError):
    """A spec problem, already phrased as one line naming the field."""


class _Loader(yaml.SafeLoader):
    """YAML with 1.2's floats: PyYAML (YAML 1.1) reads ``1e12`` as a string, which would hide its size."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                              list("-+0123456789"))


def load_spec(path: str | Path | None, overrides: list[str] | None = None) -> WorkloadSpec:
    """Read a spec file (optional) and apply ``key=value`` overrides; raise SpecError on any problem."""
    data: dict = {}
    if path is not None:
        data = read_yaml_mapping(path, "spec", SpecError, loader=_Loader, empty_ok=True)
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
    if not raw.strip():
        raise SpecError(f"--set: {key}: no value (write {key}=null to remove the field)")
    *parents, leaf = key.split(".")
    target = data
    for part in parents:
        target = target.setdefault(part, {})
        if not isinstance(target, dict):
            raise SpecError(f"--set: {key}: {part} is not a mapping")
    try:
        value = yaml.load(raw, Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError:
        raise SpecError(f"--set: {key}: the value is not valid YAML") from None
    if value is None:
        target.pop(leaf, None)  # key=null removes a field, e.g. when switching load modes
    else:
        target[leaf] = value


def describe_error(exc: ValidationError) -> str:
    """First validation error as 'spec: field: message' (batchscope.inputs.validation's one line)."""
    field, message, kind = first_error(exc, field_name=_without_mode_tag)
    if kind in TAGGED_UNION_ERRORS:
        field, message = "load.mode", "must be one of: concurrency, poisson, offline"
    return f"spec: {field or 'spec'}: {message}"


def _without_mode_tag(field: str) -> str:
    # pydantic puts the union member's tag (the mode) after "load": load.concurrency.concurrency
    parts = field.split(".")
    if parts[:1] == ["load"] and len(parts) > 2:
        del parts[1]
    return ".".join(parts)
