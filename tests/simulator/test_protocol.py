"""Unit tests of the pure OpenAI layer: request parsing and validation (protocol) and response shapes (responses).

No server: bodies in, validated requests, ApiErrors or rendered text out, in milliseconds.
"""

from __future__ import annotations

import json

import pytest

from batchscope.simulator import tokenizer
from batchscope.simulator.config import ServeConfig
from batchscope.simulator.faults import FaultInjector
from batchscope.simulator.protocol import (
    ApiError,
    GenerationRequest,
    ServedModel,
    detokenize_ids,
    generation_request,
    require_object,
    tokenize_ids,
)
from batchscope.simulator.responses import SseFormatter, completion_body, models_body, sse_tail

SERVED = ServedModel(("served", "org/model"), max_model_len=64, vocab_size=8000)


def error_of(body: dict, chat: bool = False) -> ApiError:
    with pytest.raises(ApiError) as caught:
        generation_request(body, chat, SERVED)
    return caught.value


def test_a_completion_defaults_to_16_tokens_and_counts_bos():
    gen = generation_request({"prompt": "hello there world"}, False, SERVED)
    assert gen.prompt_ids[0] == tokenizer.BOS_ID and len(gen.prompt_ids) == 4
    assert (gen.max_tokens, gen.stream, gen.include_usage, gen.ignore_eos) == (16, False, False, False)


def test_a_chat_defaults_to_filling_the_context_and_prefers_max_completion_tokens():
    messages = [{"role": "user", "content": "hi"}]
    gen = generation_request({"messages": messages}, True, SERVED)
    assert gen.max_tokens == SERVED.max_model_len - len(gen.prompt_ids)
    both = generation_request({"messages": messages, "max_tokens": 9, "max_completion_tokens": 3}, True, SERVED)
    assert both.max_tokens == 3


def test_lax_types_as_vllm_reads_them():
    gen = generation_request({"prompt": [1, 2], "max_tokens": "5", "stream": "true",
                              "stream_options": {"include_usage": True}}, False, SERVED)
    assert (gen.prompt_ids, gen.max_tokens, gen.stream, gen.include_usage) == ([1, 2], 5, True, True)


@pytest.mark.parametrize(("body", "status", "param", "text"), [
    ({"prompt": "x", "model": "other"}, 404, "model", "The model `other` does not exist."),
    ({"prompt": "x", "stream": "maybe"}, 400, None, "1 validation error"),
    ({"prompt": []}, 400, "prompt", "The decoder prompt cannot be empty"),
    ({"prompt": [5, 12000, 9000]}, 400, None, "Token id 12000 is out of vocabulary"),
    ({"prompt": [5, -1]}, 400, "body.prompt.1", "Input should be greater than or equal to 0"),
    ({"prompt": 5}, 400, "prompt", "prompt must be a string or a list of token ids"),
    ({"prompt": "x", "max_tokens": 65}, 400, "max_tokens",
     "max_tokens=65 cannot be greater than max_model_len=64. Please request fewer output tokens. "
     "(parameter=max_tokens, value=65)"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens",
     "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"),
    ({"prompt": "x", "n": 2}, 400, "n", "n must be 1"),
    ({"prompt": "x", "top_p": 0}, 400, "top_p", "top_p must be in (0, 1], got 0.0. (parameter=top_p, value=0.0)"),
    ({"prompt": "x", "temperature": -1}, 400, "temperature",
     "temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)"),
])
def test_bad_completion_requests_get_vllms_status_and_message(body, status, param, text):
    error = error_of(body)
    assert (error.status, error.param) == (status, param)
    assert text in error.message
    assert error.body()["error"]["code"] == status


