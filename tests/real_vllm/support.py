"""The tier's tests find the built server through the testkit (batchscope/testkit/vllm.py); without it they are
skipped, saying how to get it (`make test` builds it and sets BATCHSCOPE_REAL_VLLM)."""

from __future__ import annotations

import pytest

from batchscope.testkit.vllm import ENV_VAR, LEAN_FLAGS, SERVED_NAME, TIER_FLAGS, Tier, VllmServer

__all__ = ["LEAN_FLAGS", "QUEUE_FLAGS", "SERVED_NAME", "SHARED_FLAGS", "TIER_FLAGS", "VllmServer", "tier"]

# The shared server: 8 sequences per step, 1,024 tokens per step and per request, 1 GiB of KV cache
SHARED_FLAGS = ("--max-model-len", "1024", "--max-num-seqs", "8", "--max-num-batched-tokens", "1024")
# The queue-knob server's, beside SHARED_FLAGS: each queue knob, the adaptive switch on, within vLLM's rules
# across knobs for 8 sequences and 1,024-token requests. Four run; waiting + running is capped at 8 requests.
QUEUE_FLAGS = ("--max-num-active-seqs", "4", "--max-num-queued-reqs", "8", "--max-num-queued-tokens", "4096",
               "--long-prefill-token-threshold", "256", "--long-prefill-token-threshold-adaptive")


def tier() -> Tier:
    found = Tier.from_env()
    if found is None:
        pytest.skip(f"{ENV_VAR} is not set: `make test` sets it (scripts/real-vllm-setup builds the server)")
    return found
