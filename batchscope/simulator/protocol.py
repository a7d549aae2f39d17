"""Request bodies read as vLLM reads them: its pydantic field types, then SamplingParams' checks and messages.

Pure: a decoded JSON body in, a validated request (or an ``ApiError`` carrying vLLM's status and message) out.

Types are checked the way vLLM's pydantic models check them, in lax mode: ``"stream": "false"`` is False,
``"max_tokens": "5"`` is 5, ``"stream": "maybe"`` is an HTTP 400. vLLM answers such a type error from FastAPI's
validation handler (error type "Bad Request"), and a value SamplingParams rejects from the serving code
(error type "BadRequestError"); both keep that distinction here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from batchscope.simulator import tokenizer

Model = TypeVar("Model", bound=BaseModel)


class ApiError(Exception):
    """An error answered with vLLM's JSON error body; ``in_stream``: one vLLM's engine raises after a stream's
    200 went out, answered as an SSE error event (then [DONE]) instead."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError", param: str | None = None,
                 in_stream: bool = False):
        super().__init__(message)
        self.status, self.message, self.err_type, self.param = status, message, err_type, param
        self.in_stream = in_stream

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param, "code": self.status}}


def _param_error(message: str, param: str, value: object) -> ApiError:
    """A 400 naming the parameter, as vLLM 0.32's VLLMValidationError words it: the message, then the value."""
    return ApiError(400, f"{message} (parameter={param}, value={value})", param=param)


class _Body(BaseModel):
    # vLLM's OpenAIBaseModel accepts fields it does not know (and logs them); so do we, silently
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Body):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class GenerationFields(_Body):
    """The fields of vLLM's CompletionRequest / ChatCompletionRequest the simulator reads or checks."""

    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    n: int | None = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    repetition_penalty: float | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class TokenizeFields(_Body):
    add_special_tokens: bool = True


class DetokenizeFields(_Body):
    tokens: list[int]


def parse(model: type[Model], body: dict) -> Model:
    """``body`` as ``model``, or the 400 vLLM's RequestValidationError handler answers."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise ApiError(400, _validation_text(exc), err_type="Bad Request") from None


def _validation_text(exc: ValidationError) -> str:
    """FastAPI's text for a request validation error: the count, then one line per error at ('body', field)."""
    errors = [{"type": e["type"], "loc": ("body", *e["loc"]), "msg": e["msg"], "input": e["input"]}
              for e in exc.errors(include_url=False)]
    plural = "s" if len(errors) != 1 else ""
    return f"{len(errors)} validation error{plural}:\n" + "".join(f"  {e}\n" for e in errors)


def check_sampling(fields: GenerationFields, max_tokens: int) -> None:
    """SamplingParams._verify_args for the fields the simulator accepts, with vLLM's messages (and params)."""
    if fields.n is not None and fields.n < 1:
        raise ApiError(400, f"n must be at least 1, got {fields.n}.")
    if fields.n not in (None, 1):
        raise ApiError(400, f"n must be 1: the simulator generates one choice per request, got {fields.n}.",
                       param="n")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(fields, name)
        if value is not None and not -2.0 <= value <= 2.0:
            raise ApiError(400, f"{name} must be in [-2, 2], got {value}.")
    if fields.repetition_penalty is not None and not fields.repetition_penalty > 0.0:
        raise ApiError(400, f"repetition_penalty must be greater than zero, got {fields.repetition_penalty}.")
    if fields.temperature is not None and fields.temperature < 0.0:
        raise _param_error(f"temperature must be non-negative, got {fields.temperature}.", "temperature",
                           fields.temperature)
    if fields.top_p is not None and not 0.0 < fields.top_p <= 1.0:
        raise _param_error(f"top_p must be in (0, 1], got {fields.top_p}.", "top_p", fields.top_p)
    if fields.top_k is not None and fields.top_k < -1:  # vLLM quietly accepts -1 as "disabled"
        raise ApiError(400, f"top_k must be 0 (disable), or at least 1, got {fields.top_k}.")
    if fields.min_p is not None and not 0.0 <= fields.min_p <= 1.0:
        raise ApiError(400, f"min_p must be in [0, 1], got {fields.min_p}.")
    if max_tokens < 1:
        raise _param_error(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens)
    if fields.min_tokens < 0:
        raise ApiError(400, f"min_tokens must be greater than or equal to 0, got {fields.min_tokens}.")
    if fields.min_tokens > max_tokens:
        raise ApiError(400, f"min_tokens must be less than or equal to max_tokens={max_tokens}, "
                            f"got {fields.min_tokens}.")


@dataclass(frozen=True)
class GenerationRequest:
    """A validated completion or chat request."""

    chat: bool
    prompt_ids: list[int]
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool


@dataclass(frozen=True)
class ServedModel:
    """What a request is checked against: the names the model answers to, its context length and vocabulary."""

    names: tuple[str, ...]
    max_model_len: int
    vocab_size: int


def require_object(body: object) -> dict:
    """A decoded request body, which must be a JSON object."""
    if not isinstance(body, dict):
        raise ApiError(400, "Request body must be a JSON object.")
    return body


