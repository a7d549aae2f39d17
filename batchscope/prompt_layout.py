"""The layout of a run's prompts: which shared prefix request n of worker w opens with, and the part of its own.

The load generator sends prompts laid out this way (loadgen/prompts.py) and the tuner's what-if runs give the
simulator's virtual clock the same token ids (tuner/whatif.py), so both see the same prefix-cache hits. A run
draws its pieces once from its seed: ``distinct`` shared prefixes and one unique part. Request n of worker w
takes prefix (n + w) mod distinct (round-robin), then the unique part with its first ``salt`` symbols
overwritten by (n, w) written as digits. Prefix caches hash a prompt's blocks as a chain, so prompts that differ
in the first symbol after their prefix share nothing past it.

A symbol is a token id on completions, and a word number on chat (loadgen/prompts.py's WORDS), hence ``low``
and ``base``: the salt's symbols are ``low + digit`` with digits in ``base``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ID_LOW, ID_HIGH = 1000, 30000  # ids from a common range of every tokenizer's vocabulary, no special tokens
SALT_TOKENS = 3  # the request's number in two base-29000 digits around the worker's: 841 million per worker


def draw_ids(rng: np.random.Generator, input_tokens: int, prefix_tokens: int = 0,
             distinct: int = 0) -> tuple[list[list[int]], list[int]]:
    """A completions run's token ids: its shared prefixes (``distinct`` of ``prefix_tokens``, none for 0) and
    the unique part of ``input_tokens - prefix_tokens`` ids every prompt varies."""
    prefixes = rng.integers(ID_LOW, ID_HIGH, size=(distinct, prefix_tokens)).tolist()
    return prefixes, rng.integers(ID_LOW, ID_HIGH, size=input_tokens - prefix_tokens).tolist()


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
               salt_size: int = SALT_TOKENS) -> list[int]:
    """The token ids of request ``number`` of ``worker``: its shared prefix (if any), then its own part."""
    size = min(salt_size, len(unique))
    head = list(prefixes[prefix_index(number, worker, len(prefixes))]) if prefixes else []
    return head + salt(number, worker, size) + list(unique[size:])
