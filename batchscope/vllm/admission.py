"""vLLM's admission control (0.32): the 503 its API server answers when a queue limit refuses a request.

`AsyncLLM.check_admission` raises QueueOverflowError (`--max-num-queued-reqs`) or MaxQueuedTokensError
(`--max-num-queued-tokens`), GracefulHTTPErrors that vLLM's error handler answers with their own status, 503,
and the status's phrase as the error's type. The simulator answers with these bodies; the load generator tells
an admission 503 from any other 503 (a proxy, a server starting) by its message.
"""

from __future__ import annotations

import json
from typing import Final

from batchscope.vllm.catalogue import ADMISSION_REJECTION_REASONS

STATUS: Final = 503
ERROR_TYPE: Final = "Service Unavailable"  # HTTPStatus(503).phrase, as create_error_response types it
# each reason (the label of vllm:admission_rejections_total) and the message its error carries (vllm/exceptions.py)
MESSAGES: Final = dict(zip(ADMISSION_REJECTION_REASONS, (
    "The engine is currently busy and cannot accept new requests. Please try again later or on a different "
    "instance.",
    "The engine has reached its prefill token backlog limit. Please try again later or on a different instance.",
), strict=True))
REASON_BY_MESSAGE: Final = {message: reason for reason, message in MESSAGES.items()}


def error_body(reason: str) -> dict:
    """The JSON body vLLM answers a refused admission with."""
    return {"error": {"message": MESSAGES[reason], "type": ERROR_TYPE, "param": None, "code": STATUS}}


def reason_of(status: int | None, body: str | None) -> str | None:
    """The queue limit that refused a request, when ``status`` and ``body`` are vLLM's admission answer; None
    for any other answer (another 503 included)."""
    if status != STATUS or not body:
        return None
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    message = error.get("message") if isinstance(error, dict) else None
    return REASON_BY_MESSAGE.get(message) if isinstance(message, str) else None
