"""Engine statistics with vLLM's definitions and bucket boundaries, accumulated in arrays.

The engine core records every event here, vectorised per step; the /metrics collector turns the totals into
vLLM's Prometheus families at scrape time. The definitions (vllm/v1/metrics/stats.py's): docs/simulator.md,
"Engine statistics".
"""

from __future__ import annotations

import numpy as np

from batchscope.stats.histogram import Histogram
from batchscope.vllm.buckets import (
    ITERATION_TOKEN_BUCKETS,
    ITL_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    REQUEST_NUM_PREEMPTIONS_BUCKETS,
    TTFT_BUCKETS,
    build_1_2_5_buckets,
)
from batchscope.vllm.catalogue import FINISHED_REASONS, PROMPT_TOKEN_SOURCES


class EngineStats:
    """Everything the engine counts, named after the vLLM metric it feeds."""

    def __init__(self, max_model_len: int) -> None:
        token_buckets = build_1_2_5_buckets(max_model_len)
        self.num_preemptions = 0
        self.prompt_tokens = 0
        self.prompt_tokens_cached = 0  # of those, found in the prefix cache at the request's first scheduling
        self.generation_tokens = 0
        self.prefix_cache_queries = 0  # tokens looked up in the prefix cache
        self.prefix_cache_hits = 0  # of those, tokens found cached
        self.request_success = dict.fromkeys(FINISHED_REASONS, 0)
        self.requests_aborted = 0  # not a vLLM metric: 0.32 counts a client disconnect nowhere
        self.iteration_tokens = Histogram(ITERATION_TOKEN_BUCKETS)
        self.time_to_first_token = Histogram(TTFT_BUCKETS)
        self.inter_token_latency = Histogram(ITL_BUCKETS)
        self.request_time_per_output_token = Histogram(ITL_BUCKETS)
        self.e2e_request_latency = Histogram(REQUEST_LATENCY_BUCKETS)
        self.request_queue_time = Histogram(REQUEST_LATENCY_BUCKETS)
        self.request_inference_time = Histogram(REQUEST_LATENCY_BUCKETS)
        self.request_prefill_time = Histogram(REQUEST_LATENCY_BUCKETS)
        self.request_decode_time = Histogram(REQUEST_LATENCY_BUCKETS)
        self.request_prompt_tokens = Histogram(token_buckets)
        self.request_generation_tokens = Histogram(token_buckets)
        self.request_params_max_tokens = Histogram(token_buckets)
        self.request_num_preemptions = Histogram(REQUEST_NUM_PREEMPTIONS_BUCKETS)
        self.request_prefill_kv_computed_tokens = Histogram(token_buckets)

    def record_tokens(self, ttft: np.ndarray, itl: np.ndarray, prompt_tokens_of_first: int,
                      cached_tokens_of_first: int) -> None:
        """One step's new tokens: first tokens (with their TTFT) and decode tokens (with their ITL)."""
        new_tokens = ttft.size + itl.size
        self.generation_tokens += new_tokens
        # vLLM counts a request's prompt tokens once, in the step that yields its first token
        self.prompt_tokens += prompt_tokens_of_first
        self.prompt_tokens_cached += cached_tokens_of_first
        # vLLM observes a step only when it yields a token (a step of prefill chunks alone has no outputs), and
        # counts the prompt tokens it computed, not those found cached
        if new_tokens:
            self.iteration_tokens.observe(prompt_tokens_of_first - cached_tokens_of_first + new_tokens)
        self.time_to_first_token.observe_many(ttft)
        self.inter_token_latency.observe_many(itl)

    def record_finished(
        self,
        reason: str,
        arrival: np.ndarray,
        scheduled: np.ndarray,
        first_token: np.ndarray,
        last_token: np.ndarray,
        now: float,
        prompt_tokens: np.ndarray,
        generation_tokens: np.ndarray,
        max_tokens: np.ndarray,
        preemptions: np.ndarray,
        cached_tokens: np.ndarray,
    ) -> None:
        """Requests that finished with ``reason`` at ``now`` (arrays, one entry per request)."""
        self.request_success[reason] += int(arrival.size)
        if arrival.size == 0:
            return
        decode = last_token - first_token
        steps = generation_tokens - 1
        tpot = np.divide(decode, steps, out=np.zeros_like(decode), where=steps > 0)
        self.e2e_request_latency.observe_many(now - arrival)
        self.request_queue_time.observe_many(scheduled - arrival)
        self.request_prefill_time.observe_many(first_token - scheduled)
        self.request_decode_time.observe_many(decode)
        self.request_inference_time.observe_many(last_token - scheduled)
        self.request_time_per_output_token.observe_many(tpot)
        self.request_prompt_tokens.observe_many(prompt_tokens)
        self.request_generation_tokens.observe_many(generation_tokens)
        self.request_params_max_tokens.observe_many(max_tokens)
        self.request_num_preemptions.observe_many(preemptions)
        self.request_prefill_kv_computed_tokens.observe_many(prompt_tokens - cached_tokens)

    def prompt_tokens_by_source(self) -> dict[str, int]:
        """vllm:prompt_tokens_by_source: the prompt tokens computed, found cached, or transferred (never here)."""
        counts = (self.prompt_tokens - self.prompt_tokens_cached, self.prompt_tokens_cached, 0)
        return dict(zip(PROMPT_TOKEN_SOURCES, counts, strict=True))

    def record_prefix_cache(self, queried_tokens: int, hit_tokens: int) -> None:
        """One lookup of a request being admitted (vLLM counts every lookup, a re-admission's too)."""
        self.prefix_cache_queries += queried_tokens
        self.prefix_cache_hits += hit_tokens

    def record_aborted(self, count: int) -> None:
        """Requests aborted (their client gone): in no vLLM series (0.32), their partial timings unobserved."""
        self.requests_aborted += count
