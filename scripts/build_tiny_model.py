"""Build the real-vLLM test tier's model: a tiny random Llama and a byte-level BPE tokenizer, made here, seeded.

Run with the vLLM venv's Python (it has torch, transformers and tokenizers): `python build_tiny_model.py DIR`.
Nothing is downloaded. The model's output is random text (some stream events carry an empty text, as a real
model's partial UTF-8 does), which is what the tests want: exact token counts, not meaning.

The shapes are chosen for the edges the tier exercises:
- a vocabulary of 8,000 tokens, below the 1,000-29,999 range the load generator once drew prompt ids from;
- 2,048 positions, so a test can pass a small --max-model-len and hit the too-long path;
- the load generator's chat words (loadgen/prompts.py WORDS) are one token each, with and without a leading
  space, so chat prompts calibrate on it as they do on a real model's tokenizer.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

VOCAB_SIZE = 8000
MAX_POSITIONS = 2048
SEED = 20261201
CHAT_WORDS = ("time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world", "school",
              "state", "family", "student", "group", "country", "problem", "hand", "part", "place", "case", "week")
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
SPECIALS = ("<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>")


def corpus(rng: random.Random, lines: int = 20_000) -> list[str]:
    """Text for the tokenizer's merges: the chat words often, and pseudo-words so the vocabulary fills up."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    pseudo = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(6000)]
    out = []
    for _ in range(lines):
        words = [rng.choice(CHAT_WORDS) if rng.random() < 0.5 else rng.choice(pseudo) for _ in range(12)]
        out.append(" ".join(words) + rng.choice((".", ",", "!", "?", "")))
    return out


def build_tokenizer(directory: Path, rng: random.Random):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus(rng), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", model_max_length=MAX_POSITIONS)
    fast.chat_template = CHAT_TEMPLATE
    for word in CHAT_WORDS:
        for text in (word, " " + word):
            ids = fast.encode(text, add_special_tokens=False)
            if len(ids) != 1:
                raise SystemExit(f"tokenizer: {text!r} is {len(ids)} tokens, the chat words must be one each")
    fast.save_pretrained(directory)
    return fast


def build_model(directory: Path, tokenizer) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)


def main() -> None:
    directory = Path(sys.argv[1])
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    tokenizer = build_tokenizer(directory, rng)
    build_model(directory, tokenizer)
    (directory / "batchscope-model.json").write_text(json.dumps(
        {"vocab_size": len(tokenizer), "max_position_embeddings": MAX_POSITIONS, "seed": SEED}) + "\n")
    print(f"tiny model in {directory}: vocabulary {len(tokenizer)}, {MAX_POSITIONS} positions")


if __name__ == "__main__":
    main()
