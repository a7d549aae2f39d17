"""The layout of a run's prompts: which shared prefix request n of worker w opens with, and the part of its own.

The load generator's prompts and the tuner's what-if runs use the same layout, so both see the same prefix-cache
hits. How prefixes, salts and token ids are chosen: docs/shared.md, "The prompt layout".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ID_LOW, ID_HIGH = 1000, 30000  # ids from a common range of every tokenizer's vocabulary, no special tokens
# a vocabulary below ID_LOW + ID_LOW: ids from here instead (tokenizers number their special tokens first: the
# test tier's tiny model has 6, Llama-2 3), so the salt keeps digits enough
SMALL_ID_LOW = 100
SALT_TOKENS = 3  # the request's number in two base-29000 digits around the worker's: 841 million per worker


def id_range(vocab_size: int) -> tuple[int, int]:
    """The ids [low, high) prompts are drawn from on a model whose ids run below ``vocab_size``: ID_LOW..ID_HIGH
    when the vocabulary holds them (every run's layout before vocabularies were probed); below, up to its end,
    from ID_LOW while that leaves ID_LOW ids, else from SMALL_ID_LOW."""
    if vocab_size >= ID_HIGH:
        return ID_LOW, ID_HIGH
    return (ID_LOW if vocab_size - ID_LOW >= ID_LOW else SMALL_ID_LOW), vocab_size


def salt_capacity(size: int, base: int) -> int:
    """How many requests of one worker ``size`` salt symbols of ``base`` digits tell apart (n takes the even
    positions)."""
    return base ** ((size + 1) // 2)


def draw_ids(rng: np.random.Generator, input_tokens: int, prefix_tokens: int = 0, distinct: int = 0,
             ids: tuple[int, int] = (ID_LOW, ID_HIGH)) -> tuple[list[list[int]], list[int]]:
    """A completions run's token ids, from [``ids``): its shared prefixes (``distinct`` of ``prefix_tokens``,
    none for 0) and the unique part of ``input_tokens - prefix_tokens`` ids every prompt varies."""
    prefixes = rng.integers(*ids, size=(distinct, prefix_tokens)).tolist()
    return prefixes, rng.integers(*ids, size=input_tokens - prefix_tokens).tolist()


def prefix_index(number: int, worker: int, distinct: int) -> int:
    """Which shared prefix request ``number`` of ``worker`` opens with: round-robin, workers staggered."""
    return (number + worker) % distinct


def salt(number: int, worker: int, size: int, low: int = ID_LOW, base: int = ID_HIGH - ID_LOW) -> list[int]:
    """The ``size`` symbols that make request ``number`` of ``worker`` its own: the digits of n and w
    interleaved, n's lowest first (consecutive requests differ from the first symbol)."""
    digits = []
    for position in range(size):
        value = number if position % 2 == 0 else worker
        digits.append(low + value // base ** (position // 2) % base)
    return digits


def prompt_ids(prefixes: Sequence[Sequence[int]], unique: Sequence[int], number: int, worker: int = 0,
               salt_size: int = SALT_TOKENS, ids: tuple[int, int] = (ID_LOW, ID_HIGH)) -> list[int]:
    """The token ids of request ``number`` of ``worker``: its shared prefix (if any), then its own part, its
    salt in [``ids``)."""
    size = min(salt_size, len(unique))
    head = list(prefixes[prefix_index(number, worker, len(prefixes))]) if prefixes else []
    low, high = ids
    return head + salt(number, worker, size, low, high - low) + list(unique[size:])
