"""What one tuning run leaves behind: the client's figures, the server's signals, and where they came from.

A RunResult is written as `results/<plan>/<run>/run.json` (atomically: a temporary file renamed into place, so a
run directory either has a complete run.json or is not finished). Real-time runs fill it from the load
generator's summary and records and from vLLM's /metrics read before, during and after the window; what-if runs
fill the same fields from the simulator's virtual clock. Units are seconds, tokens and requests.
"""

from __future__ import annotations

import contextlib
import errno
import os
import platform
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal, NotRequired, TypedDict

from pydantic import BaseModel, Field

from batchscope.loadgen import Distribution, WorkloadSpec
from batchscope.runs.provenance import Provenance
from batchscope.tuner.plan import ServingParams, run_name
from batchscope.vllm.catalogue import (
    ADMISSION_REJECTIONS,
    CACHE_CONFIG_INFO,
    GENERATION_TOKENS,
    ITERATION_TOKENS,
    KV_CACHE_USAGE,
    NUM_PREEMPTIONS,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    PROMPT_TOKENS,
    REQUEST_DECODE_TIME,
    REQUEST_PREFILL_TIME,
    REQUEST_QUEUE_TIME,
    REQUEST_SUCCESS,
)

# 2: a knob in params may be None (not passed, vLLM's default applied) and `reported` holds what the server chose;
# a failed start records its command line. Version 1 files (every knob passed) load as they are.
SCHEMA_VERSION: Final = 2
RUN_FILE = "run.json"
PLAN_FILE = "plan.json"  # the plan, beside its runs: the report reads it


class ClientFigures(BaseModel):
    """The load generator's view of the measurement window (vllm bench serve's definitions)."""

    ttft: Distribution = Field(description="Time to first token of completed requests, seconds.")
    tpot: Distribution = Field(description="Time per output token, (E2E - TTFT) / (tokens - 1), seconds.")
    itl: Distribution = Field(description="Inter-token latency, every gap pooled, seconds.")
    e2e: Distribution = Field(description="End-to-end latency, seconds.")
    completion_throughput_rps: float = Field(description="Requests completed ok in the window / window, req/s.")
    output_tokens_per_s: float = Field(description="Output tokens that arrived in the window / window.")
    completed: int = Field(description="Requests completed ok in the window.")
    errors: int = Field(description="Requests that ended in a failure outcome in the window.")
    window_s: float = Field(description="Measurement window length, seconds.")
    good_completed: int | None = Field(None, description="Of the completed requests, those whose own TTFT and TPOT "
                                       "met the plan's SLOs (vLLM bench serve's goodput rule; None: recorded "
                                       "before it was counted).")
    goodput_rps: float | None = Field(None, description="good_completed / window, req/s (None as above).")
    rejected: dict[str, int] = Field(default_factory=dict, description="Requests vLLM's admission check refused "
                                     "(HTTP 503, the load generator's outcome rejected_busy) that ended in the "
                                     "window, by reason (max_num_queued_reqs, max_num_queued_tokens): in neither "
                                     "completed nor errors.")
    rejected_share: float | None = Field(None, description="Those / every request that ended in the window "
                                         "(completed + errors + rejected), 0-1 (None: none ended in it, or recorded "
                                         "before it was counted).")
    prefill_tokens_per_s: float | None = Field(None, description="Prompt tokens of the requests whose first token "
                                               "arrived in the window / window: the server's prefill throughput "
                                               "as the client sees it (None: recorded before it was counted).")

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())


class RequestSamples(BaseModel):
    """Per-request values of the window's completed requests, for confidence intervals across requests."""

    ttft_s: list[float] = Field(default_factory=list, description="TTFT of each completed request, seconds.")
    tpot_s: list[float] = Field(default_factory=list, description="TPOT of each completed request, seconds.")
    itl_s: list[float] = Field(default_factory=list, description="Mean ITL of each completed request, seconds.")
    e2e_s: list[float] = Field(default_factory=list, description="E2E of each completed request, seconds.")


