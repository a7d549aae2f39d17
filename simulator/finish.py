"""Why a request ended: the engine's finish codes and vLLM's ``finished_reason`` names, defined once."""

from __future__ import annotations

REASON_LENGTH, REASON_STOP = 0, 1  # the engine's codes, in its per-step arrays
REASON_NAMES = ("length", "stop")  # REASON_NAMES[code]: the name the API and the metrics use
ABORT = "abort"
# the finished_reason label values of vllm:request_success_total, in vLLM's order
FINISH_REASONS = ("stop", "length", ABORT)