def generation_request(body: dict, chat: bool, served: ServedModel,
                       preflight: Callable[[int], None] | None = None) -> GenerationRequest:
    """A /v1/completions (``chat`` False) or /v1/chat/completions body, checked in vLLM 0.32's order.

    ``preflight`` runs with the request's n once the model is known, before the prompt is read, where vLLM's
    serving layer runs its admission check (``_preflight``); it raises to refuse.

    A requested output longer than max_model_len is refused before the prompt is read; a prompt that alone
    passes max_model_len is refused; otherwise max_tokens is cut to what the context leaves (no 400: vLLM 0.32
    answers prompt 2000 + max_tokens 100 at max_model_len 2048 with 48 tokens, finish_reason "length"), and
    SamplingParams' checks see the cut value (a prompt that fills the context leaves max_tokens 0).
    """
    fields = parse(GenerationFields, body)
    if fields.model is not None and fields.model not in served.names:
        raise ApiError(404, f"The model `{fields.model}` does not exist.", "NotFoundError", "model")
    if preflight is not None:
        preflight(fields.n or 1)
    limit = served.max_model_len
    name, requested = _requested_output(fields, chat)
    if requested is not None and requested > limit:
        raise _param_error(f"{name}={requested} cannot be greater than max_model_len={limit}. Please request fewer "
                           "output tokens.", name, requested)
    prompt_ids = tokenizer.encode_chat(messages(body)) if chat else prompt_token_ids(body.get("prompt"), add_bos=True)
    _check_prompt_length(prompt_ids, limit, from_text=chat or _is_text(body.get("prompt")))
    room = limit - len(prompt_ids)
    if requested is None:
        requested = room if chat else 16  # chat's default output fills the context, as vLLM's does
    max_tokens = min(requested, room)
    check_sampling(fields, max_tokens)
    if not chat and not _is_text(body.get("prompt")):  # the client's own ids; a tokenizer's are in its vocabulary
        check_vocabulary(prompt_ids, served.vocab_size, in_stream=bool(fields.stream))
    return GenerationRequest(chat, prompt_ids, max_tokens, fields.min_tokens, fields.ignore_eos,
                             bool(fields.stream), fields.include_usage)


def _requested_output(fields: GenerationFields, chat: bool) -> tuple[str, int | None]:
    """The output-length field the request set (chat prefers max_completion_tokens) and its value, if any."""
    if chat and fields.max_completion_tokens is not None:
        return "max_completion_tokens", fields.max_completion_tokens
    return "max_tokens", fields.max_tokens


def _check_prompt_length(prompt_ids: list[int], limit: int, from_text: bool) -> None:
    """vLLM 0.32's refusal of a prompt longer than the context, even with no output."""
    if not prompt_ids:
        raise ApiError(400, "The decoder prompt cannot be empty", param="prompt")
    if len(prompt_ids) <= limit:
        return
    # vLLM tokenizes text truncated at limit + 1 tokens, so it knows only that there are at least that many
    count, at_least = (limit + 1, "at least ") if from_text else (len(prompt_ids), "")
    raise _param_error(f"This model's maximum context length is {limit} tokens. However, your prompt contains "
                       f"{at_least}{count} input tokens, which exceeds this limit even without any output tokens. "
                       "Please reduce the length of the input prompt.", "input_tokens", count)


def _is_text(prompt: object) -> bool:
    """Whether a completion's prompt is text (or a one-element list of text) rather than token ids."""
    return isinstance(prompt, str) or (isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str))


def tokenize_ids(body: dict) -> list[int]:
    """The token ids /tokenize answers for a chat (``messages``) or a prompt body."""
    if "messages" in body:
        return tokenizer.encode_chat(messages(body))
    ids = prompt_token_ids(body.get("prompt"), add_bos=parse(TokenizeFields, body).add_special_tokens)
    check_vocabulary(ids, tokenizer.VOCAB_SIZE)
    return ids


def detokenize_ids(body: dict) -> list[int]:
    """The token ids of a /detokenize body, all within the vocabulary."""
    tokens = parse(DetokenizeFields, body).tokens
    check_non_negative(tokens, "tokens")
    check_vocabulary(tokens, tokenizer.VOCAB_SIZE)
    return tokens


def messages(body: dict) -> list[dict]:
    found = body.get("messages")
    if not isinstance(found, list) or not found or not all(isinstance(m, dict) for m in found):
        raise ApiError(400, "messages must be a non-empty list of message objects.", param="messages")
    return found


def prompt_token_ids(prompt: object, add_bos: bool) -> list[int]:
    """A single prompt as token ids: text, a list of ids, or a one-element list of either."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt, add_bos=add_bos)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        check_non_negative(prompt, "prompt")
        return list(prompt)
    raise ApiError(400, "prompt must be a string or a list of token ids (one prompt per request).", param="prompt")


def check_non_negative(ids: list[int], param: str) -> None:
    """vLLM's request models take token ids >= 0: a negative one fails their validation (a 400 before all else)."""
    if ids and min(ids) < 0:
        index = next(i for i, t in enumerate(ids) if t < 0)
        raise ApiError(400, "Input should be greater than or equal to 0", err_type="Bad Request",
                       param=f"body.{param}.{index}")


def check_vocabulary(ids: list[int], vocab_size: int, in_stream: bool = False) -> None:
    """vLLM's engine input check, with its message: the largest id (one pass, cheap) must be below the
    vocabulary's size. Its engine raises it, so a stream's 200 has gone out first (``in_stream``)."""
    top = max(ids, default=0)
    if top >= vocab_size:
        raise ApiError(400, f"Token id {top} is out of vocabulary", in_stream=in_stream)