class ServerSignals(BaseModel):
    """vLLM's side of the window, from /metrics deltas and samples (vLLM's own definitions)."""

    preemptions: float = Field(description=f"Increase of {NUM_PREEMPTIONS.exposed_name} over the window.")
    prompt_tokens: float = Field(description=f"Increase of {PROMPT_TOKENS.exposed_name} over the window.")
    generation_tokens: float = Field(description=f"Increase of {GENERATION_TOKENS.exposed_name} over the "
                                     "window.")
    requests_finished: float = Field(description=f"Increase of {REQUEST_SUCCESS.exposed_name} (all reasons but "
                                     "abort).")
    queue_time_mean_s: float | None = Field(description=f"Mean {REQUEST_QUEUE_TIME.name} in the window.")
    prefill_time_mean_s: float | None = Field(description=f"Mean {REQUEST_PREFILL_TIME.name} in the window.")
    decode_time_mean_s: float | None = Field(description=f"Mean {REQUEST_DECODE_TIME.name} in the window.")
    tokens_per_step_mean: float | None = Field(description=f"Mean {ITERATION_TOKENS.name} in the window.")
    max_waiting: float = Field(description=f"Largest {NUM_REQUESTS_WAITING.name} sampled in the window.")
    max_running: float = Field(description=f"Largest {NUM_REQUESTS_RUNNING.name} sampled in the window.")
    kv_usage_peak: float = Field(description=f"Largest {KV_CACHE_USAGE.name} sampled in the window (0-1).")
    kv_usage_mean: float = Field(description=f"Mean {KV_CACHE_USAGE.name} over the window's samples (0-1).")
    kv_capacity_tokens: int | None = Field(description="Tokens the KV cache holds (vLLM's '<device> KV cache "
                                           "size' line, e.g. 'GPU KV cache size', 'CPU KV cache size').")
    prefix_cache_queries: float | None = Field(None, description=f"Increase of {PREFIX_CACHE_QUERIES.exposed_name} "
                                               "over the window: prompt tokens looked up in the prefix cache (None: "
                                               "not exposed, or a run recorded before it was).")
    prefix_cache_hits: float | None = Field(None, description=f"Increase of {PREFIX_CACHE_HITS.exposed_name} over "
                                            "the window: of those, tokens found cached (None as above).")
    prefix_cache_hit_rate: float | None = Field(None, description="prefix_cache_hits / prefix_cache_queries (0-1, "
                                                "vLLM's definition); None when nothing was queried.")
    admission_rejections: float | None = Field(None, description=f"Increase of "
                                               f"{ADMISSION_REJECTIONS.exposed_name} over the window, every reason "
                                               "(None: not exposed, a vLLM before 0.32, or a run recorded before it "
                                               "was read).")


class ServerReport(BaseModel):
    """What the server said about itself once it answered /health: the values vLLM chose, knobs left unset
    included (None: the server did not tell)."""

    vllm_version: str | None = Field(None, description="GET /version's version, e.g. '0.32.0'.")
    block_size: int | None = Field(None, description=f"{CACHE_CONFIG_INFO.name}'s block_size: tokens per KV block.")
    num_gpu_blocks: int | None = Field(None, description=f"{CACHE_CONFIG_INFO.name}'s num_gpu_blocks: KV blocks "
                                       "(on the device the cache is on, CPU included).")
    gpu_memory_utilization: float | None = Field(None, description=f"{CACHE_CONFIG_INFO.name}'s "
                                                 "gpu_memory_utilization.")
    max_model_len: int | None = Field(None, description="GET /v1/models' max_model_len (None when it asks for "
                                      "a key).")
    kv_capacity_tokens: int | None = Field(None, description="Tokens the KV cache holds: the start-up log's "
                                           "'<device> KV cache size' line, else cache_config_info's "
                                           "kv_cache_size_tokens, else num_gpu_blocks x block_size.")


