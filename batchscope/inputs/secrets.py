"""Masking secrets wherever a command line, a flag set or a config is shown (metrics, logs, annotations, files).

A flag or field is secret when a word of its name says so (key, token, secret, password, as in `--api-key`,
`--hf-token`, `api_key`; words split at "-" and "_", so `max_num_batched_tokens` is not one) and it is not one of
vLLM's knobs (`--long-prefill-token-threshold` is a number); its value is replaced by MASK. vLLM masks the same
flags in its own start-up log. A command line written as one string (a tuner plan's command template) is masked
word by word as a shell splits it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

from batchscope.vllm.knobs import BY_NAME as KNOBS_BY_NAME

MASK = "***"
SECRET_WORDS = {"key", "apikey", "token", "secret", "password", "passwd", "credentials"}


def is_secret(name: str) -> bool:
    """True for a flag or field name that carries a secret (``--api-key``, ``hf_token``, ``password``...)."""
    words = [word for word in re.split(r"[-_]+", name.lower()) if word]
    return "_".join(words) not in KNOBS_BY_NAME and any(word in SECRET_WORDS for word in words)


def mask_mapping(values: Mapping[str, object]) -> dict[str, object]:
    """A copy with every secret field's value masked (nested mappings too)."""
    return {name: mask_mapping(value) if isinstance(value, Mapping)
            else (MASK if value and is_secret(name) else value) for name, value in values.items()}


def mask_argv(argv: Sequence[str]) -> list[str]:
    """A command line with the value of every secret flag masked: ``--api-key K`` and ``--api-key=K`` alike."""
    masked: list[str] = []
    hide_next = False
    for token in argv:
        if hide_next and not token.startswith("--"):
            masked.append(MASK)
            hide_next = False
            continue
        hide_next = False
        name, has_value, value = token.partition("=")
        if token.startswith("--") and is_secret(name):
            if has_value:
                masked.append(f"{name}={MASK}")
            else:
                masked.append(token)
                hide_next = True
            continue
        masked.append(token)
    return masked


def mask_command(command: str) -> str:
    """A command line written as one string with every secret flag's value masked (as ``mask_argv``, the words
    split as a shell splits them); the string unchanged when it holds no secret."""
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: split at whitespace, so a value after a secret flag is masked still
        words = command.split()
    masked = mask_argv(words)
    return command if masked == words else " ".join(map(_quoted, masked))


def _quoted(word: str) -> str:
    # quoted only where shlex.split would not give the word back: `{flags}` and `***` stay as written
    return shlex.quote(word) if not word or re.search(r"[\s'\"\\]", word) else word
