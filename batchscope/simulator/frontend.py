"""The API server's share of a request's latency: the work vLLM does outside the engine step.

vLLM V1 runs the OpenAI server (HTTP parsing, request validation, tokenization, detokenization, SSE writes) in
one process and the engine core in another, joined by ZeroMQ. A request therefore reaches the scheduler some
time after it arrived (a fixed cost plus tokenization, per prompt token), and each token reaches the client
some time after the step that sampled it (the hop back, detokenization and the write). Both drivers apply these
delays the same way: the virtual clock shifts the times it records, the real-time server waits them out.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchscope.simulator.profile import Profile


@dataclass(frozen=True)
class FrontEnd:
    """Per-request latencies outside the engine step, seconds."""

    request_s: float = 0.0  # fixed input-path cost of a request
    input_token_s: float = 0.0  # tokenization, per prompt token
    output_s: float = 0.0  # from the end of a step to the token's write

    @classmethod
    def of(cls, profile: Profile) -> FrontEnd:
        return cls(profile.frontend_request_s, profile.frontend_input_token_s, profile.frontend_output_s)

    def input_s(self, prompt_len: int) -> float:
        """From a request's arrival to when the engine core can schedule it."""
        return self.request_s + self.input_token_s * prompt_len
