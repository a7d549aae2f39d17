"""Turn a workload spec into the exact request to send: resolve the model, build a prompt of exactly
``input_tokens`` tokens, and set ``max_tokens`` + ``ignore_eos`` so the output is exactly ``output_tokens``.

Completions get a list of token ids (exact by construction), each request its own (loadgen/prompts.py: an
optional shared prefix, then a unique part). Chat gets text calibrated through the server's
/tokenize (its own tokenizer and chat template), by bisection on the number of words. A request longer than the
server's max_model_len (from GET /v1/models) is refused here, before anything is sent: the server would reject
every one of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from functools import cached_property

import numpy as np
import requests

from loadgen import http
from loadgen.prompts import draw_prompt, prompt_bodies
from loadgen.spec import SpecError, WorkloadSpec

_WORDS = ("time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world", "school",
          "state", "family", "student", "group", "country", "problem", "hand", "part", "place", "case", "week")
MAX_CALIBRATION_CALLS = 40


@dataclass(frozen=True)
class Target:
    """Where and what to send: the URL, headers, body, and the lengths the reply must have.

    ``body`` holds the first prompt; ``prefixes`` are the run's shared prefixes, and ``worker`` the sending
    process, whose requests' prompts ``encoded_body`` varies.
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

    @property
    def encoded_body(self) -> bytes:
        """The next request's body: each access draws the next prompt of this process."""
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
    prefixes: list[list[int]] = []
    body: dict = {"model": model, "stream": spec.stream, "ignore_eos": True}
    if spec.stream:
        body["stream_options"] = {"include_usage": True}
    if spec.endpoint == "chat":
        body["messages"] = chat_messages(spec.input_tokens, rng, lambda m: _count_chat(base, session, headers, m))
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


def chat_messages(target: int, rng: np.random.Generator, count) -> list[dict]:
    """One user message whose templated prompt is exactly ``target`` tokens, per ``count(messages)``."""
    words = [str(w) for w in rng.choice(_WORDS, size=target)]

    def messages(n: int) -> list[dict]:
        return [{"role": "user", "content": " ".join(words[:n])}]

    low, high = 0, target  # invariant: count(low) <= target (the template alone must fit)
    if count(messages(0)) > target:
        raise SpecError(f"input_tokens: {target} is shorter than the chat template alone")
    calls = 1
    while low < high and calls < MAX_CALIBRATION_CALLS:
        middle = (low + high + 1) // 2
        calls += 1
        if count(messages(middle)) <= target:
            low = middle
        else:
            high = middle - 1
    got = count(messages(low))
    if got != target:
        raise SpecError(f"input_tokens: this server's tokenizer cannot make a chat prompt of exactly {target} "
                        f"tokens from whole words (closest {got}); use endpoint: completions")
    return messages(low)


def _count_chat(base: str, session: requests.Session, headers: dict, messages: list[dict]) -> int:
    reply = session.post(base + "/tokenize", json={"messages": messages}, headers=headers, timeout=10)
    if reply.status_code != 200:
        raise SpecError(f"endpoint: chat needs the server's /tokenize, which answered HTTP {reply.status_code}")
    return int(reply.json()["count"])
