"""Each request's own prompt: exact length, the shared prefix round-robin, a unique part per request and worker.

Chat prompts are calibrated with the simulator's tokenizer, the one its /tokenize answers with.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator

import numpy as np
import pytest

from batchscope.loadgen.spec import SpecError, load_spec
from batchscope.loadgen.stream.prompts import chat_messages, draw_prompt, prompt_bodies
from batchscope.loadgen.stream.target import chat_prompt
from batchscope.simulator.tokenizer import encode_chat
from batchscope.tuner.whatif import prompt_source
from batchscope.workload.prompt_layout import id_range, prompt_ids

BASE = ["input_tokens=40", "output_tokens=8", "load.mode=offline", "load.requests=1"]


def encoded(overrides: list[str], worker: int = 0, ids: tuple[int, int] | None = None) -> Iterator[bytes]:
    spec = load_spec(None, [*BASE, *overrides])
    prefixes, unique = draw_prompt(spec, np.random.default_rng(spec.seed), *([ids] if ids else []))
    template = {"model": "m", "prompt": (prefixes[0] if prefixes else []) + unique, "max_tokens": 8}
    return prompt_bodies(template, prefixes, worker, *([ids] if ids else []))


def bodies(overrides: list[str], worker: int = 0, count: int = 6,
           ids: tuple[int, int] | None = None) -> tuple[list[list[int]], list[dict]]:
    spec = load_spec(None, [*BASE, *overrides])
    prefixes, _ = draw_prompt(spec, np.random.default_rng(spec.seed), *([ids] if ids else []))
    return prefixes, [json.loads(body) for body in itertools.islice(encoded(overrides, worker, ids), count)]


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


def test_the_bodies_carry_the_layout_the_what_if_runs_use():
    prefixes, sent = bodies(["shared_prefix.tokens=16", "shared_prefix.distinct=3"], worker=2)
    _, unique = draw_prompt(load_spec(None, [*BASE, "shared_prefix.tokens=16", "shared_prefix.distinct=3"]),
                            np.random.default_rng(1))
    assert [body["prompt"] for body in sent] == [prompt_ids(prefixes, unique, n, worker=2) for n in range(6)]


def test_the_layout_is_todays_bit_for_bit_where_the_vocabulary_holds_the_usual_ids():
    # the first 1,000 bodies of worker 2, as the load generator sent them before vocabularies were probed (what-if
    # runs and recorded results depend on it)
    assert id_range(128256) == id_range(30000) == (1000, 30000)
    digest = hashlib.sha256()
    for body in itertools.islice(encoded(["shared_prefix.tokens=16", "shared_prefix.distinct=3"], worker=2), 1000):
        digest.update(body)
    assert digest.hexdigest() == "2044e96a923301c238aa92cbc070dd4c780f0538c5c4f8cba263debac591bb78"


@pytest.mark.parametrize(("vocab_size", "ids"), [(8000, (1000, 8000)), (2000, (1000, 2000)), (1999, (100, 1999)),
                                                 (200, (100, 200))])
def test_a_smaller_vocabulary_narrows_every_id_prefix_unique_part_and_salt_to_it(vocab_size, ids):
    assert id_range(vocab_size) == ids
    low, high = ids
    shared = ["shared_prefix.tokens=16", "shared_prefix.distinct=3"]
    prefixes, sent = bodies(shared, worker=7, count=3000, ids=ids)
    assert all(low <= token < high for body in sent for token in body["prompt"])
    assert all(len(body["prompt"]) == 40 for body in sent)
    assert len({tuple(body["prompt"][16:19]) for body in sent}) == 3000, "each request's part is its own"
    _, unique = draw_prompt(load_spec(None, [*BASE, *shared]), np.random.default_rng(1), ids)
    assert [body["prompt"] for body in sent[:50]] == [prompt_ids(prefixes, unique, n, 7, ids=ids) for n in range(50)]
    # a what-if run on a model of that vocabulary sends what one sender would
    what_if = prompt_source(load_spec(None, [*BASE, *shared]), vocab_size)
    assert [body["prompt"] for body in bodies(shared, count=50, ids=ids)[1]] == [what_if(n) for n in range(50)]


def chat(overrides: list[str], worker: int = 0, count: int = 6) -> tuple[list[list[int]], list[list[int]]]:
    """A chat run's system prompts and the templated token ids of its first ``count`` requests."""
    spec = load_spec(None, [*BASE, "endpoint=chat", "input_tokens=120", *overrides])
    prefixes, unique = chat_prompt(spec, np.random.default_rng(spec.seed), encode_chat)
    template = {"model": "m", "messages": chat_messages(prefixes[0] if prefixes else None, unique)}
    stream = prompt_bodies(template, prefixes, worker)
    return prefixes, [encode_chat(json.loads(body)["messages"]) for body in itertools.islice(stream, count)]


def shared(first: list[int], second: list[int]) -> int:
    return next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)


def test_chat_prompts_are_each_their_own_at_the_exact_length():
    _, first = chat([], worker=0)
    _, second = chat([], worker=1)
    prompts = first + second
    assert all(len(ids) == 120 for ids in prompts)
    assert len({tuple(ids) for ids in prompts}) == 12
    # a worker's prompts share the template's opening (BOS and the user header) alone; across workers the same
    # request number differs from the second word: below any block a cache could reuse either way
    assert {shared(a, b) for a, b in itertools.combinations(first, 2)} == {5}
    assert max(shared(a, b) for a, b in itertools.combinations(prompts, 2)) == 6


def test_a_chat_shared_prefix_is_a_system_prompt_of_exactly_the_shared_tokens():
    prefixes, prompts = chat(["shared_prefix.tokens=48", "shared_prefix.distinct=3"])
    assert len(prefixes) == 3 and all(len(ids) == 120 for ids in prompts) and len({tuple(p) for p in prompts}) == 6
    for n, m in itertools.combinations(range(6), 2):
        assert shared(prompts[n], prompts[m]) == (48 if n % 3 == m % 3 else shared(prompts[0], prompts[1]))
    assert shared(prompts[0], prompts[1]) < 16, "different system prompts share no block"


@pytest.mark.parametrize(("overrides", "tokenize", "message"), [
    (["shared_prefix.tokens=6"], encode_chat,
     "shared_prefix.tokens: 6 is shorter than the chat template's system message alone (10 tokens)"),
    (["input_tokens=5"], encode_chat, "input_tokens: 5 is shorter than the chat template alone (10 tokens)"),
    (["input_tokens=10"], encode_chat, "input_tokens: 10 leaves no word for the user message"),
    ([], lambda messages: list(json.dumps(messages)), "endpoint: chat: this server's tokenizer does not count"),
])
def test_chat_prompts_that_cannot_be_exact_are_refused_in_one_line(overrides, tokenize, message):
    spec = load_spec(None, [*BASE, "endpoint=chat", "input_tokens=120", *overrides])
    with pytest.raises(SpecError) as caught:
        chat_prompt(spec, np.random.default_rng(1), tokenize)
    assert str(caught.value).startswith(message)