def hit_rate(queries: float | None, hits: float | None) -> float | None:
    """The prefix cache's hit rate, vLLM's way (hit tokens / queried tokens); None when nothing was queried."""
    return hits / queries if queries and hits is not None else None


class RunResult(Provenance):
    """One run of one setting: what was started, under which conditions, and what it measured."""

    schema_version: Literal[1, 2] = Field(SCHEMA_VERSION, description="Bumped when a field changes meaning (see "
                                          "SCHEMA_VERSION); older versions still load.")
    python: str = Field(platform.python_version(), description="Python version of the tuner.")
    plan: str = Field(description="Plan name.")
    setting: str = Field(description="'baseline' or the variation's name.")
    repeat: int = Field(ge=0, description="Repeat index, from 0.")
    mode: Literal["real-time", "what-if"] = Field(description="Measured in real time, or on the virtual clock.")
    params: ServingParams = Field(description="The serving parameters of this run (None: not passed).")
    conditions: WorkloadSpec = Field(description="The locked workload (warm-up and window included).")
    command_line: list[str] = Field(default_factory=list, description="The server's command line, as run "
                                    "(secrets masked); also for a start that failed.")
    reported: ServerReport | None = Field(None, description="What the server chose, read back after the start "
                                          "(None: it did not start, a what-if run, or schema version 1).")
    started_at: str = Field(description="Run start, ISO 8601 UTC.")
    finished_at: str = Field(description="Run end, ISO 8601 UTC.")
    status: Literal["ok", "failed"] = Field(description="'failed': the server did not start or the load failed.")
    failure: str | None = Field(None, description="One line saying why a run failed.")
    log_tail: list[str] = Field(default_factory=list, description="Last lines of the server's log (failed runs).")
    client: ClientFigures | None = Field(None, description="The client's figures (None when failed).")
    server: ServerSignals | None = Field(None, description="The server's signals (None when failed).")
    samples: RequestSamples = Field(default_factory=RequestSamples, description="Per-request values.")
    prometheus: dict[str, float | None] = Field(default_factory=dict,
                                                description="Prometheus query results over the window, by name.")

    @property
    def run_name(self) -> str:
        return run_name(self.setting, self.repeat)


class RunStart(TypedDict):
    """The RunResult fields known when a run starts, shared by its every outcome (failed start, failed or ok)."""

    plan: str
    setting: str
    repeat: int
    mode: Literal["real-time", "what-if"]
    params: ServingParams
    conditions: WorkloadSpec
    started_at: str
    command_line: NotRequired[list[str]]
    reported: NotRequired[ServerReport]


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


class CannotWrite(OSError):
    """The OS refused a results file or folder: ``filename`` is the one meant, ``strerror`` the OS's reason."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


def check_writable(folder: Path) -> None:
    """Create the folder (and its parents) unless it is there, and a file in it, dropped at once: CannotWrite
    before anything runs, rather than a traceback at the first file a run writes."""
    try:
        if folder.exists() and not folder.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(folder))
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise CannotWrite(exc.errno, exc.strerror, str(folder)) from None


def write_atomically(path: Path, text: str) -> None:
    """Write a file so that readers see the old content or the whole new one, never a part (crash-safe);
    CannotWrite naming the file when the OS refuses (its temporary removed)."""
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):  # there may be none, or one that cannot be removed either
            temporary.unlink()
        raise CannotWrite(exc.errno, exc.strerror, str(path)) from None


def save(result: RunResult, plan_dir: Path) -> Path:
    path = plan_dir / result.run_name / RUN_FILE
    write_atomically(path, result.model_dump_json(indent=2))
    return path


def load_results(plan_dir: Path) -> list[RunResult]:
    """Every finished run of a plan, in folder order."""
    return [RunResult.model_validate_json(path.read_text()) for path in sorted(plan_dir.glob(f"*/{RUN_FILE}"))]
