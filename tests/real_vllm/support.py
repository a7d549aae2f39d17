"""The tier's tests find the built server through the testkit (batchscope/testkit/vllm.py); without it they are
skipped, saying how to get it (`make test` builds it and sets BATCHSCOPE_REAL_VLLM)."""

from __future__ import annotations

import pytest

from batchscope.testkit.vllm import ENV_VAR, SERVED_NAME, TIER_FLAGS, Tier, VllmServer

__all__ = ["SERVED_NAME", "TIER_FLAGS", "VllmServer", "tier"]


def tier() -> Tier:
    found = Tier.from_env()
    if found is None:
        pytest.skip(f"{ENV_VAR} is not set: `make test` sets it (scripts/real-vllm-setup builds the server)")
    return found
