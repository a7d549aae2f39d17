"""Engine statistics with vLLM's definitions and bucket boundaries, accumulated in arrays.

The engine core records every event here (vectorised per step, so large batches stay cheap); the /metrics
collector turns the totals into vLLM's Prometheus families at scrape time. Definitions follow
``vllm/v1/metrics/stats.py``: TTFT from arrival, one ITL observation per step per decoding request, queue time
= first scheduled - queued, prefill = first token - first scheduled, decode = last token - first token,
inference = last token - first scheduled, e2e = finish - arrival, TPOT = decode / (generation tokens - 1).
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
FINISH_REASONS = ("stop", "length", "abort")


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to max_value."""
    buckets: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(buckets)
            buckets.append(value)
        exponent += 1


class Histogram:
    """A classic cumulative-bucket histogram with fixed upper bounds (``le``), fed scalars or arrays."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self._bounds = np.asarray(self.bounds)
        self.counts = np.zeros(len(self.bounds) + 1, dtype=np.int64)  # last slot is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def observe_many(self, values: np.ndarray) -> None:
        if values.size == 0:
            return
        index = np.searchsorted(self._bounds, values, side="left")
        self.counts += np.bincount(index, minlength=self.counts.size)
        self.sum += float(values.sum())

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else 0.0

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, cumulative count) pairs ending with +Inf, as prometheus_client's HistogramMetricFamily wants."""
        running = np.cumsum(self.counts)
        pairs = [(repr(b), float(c)) for b, c in zip(self.bounds, running[:-1], strict=True)]
        pairs.append(("+Inf", float(running[-1])))
        return pairs


class EngineStats:
    """Everything the engine counts, named after the vLLM metric it feeds."""

    def __init__(self, max_model_len: int) -> None:
        token_buckets = build_1_2_5_buckets(max_model_len)
        self.num_preemptions = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.request_success = dict.fromkeys(FINISH_REASONS, 0)
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

    def record_tokens(self, ttft: np.ndarray, itl: np.ndarray, prompt_tokens_of_first: int) -> None:
        """One step's new tokens: first tokens (with their TTFT) and decode tokens (with their ITL)."""
        new_tokens = ttft.size + itl.size
        self.generation_tokens += new_tokens
        # vLLM counts a request's prompt tokens once, in the step that yields its first token
        self.prompt_tokens += prompt_tokens_of_first
        self.iteration_tokens.observe(prompt_tokens_of_first + new_tokens)
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

    def record_aborted(self, count: int) -> None:
        """Aborted requests are counted by reason only; their partial timings are not observed."""
        self.request_success["abort"] += count
