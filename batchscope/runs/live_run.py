"""The live file: where the run being measured is, written by `batchscope tune --live-file F` at every run's
start and followed by `batchscope exporter --follow F`, so the live dashboards show each run of a plan.

One small JSON object (LiveRun), replaced atomically (a reader sees the old run or the new one, never a part):
the server's base URL, the load generator's metrics URL, the server's command line (secrets masked) and which
run it is. The exporter re-reads it at every scrape and reads at most MAX_BYTES of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from batchscope.inputs.secrets import mask_argv

SCHEMA_VERSION: Final = 1
MAX_BYTES: Final = 64 * 1024  # a command line and three names: far below; a bigger file is not a live file


class LiveFileError(ValueError):
    """The live file cannot be used; the message is one line and never holds the file's text."""


class LiveRun(BaseModel):
    """The run being measured now."""

    model_config = ConfigDict(extra="ignore")  # a newer tuner may add fields: an older exporter still follows

    schema_version: int = Field(SCHEMA_VERSION, description="Live file format version.")
    vllm_url: str = Field(description="Base URL of the server under test (its /metrics, /version, /v1/models).")
    loadgen_url: str | None = Field(None, description="Base URL of the load generator's client metrics, if any.")
    command_line: list[str] = Field(default_factory=list, description="The server's command line, secrets masked.")
    plan: str = Field(description="Plan name.")
    setting: str = Field(description="'baseline' or the variation's name.")
    repeat: int = Field(ge=0, description="Repeat index, from 0.")
    started_at: str = Field(description="When the run started, ISO 8601 UTC.")

    @field_validator("vllm_url", "loadgen_url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("must be an http:// or https:// URL")
        return url.rstrip("/")

    @field_validator("command_line")
    @classmethod
    def _masked(cls, argv: list[str]) -> list[str]:
        return mask_argv(argv)  # the writer masks already; a hand-written file must not leak a key either


def read_live_file(path: Path) -> LiveRun:
    """The live file's run; LiveFileError (one line, naming the file, not its content) when it cannot be used."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise LiveFileError(f"cannot read {path} ({exc.strerror})") from None
    if len(data) > MAX_BYTES:
        raise LiveFileError(f"{path} is over {MAX_BYTES} bytes: not a live file")
    try:
        return LiveRun.model_validate_json(data)
    except ValidationError as exc:
        where = ".".join(str(part) for part in exc.errors()[0]["loc"]) or "the file"
        raise LiveFileError(f"{path}: {where} is not usable ({exc.errors()[0]['type']})") from None
