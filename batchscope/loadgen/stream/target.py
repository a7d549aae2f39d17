"""Turn a workload spec into the exact request to send: resolve the model, build a prompt of exactly
``input_tokens`` tokens, and set ``max_tokens`` + ``ignore_eos`` so the output is exactly ``output_tokens``.

This is the run's pre-flight, done before any load (by `batchscope load` before it starts Locust, and again by
the controller): ``--host`` an http(s) URL whose server accepts a connection, GET /v1/models (a redirect
refused), the length against max_model_len, then on completions the prompt ids' range (a probe, then a bisection
of at most VOCAB_PROBES probes), on chat the words' calibration through /tokenize. Each request's prompt is
prompts.py's. In full: docs/loadgen.md, "Pre-flight".
"""

from __future__ import annotations

import json
import math
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import cached_property, partial
from urllib.parse import urlsplit

import numpy as np
import requests

from batchscope.loadgen.spec import ConcurrencyLoad, OfflineLoad, SpecError, WorkloadSpec
from batchscope.loadgen.stream import framing
from batchscope.loadgen.stream.prompts import WORDS, chat_messages, draw_prompt, prompt_bodies
from batchscope.wire.bounded_read import JSON_MAX_BYTES, BodyTooLarge, FetchTimeout, request
from batchscope.workload.prompt_layout import ID_HIGH, ID_LOW, SALT_TOKENS, id_range, salt_capacity

CONNECT_TIMEOUT_S = 10.0
PREFLIGHT_TIMEOUT_S = 10.0  # one pre-flight exchange (/v1/models, /tokenize), whole: connect, head and body
# what a pre-flight read of a peer may end in: no answer, one past its deadline, a body over its cap
PEER_FAULTS = (requests.RequestException, FetchTimeout, BodyTooLarge, ValueError)
VOCAB_PROBES = 20  # one-token requests at most to find the vocabulary's end (15 bisect ID_HIGH - 1)
OUT_OF_VOCABULARY = "out of vocabulary"  # vLLM's 400: "Token id N is out of vocabulary"
MIN_ID_SPAN = 100  # fewer prompt ids than this: the salt's digits would be too few to tell requests apart


