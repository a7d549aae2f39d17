"""Turn a workload spec into the exact request to send: resolve the model, build a prompt of exactly
``input_tokens`` tokens, and set ``max_tokens`` + ``ignore_eos`` so the output is exactly ``output_tokens``.

Every request gets a prompt of its own (loadgen/prompts.py: an optional shared prefix, then a unique part).
Completions get token ids (exact by construction). Chat gets words calibrated through the server's /tokenize
(its own tokenizer and chat template): once it has shown that each word is one token, the template's own count
says how many words make the length, and one more count confirms it. A request longer than the
server's max_model_len (from GET /v1/models) is refused here, before anything is sent: the server would reject
every one of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import cached_property

import numpy as np
import requests

from loadgen import http
from loadgen.prompts import WORDS, chat_messages, draw_prompt, prompt_bodies
from loadgen.spec import SpecError, WorkloadSpec


@dataclass(frozen=True)
class Target:
    """Where and what to send: the URL, headers, body, and the lengths the reply must have.

    ``body`` holds the first prompt; ``prefixes`` are the run's shared prefixes, and ``worker`` the sending
    process, whose requests' prompts ``next_body()`` varies.
    """

    url: str
    headers: dict[str, str]
    body: dict
    chat: bool
    stream: bool
    prompt_tokens: int
    output_tokens: int
    timeout_s: float
    prefixes: list[list[int]] = field(default_factory=list)
    worker: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Target:
        return cls(**json.loads(text))

    def next_body(self) -> bytes:
        """The next request's encoded body: each call draws this process's next prompt."""
        return next(self._bodies)

    @cached_property
    def _bodies(self) -> Iterator[bytes]:
        return prompt_bodies(self.body, self.prefixes, self.worker)

    @cached_property
    def endpoint(self) -> http.Endpoint:
        return http.Endpoint(self.url)


def build_target(spec: WorkloadSpec, host: str, session: requests.Session | None = None) -> Target:
    """Resolve everything that needs the server once, before the load starts."""
    session = session or requests.Session()
    base = host.rstrip("/")
    headers = {"Content-Type": "application/json"}
    if key := spec.resolved_api_key():
        headers["Authorization"] = f"Bearer {key}"
    models = list_models(base, session, headers)
    model = resolve_model(spec, base, models)
    check_length(spec, model, models)
    rng = np.random.default_rng(spec.seed)
    body: dict = {"model": model, "stream": spec.stream, "ignore_eos": True}
    if spec.stream:
        body["stream_options"] = {"include_usage": True}
    if spec.endpoint == "chat":
        prefixes, unique = chat_prompt(spec, rng, lambda m: _tokenize_chat(base, session, headers, m))
        body["messages"] = chat_messages(prefixes[0] if prefixes else None, unique)
        body["max_completion_tokens"] = spec.output_tokens
        path = "/v1/chat/completions"
    else:
        prefixes, unique = draw_prompt(spec, rng)
        body["prompt"] = (prefixes[0] if prefixes else []) + unique
        body["max_tokens"] = spec.output_tokens
        path = "/v1/completions"
    return Target(url=base + path, headers=headers, body=body, chat=spec.endpoint == "chat", stream=spec.stream,
                  prompt_tokens=spec.input_tokens, output_tokens=spec.output_tokens, timeout_s=spec.timeout_s,
                  prefixes=prefixes)


def list_models(base: str, session: requests.Session, headers: dict) -> list[dict] | Exception:
    """The model cards of GET /v1/models, or why they could not be read."""
    try:
        reply = session.get(base + "/v1/models", headers=headers, timeout=10)
        reply.raise_for_status()
        return [card for card in reply.json()["data"] if isinstance(card, dict) and "id" in card]
    except (requests.RequestException, KeyError, TypeError, ValueError) as exc:
        return exc


def resolve_model(spec: WorkloadSpec, base: str, models: list[dict] | Exception) -> str:
    if spec.model != "auto":
        return spec.model
    if isinstance(models, Exception) or not models:
        reason = models.__class__.__name__ if models else "no model listed"
        raise SpecError(f"model: 'auto' could not read {base}/v1/models ({reason})")
    return models[0]["id"]


def check_length(spec: WorkloadSpec, model: str, models: list[dict] | Exception) -> None:
    """Refuse a request longer than the model's max_model_len. Unknown (a named model the listing cannot
    show, e.g. when /v1/models wants a key the spec lacks): the run goes ahead and the server answers."""
    card = next((c for c in models if c.get("id") == model), None) if isinstance(models, list) else None
    limit = card.get("max_model_len") if card else None
    if isinstance(limit, int) and spec.input_tokens + spec.output_tokens > limit:
        raise SpecError(f"input_tokens + output_tokens: {spec.input_tokens} + {spec.output_tokens} = "
                        f"{spec.input_tokens + spec.output_tokens} exceeds the server's max_model_len {limit} "
                        f"for {model}")


def chat_prompt(spec: WorkloadSpec, rng: np.random.Generator,
                tokenize: Callable[[list[dict]], list[int]]) -> tuple[list[list[int]], list[int]]:
    """Word numbers of a chat run's system prompts (its shared prefixes; none without ``shared_prefix``) and of
    the user message, so that prompts are exactly ``input_tokens`` tokens and prompts with the same system prompt
    share exactly ``shared_prefix.tokens`` (the template's opening and the framed system message: what a prefix
    cache can reuse), per ``tokenize(messages)`` (the templated prompt's token ids)."""
    _check_words_count_alike(tokenize)
    shared, prefix = spec.shared_prefix, None
    prefixes: list[list[int]] = []
    if shared:
        drawn = rng.integers(0, len(WORDS), size=(shared.distinct, shared.tokens)).tolist()

        def common(k: int) -> int:  # tokens two prompts with the first k words of system prompt 0 share
            first, second = (tokenize(chat_messages(drawn[0][:k], [word])) for word in (0, 1))
            return _common_length(first, second)

        length = _words_for(common, shared.tokens, "shared_prefix.tokens", "the chat template's system message")
        prefixes = [row[:length] for row in drawn]
        prefix = prefixes[0]
    unique = rng.integers(0, len(WORDS), size=spec.input_tokens).tolist()
    length = _words_for(lambda n: len(tokenize(chat_messages(prefix, unique[:n]))), spec.input_tokens,
                        "input_tokens", "the chat template" + (" and the system prompt" if shared else ""))
    if length == 0:
        raise SpecError(f"input_tokens: {spec.input_tokens} leaves no word for the user message, which makes each "
                        "chat prompt its own")
    return prefixes, unique[:length]


def _words_for(count: Callable[[int], int], target: int, field: str, frame: str) -> int:
    """How many words make ``count(words)`` exactly ``target``: each word is one token (checked), so the frame's
    count alone says, and one more count confirms it."""
    alone = count(0)
    if alone > target:
        raise SpecError(f"{field}: {target} is shorter than {frame} alone ({alone} tokens)")
    got = count(target - alone)
    if got != target:
        raise SpecError(f"{field}: this server's tokenizer cannot make a chat prompt of exactly {target} tokens from "
                        f"whole words (closest {got}); use endpoint: completions")
    return target - alone


def _check_words_count_alike(tokenize: Callable[[list[dict]], list[int]]) -> None:
    """Every word is one token, first in a message or after a space, so any words of a length make a prompt of
    the same length: each request's own words keep the calibrated count."""
    def user(text: str) -> list[dict]:
        return [{"role": "user", "content": text}]

    empty = len(tokenize(user("")))
    alone = all(len(tokenize(user(word))) == empty + 1 for word in WORDS)
    if not alone or len(tokenize(user(" ".join(WORDS)))) != empty + len(WORDS):
        raise SpecError("endpoint: chat: this server's tokenizer does not count every prompt word as one token, so "
                        "chat prompts cannot differ per request at an exact length; use endpoint: completions")


def _common_length(first: list[int], second: list[int]) -> int:
    differ = (i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    return next(differ, min(len(first), len(second)))


def _tokenize_chat(base: str, session: requests.Session, headers: dict, messages: list[dict]) -> list[int]:
    reply = session.post(base + "/tokenize", json={"messages": messages}, headers=headers, timeout=10)
    if reply.status_code != 200:
        raise SpecError(f"endpoint: chat needs the server's /tokenize, which answered HTTP {reply.status_code}")
    ids = reply.json().get("tokens")
    if not isinstance(ids, list):
        raise SpecError("endpoint: chat needs the server's /tokenize to answer the prompt's token ids (tokens)")
    return ids
