"""Step-time cost model: how long one engine step of a given batch takes on the profiled GPU.

A step runs two kinds of kernels one after the other, each priced by a roofline (the slower of its compute
and its memory traffic, as Vidur and BLIS do in their analytic modes):
- the linear layers: 2 x matmul_params FLOPs per scheduled token, against reading the weights once;
- attention: FLOPs for each new token over its context, against reading the KV cache of every scheduled
  request. Decode attention is memory-bound, so every step pays for the KV of every running request.
Plus a fixed per-step overhead and a CPU cost per scheduled request. The profile's efficiency factors are
fitted to measured vLLM figures.
"""

from __future__ import annotations

import numpy as np

from batchscope.simulator.profile import Profile


class StepCostModel:
    """Prices a batch, given per-request new tokens and the context already computed before the step."""

    def __init__(self, profile: Profile) -> None:
        self._overhead = profile.step_overhead_s
        self._per_request = profile.step_per_request_s
        self._flops_per_token = 2.0 * profile.matmul_params
        self._attn_flops = profile.attention_flops_per_token_pair
        self._flops_rate = profile.peak_flops * profile.compute_efficiency
        self._weight_bytes = float(profile.weight_bytes)
        self._kv_bytes = float(profile.kv_bytes_per_token)
        self._byte_rate = profile.memory_bandwidth * profile.bandwidth_efficiency

    def step_seconds(self, new_tokens: np.ndarray, context: np.ndarray) -> float:
        """Duration of one step scheduling ``new_tokens[i]`` tokens on top of ``context[i]`` computed ones."""
        total_new = float(new_tokens.sum())
        # each new token attends to the context plus the new tokens before it (causal)
        pairs = float((new_tokens * (context + (new_tokens + 1) / 2.0)).sum())
        linear = max(self._flops_per_token * total_new / self._flops_rate, self._weight_bytes / self._byte_rate)
        kv_read = self._kv_bytes * float((context + new_tokens).sum())
        attention = max(self._attn_flops * pairs / self._flops_rate, kv_read / self._byte_rate)
        return self._overhead + self._per_request * new_tokens.size + linear + attention