def test_the_vocabulary_is_the_served_models_and_its_refusal_comes_in_the_stream_after_every_other_check():
    assert generation_request({"prompt": [0, 7999], "max_tokens": 1}, False, SERVED).prompt_ids == [0, 7999]
    streamed = error_of({"prompt": [8000], "max_tokens": 1, "stream": True})
    assert streamed.in_stream and streamed.body() == {"error": {
        "message": "Token id 8000 is out of vocabulary", "type": "BadRequestError", "param": None, "code": 400}}
    assert not error_of({"prompt": [8000], "max_tokens": 1}).in_stream
    # vLLM checks sampling before its engine sees the ids: that 400 comes first, stream or not
    first = error_of({"prompt": [8000], "max_tokens": 1, "stream": True, "top_p": 0})
    assert (first.param, first.in_stream) == ("top_p", False)
    # a tokenizer's own ids (text prompts, chat) are not checked against the served vocabulary
    assert generation_request({"prompt": "one two"}, False, SERVED).prompt_ids[0] == tokenizer.BOS_ID


def test_a_chat_needs_a_list_of_messages():
    assert error_of({"messages": "hi"}, chat=True).param == "messages"


def test_output_that_would_pass_max_model_len_is_cut_not_refused():
    """vLLM 0.32 cuts max_tokens to what the context leaves (real-parts.md §1: 2000 + 100 at 2048 -> 48 tokens)."""
    assert generation_request({"prompt": [5] * 60, "max_tokens": 10}, False, SERVED).max_tokens == 4
    assert generation_request({"prompt": [5] * 60}, False, SERVED).max_tokens == 4  # the default 16, cut
    assert generation_request({"prompt": [5] * 63, "max_tokens": 64}, False, SERVED).max_tokens == 1
    chat = {"messages": [{"role": "user", "content": "a b c"}], "max_completion_tokens": 64}
    gen = generation_request(chat, True, SERVED)
    assert gen.max_tokens == SERVED.max_model_len - len(gen.prompt_ids)


def test_min_tokens_is_checked_against_the_cut_max_tokens():
    error = error_of({"prompt": [5] * 60, "max_tokens": 10, "min_tokens": 5})
    assert (error.status, error.param) == (400, None)
    assert error.message == "min_tokens must be less than or equal to max_tokens=4, got 5."
    assert error_of({"prompt": "x", "max_tokens": 3, "min_tokens": 5}).message == \
        "min_tokens must be less than or equal to max_tokens=3, got 5."


def test_a_prompt_that_fills_the_context_leaves_no_output_and_is_refused_as_vllm_does():
    full = error_of({"prompt": [5] * 64, "max_tokens": 10})
    assert (full.status, full.param) == (400, "max_tokens")
    assert full.message == "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"
    over = error_of({"prompt": [5] * 65})
    assert (over.status, over.param) == (400, "input_tokens")
    assert over.message == ("This model's maximum context length is 64 tokens. However, your prompt contains 65 "
                            "input tokens, which exceeds this limit even without any output tokens. Please reduce "
                            "the length of the input prompt. (parameter=input_tokens, value=65)")
    # text is tokenized with truncation at max_model_len + 1, so vLLM says "at least"
    for body, chat in (({"prompt": " ".join(["w"] * 200)}, False),
                       ({"messages": [{"role": "user", "content": " ".join(["w"] * 200)}]}, True)):
        error = error_of(body, chat)
        assert error.param == "input_tokens" and "your prompt contains at least 65 input tokens" in error.message
        assert error.message.endswith("(parameter=input_tokens, value=65)")


def test_max_tokens_over_max_model_len_is_refused_before_the_prompt_is_read():
    error = error_of({"prompt": [5] * 100, "max_tokens": 200})
    assert error.param == "max_tokens" and error.message.startswith("max_tokens=200 cannot be greater than")
    chat = error_of({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 65}, chat=True)
    assert chat.param == "max_completion_tokens"
    assert chat.message == ("max_completion_tokens=65 cannot be greater than max_model_len=64. Please request "
                            "fewer output tokens. (parameter=max_completion_tokens, value=65)")


