"""The tier's tests find the built server through the testkit (batchscope/testkit/vllm.py); without it they are
skipped, saying how to get it (`make test` builds it and sets BATCHSCOPE_REAL_VLLM)."""

from __future__ import annotations

import pytest

from batchscope.testkit.vllm import ENV_VAR, SERVED_NAME, TIER_FLAGS, Tier, VllmServer

__all__ = ["SERVED_NAME", "SHARED_FLAGS", "TIER_FLAGS", "VllmServer", "tier"]

# The shared server: 8 sequences per step, 1,024 tokens per step and per request, 1 GiB of KV cache
SHARED_FLAGS = ("--max-model-len", "1024", "--max-num-seqs", "8", "--max-num-batched-tokens", "1024")


def tier() -> Tier:
    found = Tier.from_env()
    if found is None:
        pytest.skip(f"{ENV_VAR} is not set: `make test` sets it (scripts/real-vllm-setup builds the server)")
    return found