@dataclass(frozen=True)
class Target:
    """Where and what to send: the URL, headers, body, and the lengths the reply must have.

    ``body`` holds the first prompt; ``prefixes`` are the run's shared prefixes, and ``worker`` the sending
    process, whose requests' prompts ``next_body()`` varies. Completions' token ids, salts included, are in
    [``id_low``, ``id_high``), the range the served vocabulary allows. ``timed_from_send``: latencies count from
    the request's write (closed loop, which has no schedule) instead of its scheduled arrival (open loop).
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
    id_low: int = ID_LOW
    id_high: int = ID_HIGH
    timed_from_send: bool = False

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
        return prompt_bodies(self.body, self.prefixes, self.worker, (self.id_low, self.id_high))

    @cached_property
    def endpoint(self) -> framing.Endpoint:
        return framing.Endpoint(self.url)


def build_target(spec: WorkloadSpec, host: str, session: requests.Session | None = None,
                 ids: tuple[int, int] | None = None) -> Target:
    """Resolve everything that needs the server once, before the load starts; raise SpecError, one line, when
    the run cannot go ahead. ``ids``: the completions' token id range when already probed (`batchscope load`
    hands its pre-flight's on), else the server's vocabulary is probed."""
    base = server_url(host)
    check_reachable(base)
    session = session or requests.Session()
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
        ids = ids or prompt_id_range(spec, partial(_probe, base, session, headers, model, spec.timeout_s))
        prefixes, unique = draw_prompt(spec, rng, ids)
        body["prompt"] = (prefixes[0] if prefixes else []) + unique
        body["max_tokens"] = spec.output_tokens
        path = "/v1/completions"
    low, high = ids or (ID_LOW, ID_HIGH)
    return Target(url=base + path, headers=headers, body=body, chat=spec.endpoint == "chat", stream=spec.stream,
                  prompt_tokens=spec.input_tokens, output_tokens=spec.output_tokens, timeout_s=spec.timeout_s,
                  prefixes=prefixes, id_low=low, id_high=high, timed_from_send=isinstance(spec.load, ConcurrencyLoad))


def server_url(host: str) -> str:
    """``--host`` as the server's base URL (no trailing slash); SpecError unless it is http(s)://HOST[:PORT]."""
    parts = urlsplit(host)
    try:
        parts.port  # noqa: B018 (parsing it is the check)
    except ValueError:
        raise SpecError(f"--host: {host!r} has no valid port (1-65535)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        hint = f": write http://{host}" if "://" not in host else ""
        raise SpecError(f"--host: {host!r} is not an http:// or https:// URL of the server{hint}")
    return host.rstrip("/")


def check_reachable(base: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """The server accepts a connection; SpecError naming why not (refused, unknown host, timed out)."""
    parts = urlsplit(base)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
    except OSError as exc:
        reason = exc.strerror or str(exc) or exc.__class__.__name__
        raise SpecError(f"server: cannot connect to {base}: {reason[:1].lower()}{reason[1:]}") from None


def prompt_id_range(spec: WorkloadSpec, probe: Callable[[int], tuple[int | None, str]]) -> tuple[int, int]:
    """The token ids [low, high) completions prompts take on this server, ``probe(id)`` giving the (status, text)
    of a one-token completion of that id alone.

    ID_LOW..ID_HIGH when ID_HIGH - 1 is accepted, or answered anything but vLLM's out-of-vocabulary 400 (a key
    the server wants, say: the run then shows what it answers). Else the largest accepted id is bisected for
    and prompt_layout.id_range says the ids below it; a vocabulary too small for the run is refused.
    """
    if _in_vocabulary(*probe(ID_HIGH - 1)) is not False:
        return ID_LOW, ID_HIGH
    accepted, refused = 0, ID_HIGH - 1  # id 0: every vocabulary has it
    for _ in range(VOCAB_PROBES - 1):
        if refused - accepted == 1:
            break
        middle = (accepted + refused) // 2
        status, text = probe(middle)
        answer = _in_vocabulary(status, text)
        if answer is None:
            raise SpecError(f"server: probing its vocabulary, a completion of token id {middle} got "
                            f"{'HTTP ' + str(status) if status else 'no answer'} ({' '.join(text.split())[:80]})")
        accepted, refused = (middle, refused) if answer else (accepted, middle)
    vocab_size = accepted + 1
    ids = id_range(vocab_size)
    check_id_span(spec, ids, vocab_size)
    return ids


def probes_answered(spec: WorkloadSpec, vocab_size: int) -> int:
    """How many of the pre-flight's one-token probes a server whose vocabulary has ``vocab_size`` ids answers
    with a generation (each counts in its /metrics as a request of one prompt and one output token): the
    bisection is deterministic, so replaying it against the known vocabulary tells. Chat probes nothing."""
    if spec.endpoint == "chat":
        return 0
    answered = []

    def probe(token_id: int) -> tuple[int, str]:
        if token_id < vocab_size:
            answered.append(token_id)
            return 200, "{}"
        return 400, f"Token id {token_id} is {OUT_OF_VOCABULARY}"

    prompt_id_range(spec, probe)
    return len(answered)


def check_id_span(spec: WorkloadSpec, ids: tuple[int, int], vocab_size: int) -> None:
    """Refuse a vocabulary whose ids cannot make each request's prompt its own: fewer than MIN_ID_SPAN, or a salt
    that tells fewer requests of a worker apart than the run plans in all (offline, Poisson; a closed loop's
    count is not known before)."""
    low, high = ids
    shared = spec.shared_prefix
    size = min(SALT_TOKENS, spec.input_tokens - (shared.tokens if shared else 0))
    capacity, planned = salt_capacity(size, high - low), planned_requests(spec)
    line = f"server: a vocabulary of {vocab_size:,} token ids leaves {high - low:,} ids ({low}-{high - 1}) for prompts"
    if high - low < MIN_ID_SPAN:
        raise SpecError(f"{line}, fewer than the {MIN_ID_SPAN} the load generator needs to make each prompt its own")
    if planned is not None and planned > capacity:
        raise SpecError(f"{line}: {size} salt ids tell {capacity:,} requests apart, fewer than the run's {planned:,}")


def planned_requests(spec: WorkloadSpec) -> int | None:
    """The requests a run sends: offline's batch, Poisson's mean arrivals; None for a closed loop."""
    load = spec.load
    if isinstance(load, OfflineLoad):
        return load.requests
    if isinstance(load, ConcurrencyLoad):
        return None
    return math.ceil(load.rate * (spec.warmup_s + spec.duration_s))


def _probe(base: str, session: requests.Session, headers: dict, model: str, timeout_s: float,
           token_id: int) -> tuple[int | None, str]:
    """(HTTP status, body text) of a non-streaming one-token completion of ``token_id`` alone; (None, why) when
    nothing came back."""
    body = {"model": model, "prompt": [token_id], "max_tokens": 1}
    probe_headers = {**headers, "X-Request-Id": f"batchscope-vocabulary-probe-{token_id}"}
    try:
        status, _, text = exchange(session, "POST", base + "/v1/completions", timeout_s, payload=body,
                                   headers=probe_headers)
    except PEER_FAULTS as exc:
        return None, exc.__class__.__name__
    return status, text[:200]


def _in_vocabulary(status: int | None, text: str) -> bool | None:
    """Accepted (True), refused as out of vocabulary (False), or neither (None)."""
    if status == 200:
        return True
    return False if status == 400 and OUT_OF_VOCABULARY in text else None


def list_models(base: str, session: requests.Session, headers: dict) -> list[dict] | Exception:
    """The model cards of GET /v1/models, or why they could not be read. A redirect is refused (SpecError), not
    followed: it could lead anywhere, with the spec's key in its headers."""
    try:
        status, reply_headers, text = exchange(session, "GET", base + "/v1/models", PREFLIGHT_TIMEOUT_S,
                                               headers=headers)
    except PEER_FAULTS as exc:
        return exc
    if 300 <= status < 400 and "location" in reply_headers:
        raise SpecError(f"server: GET {base}/v1/models answered HTTP {status}, a redirect to "
                        f"{reply_headers['location'][:100]!r}, and redirects are not followed: give --host the "
                        "server's own URL")
    try:
        if status != 200:
            raise requests.HTTPError(f"HTTP {status}")
        return [card for card in json.loads(text)["data"] if isinstance(card, dict) and "id" in card]
    except (requests.RequestException, KeyError, TypeError, ValueError) as exc:
        return exc


def exchange(session: requests.Session, method: str, url: str, timeout_s: float, *,
             headers: dict[str, str] | None = None, payload: object = None
             ) -> tuple[int, requests.structures.CaseInsensitiveDict, str]:
    """(status, headers, body text) of one pre-flight request (batchscope.wire.bounded_read.request), following no
    redirect, the whole exchange within ``timeout_s`` and its body within JSON_MAX_BYTES (an error's within
    ERROR_MAX_BYTES, else empty); ``payload`` is sent as JSON. Raises one of PEER_FAULTS."""
    answer = request(session, method, url, deadline=time.monotonic() + timeout_s, max_bytes=JSON_MAX_BYTES,
                     headers=headers, json=payload, follow_redirects=False)
    return answer.reply.status_code, answer.reply.headers, answer.body.text()


def resolve_model(spec: WorkloadSpec, base: str, models: list[dict] | Exception) -> str:
    if spec.model != "auto":
        return spec.model
    if isinstance(models, Exception) or not models:
        raise SpecError(f"model: 'auto' could not read {base}/v1/models ({_why_unlisted(models)})")
    return models[0]["id"]


def _why_unlisted(models: list[dict] | Exception) -> str:
    if not isinstance(models, Exception):
        return "no model listed"
    if isinstance(models, requests.HTTPError) and str(models) in ("HTTP 401", "HTTP 403"):
        return f"{models}: the server wants an API key; set api_key in the spec or $BATCHSCOPE_API_KEY"
    return str(models) if isinstance(models, requests.HTTPError) else models.__class__.__name__


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
    try:
        status, _, text = exchange(session, "POST", base + "/tokenize", PREFLIGHT_TIMEOUT_S,
                                   payload={"messages": messages}, headers=headers)
    except PEER_FAULTS as exc:
        raise SpecError(f"endpoint: chat needs the server's /tokenize, which did not answer ({exc!s:.80})") from None
    if status != 200:
        raise SpecError(f"endpoint: chat needs the server's /tokenize, which answered HTTP {status}")
    ids = json.loads(text).get("tokens")
    if not isinstance(ids, list):
        raise SpecError("endpoint: chat needs the server's /tokenize to answer the prompt's token ids (tokens)")
    return ids
