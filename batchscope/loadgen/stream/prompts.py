"""Each request's own prompt, of exactly the spec's length: an optional shared prefix, then a part of its own.

The layout (which prefix, and the salt that makes each request's part its own) is
batchscope/workload/prompt_layout.py's, shared with the tuner's what-if runs. Completions prompts are token ids
from the range the served model's vocabulary allows; chat prompts are words of WORDS, each one token, the shared
prefix a system message (target.py finds the range and calibrates the words). A body is kept as encoded JSON
pieces that each request joins. In full: docs/loadgen.md, "Prompts".
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from batchscope.loadgen.spec import WorkloadSpec
from batchscope.workload.prompt_layout import ID_HIGH, ID_LOW, SALT_TOKENS, draw_ids, prefix_index, salt

WORDS = ("time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world", "school",
         "state", "family", "student", "group", "country", "problem", "hand", "part", "place", "case", "week")
SALT_WORDS = 10  # (n, w) in five base-23 digits each: 6.4 million requests per worker, as many workers
_MARK = "\x00prompt"


def draw_prompt(spec: WorkloadSpec, rng: np.random.Generator,
                ids: tuple[int, int] = (ID_LOW, ID_HIGH)) -> tuple[list[list[int]], list[int]]:
    """The run's shared prefixes (none without ``shared_prefix``) and the unique part every prompt varies, token
    ids from [``ids``)."""
    shared = spec.shared_prefix
    return draw_ids(rng, spec.input_tokens, *((shared.tokens, shared.distinct) if shared else (0, 0)), ids=ids)


def words(numbers: Sequence[int]) -> str:
    """Chat text of word numbers."""
    return " ".join(WORDS[number] for number in numbers)


def word_numbers(text: str) -> list[int]:
    return [WORDS.index(word) for word in text.split(" ")] if text else []


def chat_messages(prefix: Sequence[int] | None, unique: Sequence[int]) -> list[dict]:
    """A chat prompt: a system message of the prefix's words (when shared), then the user message."""
    system = [{"role": "system", "content": words(prefix)}] if prefix is not None else []
    return [*system, {"role": "user", "content": words(unique)}]


def prompt_bodies(body: dict, prefixes: list[list[int]], worker: int,
                  ids: tuple[int, int] = (ID_LOW, ID_HIGH)) -> Iterator[bytes]:
    """Encoded bodies of one process's requests, each with its own prompt.

    ``body`` holds request 0's prompt before its salt: ``prompt`` (prefix 0 + the unique part) on completions,
    ``messages`` (chat_messages of prefix 0 and the unique part) on chat; any other body is sent as it is.
    ``ids``: the token ids completions salts take their symbols from.
    """
    if "prompt" in body:
        return _completions(body, prefixes, worker, ids)
    if "messages" in body:
        return _chat(body, prefixes, worker)
    return itertools.repeat(_encode(body))


def _completions(body: dict, prefixes: list[list[int]], worker: int, ids: tuple[int, int]) -> Iterator[bytes]:
    unique = body["prompt"][len(prefixes[0]) if prefixes else 0:]
    size = min(SALT_TOKENS, len(unique))
    head, tail = _split(body, "prompt", _MARK)
    openings = [f"{head}[{_ids(prefix)}{',' if prefix else ''}".encode() for prefix in prefixes or [[]]]
    closing = f"{',' if len(unique) > size else ''}{_ids(unique[size:])}]{tail}".encode()
    low, high = ids
    return _join(openings, closing, worker, lambda n: _ids(salt(n, worker, size, low, high - low)).encode())


def _chat(body: dict, prefixes: list[list[int]], worker: int) -> Iterator[bytes]:
    unique = word_numbers(body["messages"][-1]["content"])
    size = min(SALT_WORDS, len(unique))
    head, tail = _split(body, "messages", _MARK)
    openings = []
    choices: list[list[int] | None] = [*prefixes] if prefixes else [None]
    for prefix in choices:
        messages = [*chat_messages(prefix, [])[:-1], {"role": "user", "content": _MARK}]
        opening, end = json.dumps(messages, separators=(",", ":")).split(json.dumps(_MARK)[1:-1])
        openings.append(f"{head}{opening}".encode())
    closing = f"{' ' if len(unique) > size else ''}{words(unique[size:])}{end}{tail}".encode()
    return _join(openings, closing, worker, lambda n: words(salt(n, worker, size, low=0, base=len(WORDS))).encode())


def _join(openings: list[bytes], closing: bytes, worker: int, own: Callable[[int], bytes]) -> Iterator[bytes]:
    return (openings[prefix_index(number, worker, len(openings))] + own(number) + closing
            for number in itertools.count())


def _split(body: dict, key: str, mark: str) -> list[str]:
    """The encoded body around its ``key`` field's value."""
    return json.dumps({**body, key: mark}, separators=(",", ":")).split(json.dumps(mark))


def _encode(body: dict) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def _ids(ids: Sequence[int]) -> str:
    return ",".join(map(str, ids))
