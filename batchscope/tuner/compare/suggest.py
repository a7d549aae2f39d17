"""A computed max_num_queued_tokens per setting: vLLM's guidance, T = TTFT target x prefill throughput.

Pure: the plan's p99 TTFT bound and each setting's measured prefill throughput (vLLM's prompt_tokens_total rate
over the window, else the client's prompt tokens first answered there) in, the value and its inputs out.
Why each input: docs/tuner.md (Suggested max_num_queued_tokens).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

from batchscope.tuner.compare.metrics import Measured, mean_present
from batchscope.tuner.plan import Slos
from batchscope.vllm.catalogue import PROMPT_TOKENS

Source = Literal["server", "client"]
SOURCE_TEXT: dict[Source, str] = {
    "server": f"the server's {PROMPT_TOKENS.exposed_name} increase over the window / window",
    "client": "the client's prompt tokens of the requests first answered in the window / window",
}


class QueuedTokensSuggestion(BaseModel):
    """max_num_queued_tokens for one setting, with what it was computed from."""

    setting: str = Field(description="The setting whose prefill throughput was measured.")
    ttft_target_s: float = Field(description="The plan's p99 TTFT bound (slos.ttft_p99_s), seconds.")
    prefill_tokens_per_s: float = Field(description="Prompt tokens the server prefilled per second in the window, "
                                        "mean over the setting's ok runs.")
    source: Source = Field(description="Where the throughput was measured: the server's /metrics (vLLM's "
                           "prompt_tokens_total) or, when it had none, the client's records.")
    source_text: str = Field(description="The source in words.")
    max_num_queued_tokens: int = Field(description="ttft_target_s x prefill_tokens_per_s, rounded down.")


def prefill_rate(runs: list[Measured]) -> tuple[float, Source] | None:
    """The runs' mean prefill throughput and its source: the server's when it counted any prompt token."""
    server = mean_present([r.server.prompt_tokens / r.client.window_s for r in runs if r.client.window_s > 0])
    if server:
        return server, "server"
    client = mean_present([r.client.prefill_tokens_per_s for r in runs])
    return (client, "client") if client else None


def suggest_queued_tokens(setting: str, runs: list[Measured], slos: Slos) -> QueuedTokensSuggestion | None:
    """The suggestion for one setting, or None without a TTFT bound or a measured prefill throughput."""
    rate = prefill_rate(runs)
    if slos.ttft_p99_s is None or rate is None:
        return None
    tokens_per_s, source = rate
    return QueuedTokensSuggestion(setting=setting, ttft_target_s=slos.ttft_p99_s, prefill_tokens_per_s=tokens_per_s,
                                  source=source, source_text=SOURCE_TEXT[source],
                                  max_num_queued_tokens=math.floor(slos.ttft_p99_s * tokens_per_s))
