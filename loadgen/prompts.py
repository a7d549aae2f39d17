"""Each request's own prompt, of exactly the spec's length: an optional shared prefix, then a part of its own.

Completions prompts are token ids, drawn once per run from the spec's seed: the shared prefixes (``distinct``
lists of ``shared_prefix.tokens`` ids) and one unique part. Request n of worker w takes prefix (n + w) mod
distinct (round-robin) and overwrites the first SALT_TOKENS ids of the unique part with (n, w). Prefix caches
hash a prompt's blocks as a chain, so prompts that differ in the first token after their prefix share nothing
past it: a server caches the shared prefixes and nothing else, as with a common system prompt ahead of
distinct questions. Without a shared prefix every prompt differs from its first token.

Chat prompts are text calibrated through the server's tokenizer (loadgen/target.py) and stay the same for every
request. Encoding a long prompt as JSON per request would cost the sender milliseconds, so a body is kept as
encoded pieces and each request joins them.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator

import numpy as np

from loadgen.spec import WorkloadSpec

ID_LOW, ID_HIGH = 1000, 30000  # ids from a common range of every tokenizer's vocabulary, no special tokens
SALT_TOKENS = 3  # the request's number in two base-29000 digits around the worker's: 841 million per worker
_PLACEHOLDER = "\x00prompt"


def draw_prompt(spec: WorkloadSpec, rng: np.random.Generator) -> tuple[list[list[int]], list[int]]:
    """The run's shared prefixes (none without ``shared_prefix``) and the unique part every prompt varies."""
    shared = spec.shared_prefix
    tokens, distinct = (shared.tokens, shared.distinct) if shared else (0, 0)
    prefixes = rng.integers(ID_LOW, ID_HIGH, size=(distinct, tokens)).tolist()
    return prefixes, rng.integers(ID_LOW, ID_HIGH, size=spec.input_tokens - tokens).tolist()


def prompt_bodies(body: dict, prefixes: list[list[int]], worker: int) -> Iterator[bytes]:
    """Encoded bodies of one process's requests, each with its own prompt (``body["prompt"]``: prefix 0 + the
    unique part); a chat body is the same every time."""
    encoded = json.dumps(body, separators=(",", ":")).encode()
    if "prompt" not in body:
        return itertools.repeat(encoded)
    prefix_len = len(prefixes[0]) if prefixes else 0
    unique = body["prompt"][prefix_len:]
    salt = min(SALT_TOKENS, len(unique))
    head, tail = json.dumps({**body, "prompt": _PLACEHOLDER}, separators=(",", ":")).split(json.dumps(_PLACEHOLDER))
    opening = [f"{head}[{_ids(prefix)}{',' if prefix else ''}".encode() for prefix in prefixes or [[]]]
    closing = f"{',' if len(unique) > salt else ''}{_ids(unique[salt:])}]{tail}".encode()
    return (opening[(number + worker) % len(opening)] + _salt(worker, number, salt) + closing
            for number in itertools.count())


def _ids(ids: list[int]) -> str:
    return ",".join(map(str, ids))


def _salt(worker: int, number: int, size: int) -> bytes:
    span = ID_HIGH - ID_LOW
    digits = [number % span, worker % span, number // span % span][:size]  # a short unique part: n first
    return ",".join(str(ID_LOW + digit) for digit in digits).encode()