def test_tokenize_and_detokenize_bodies():
    assert tokenize_ids({"prompt": "a b", "add_special_tokens": False}) == tokenizer.encode("a b", add_bos=False)
    assert tokenize_ids({"messages": [{"role": "system", "content": "a"}]})[0] == tokenizer.BOS_ID
    assert detokenize_ids({"tokens": [5, 7]}) == [5, 7]
    with pytest.raises(ApiError):
        detokenize_ids({"tokens": [-1]})
    with pytest.raises(ApiError, match="JSON object"):
        require_object([1])


def request(chat: bool, stream: bool = True) -> GenerationRequest:
    return GenerationRequest(chat, [1, 2, 3], 4, 0, True, stream, True)


def events(text: str) -> list[dict | str]:
    out: list[dict | str] = []
    for block in text.split("\n\n"):
        if block:
            payload = block.removeprefix("data: ")
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


@pytest.mark.parametrize("chat", [False, True])
def test_sse_chunks_parse_as_vllms_and_end_with_usage_then_done(chat):
    sse = SseFormatter(chat, "id-1", 100, "served")
    body = sse.tokens(seed=7, sent=0, produced=2, finish_reason=None) + sse.tokens(7, 2, 3, "length")
    body += sse_tail(sse, prompt_tokens=3, completion_tokens=3, include_usage=True)
    chunks = events(body)
    assert chunks[-1] == "[DONE]"
    usage = chunks[-2]
    assert isinstance(usage, dict) and usage["choices"] == [] and usage["usage"]["total_tokens"] == 6
    tokens = [c for c in chunks[:-2] if isinstance(c, dict)]
    if chat:
        assert tokens[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        tokens = tokens[1:]
        texts = [c["choices"][0]["delta"]["content"] for c in tokens]
    else:
        texts = [c["choices"][0]["text"] for c in tokens]
    assert texts == [tokenizer.output_text(7, i, False) for i in (1, 2, 3)]
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None, None, "length"]
    assert {c["object"] for c in tokens} == {"chat.completion.chunk" if chat else "text_completion"}


def test_an_eos_token_has_no_text():
    sse = SseFormatter(False, "id", 1, "m")
    last = events(sse.tokens(3, 0, 2, "stop"))[-1]
    assert isinstance(last, dict) and last["choices"][0] == {
        "index": 0, "text": "", "logprobs": None, "finish_reason": "stop", "stop_reason": None}


@pytest.mark.parametrize("chat", [False, True])
def test_a_complete_body_holds_the_text_and_usage(chat):
    body = completion_body(request(chat, stream=False), "id", 5, "served", seed=2, produced=3, finish_reason="length")
    choice = body["choices"][0]
    text = choice["message"]["content"] if chat else choice["text"]
    assert text == "".join(tokenizer.output_text(2, i, False) for i in (1, 2, 3))
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 6, "completion_tokens": 3,
                             "prompt_tokens_details": None}
    assert body["object"] == ("chat.completion" if chat else "text_completion")


def test_the_models_card_names_the_served_model_and_its_root():
    card = models_body("served", "org/model", 10, 64)["data"][0]
    assert (card["id"], card["root"], card["max_model_len"], card["owned_by"]) == ("served", "org/model", 64, "vllm")


def test_faults_are_drawn_from_the_seed_and_only_streams_are_cut():
    config = ServeConfig(model="m", fault_error_rate=0.2, fault_cut_rate=0.5, fault_stall_rate=0.1, seed=3)
    one, two = FaultInjector(config), FaultInjector(config)
    assert [one.draw(True, 10) for _ in range(50)] == [two.draw(True, 10) for _ in range(50)]
    injector = FaultInjector(config)
    many = [injector.draw(stream=False, max_tokens=10) for _ in range(200)]
    assert all(f.cut_after is None for f in many)
    assert 10 < sum(f.error for f in many) < 70
    streams = FaultInjector(config)
    cut = [f.cut_after for f in (streams.draw(True, 10) for _ in range(200)) if f.cut_after is not None]
    assert cut and set(cut) == {5}
