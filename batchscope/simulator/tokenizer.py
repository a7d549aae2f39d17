"""A deterministic stand-in tokenizer: about one token per word, with Llama-3-sized ids and a chat template.

It only has to be consistent: /tokenize, the prompt-length check and usage all count with it, so a client
that calibrates its prompts through /tokenize gets exact token counts. Generated text is made of made-up
syllable words, one per token.
"""

from __future__ import annotations

import re
import zlib

VOCAB_SIZE = 128256
BOS_ID, EOS_ID = 128000, 128009
_PIECE = re.compile(r"\s*[A-Za-z]+|\s*\d|\s*[^\sA-Za-z\d]|\s+$")
_SYLLABLES = [c + v for c in "bdfghjklmnprstvwyzcq" for v in "aeiou"]  # 100 syllables
# Llama-3 chat template: <|start_header_id|>role<|end_header_id|>\n\n content <|eot_id|> per message,
# then <|start_header_id|>assistant<|end_header_id|>\n\n to prompt the reply
_HEADER_START, _HEADER_END, _BLANK_LINE, _EOT = 128006, 128007, 271, 128009
_ROLE_IDS = {"system": 9125, "user": 882, "assistant": 78191, "tool": 14506}


def encode(text: str, add_bos: bool = True) -> list[int]:
    """Token ids of ``text``: one per word, digit or punctuation mark (leading spaces attached)."""
    ids = [zlib.crc32(piece.encode()) % BOS_ID for piece in _PIECE.findall(text)]
    return [BOS_ID, *ids] if add_bos else ids


def encode_chat(messages: list[dict]) -> list[int]:
    """Token ids of a chat after the template: BOS, each message framed, then the assistant header."""
    ids = [BOS_ID]
    for message in messages:
        role = message.get("role")
        role_id = _ROLE_IDS.get(role, _ROLE_IDS["user"]) if isinstance(role, str) else _ROLE_IDS["user"]
        ids.extend([_HEADER_START, role_id, _HEADER_END, _BLANK_LINE])
        ids.extend(encode(_content_text(message.get("content")), add_bos=False))
        ids.append(_EOT)
    ids.extend([_HEADER_START, _ROLE_IDS["assistant"], _HEADER_END, _BLANK_LINE])
    return ids


def _content_text(content: object) -> str:
    """Message content as text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def decode_one(token_id: int) -> str:
    """Text of one token id: special tokens are empty, the rest become ' word'."""
    if token_id >= BOS_ID:
        return ""
    word = ""
    value = token_id
    while True:
        value, digit = divmod(value, 100)
        word += _SYLLABLES[digit]
        if value == 0:
            return " " + word


def decode(token_ids: list[int]) -> str:
    return "".join(decode_one(t) for t in token_ids)


def output_text(request_seed: int, index: int, is_eos: bool) -> str:
    """Text of a request's ``index``-th generated token; an EOS token has none."""
    return "" if is_eos else decode_one(output_token(request_seed, index))


def output_token(request_seed: int, index: int) -> int:
    """The ``index``-th generated token of a request: deterministic, spread over the vocabulary."""
    return (request_seed * 1_000_003 + index * 7919) % 50_000
