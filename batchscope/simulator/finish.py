"""Why a request ended: the engine's finish codes and the ``finished_reason`` names vLLM gives them.

The engine ends requests by length or stop only; vLLM's other label values (batchscope.vllm.catalogue's
FINISHED_REASONS: abort, error, repetition) stay at 0, and a client disconnect is counted under none, as in 0.32.
"""

from __future__ import annotations

REASON_LENGTH, REASON_STOP = 0, 1  # the engine's codes, in its per-step arrays
REASON_NAMES = ("length", "stop")  # REASON_NAMES[code]: the name the API and the metrics use
