"""Each request's own prompt: exact length, the shared prefix round-robin, a unique part per request and worker."""

from __future__ import annotations

import itertools
import json

import numpy as np

from loadgen.prompts import draw_prompt, prompt_bodies
from loadgen.spec import load_spec


def bodies(overrides: list[str], worker: int = 0, count: int = 6) -> tuple[list[list[int]], list[dict]]:
    spec = load_spec(None, ["input_tokens=40", "output_tokens=8", "load.mode=offline", "load.requests=1",
                            *overrides])
    prefixes, unique = draw_prompt(spec, np.random.default_rng(spec.seed))
    template = {"model": "m", "prompt": (prefixes[0] if prefixes else []) + unique, "max_tokens": 8}
    stream = prompt_bodies(template, prefixes, worker)
    return prefixes, [json.loads(body) for body in itertools.islice(stream, count)]


def test_shared_prefixes_go_round_robin_ahead_of_a_part_each_request_has_alone():
    prefixes, sent = bodies(["shared_prefix.tokens=16", "shared_prefix.distinct=3"])
    assert len(prefixes) == 3 and all(len(p) == 16 for p in prefixes) and prefixes[0] != prefixes[1]
    assert all(len(body["prompt"]) == 40 and body["max_tokens"] == 8 for body in sent)
    assert [body["prompt"][:16] for body in sent] == [prefixes[n % 3] for n in range(6)]
    starts = {tuple(body["prompt"][16:19]) for body in sent}
    assert len(starts) == 6, "each request's part differs from its first token"
    assert len({tuple(body["prompt"][19:]) for body in sent}) == 1


def test_without_a_shared_prefix_prompts_differ_from_the_first_token_and_across_workers():
    _, first = bodies([], worker=0)
    _, second = bodies([], worker=1)
    heads = {tuple(body["prompt"][:3]) for body in first + second}
    assert len(heads) == 12 and all(len(body["prompt"]) == 40 for body in first + second)
    assert all(1000 <= token < 30000 for body in first + second for token in body["prompt"])


def test_a_chat_body_is_sent_as_it_is():
    body = {"model": "m", "messages": [{"role": "user", "content": "time year"}]}
    assert set(itertools.islice(prompt_bodies(body, [], 0), 3)) == {json.dumps(body, separators=(",", ":")).encode()}
