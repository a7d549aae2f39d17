"""The scheduler's queue knobs of vLLM 0.32 in the pure engine: the RUNNING cap (max_num_active_seqs) and the
long-prefill chunk cap (long_prefill_token_threshold, plain and adaptive), step by step with exact token counts."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from batchscope.simulator.config import Deployment, ServeConfig
from batchscope.simulator.engine import EngineCore


def engine_for(**flags) -> EngineCore:
    flags.setdefault("max_num_batched_tokens", 1024)
    flags.setdefault("max_num_seqs", 8)
    return Deployment(ServeConfig(model="m", profile="tiny", max_model_len=2048, **flags)).new_engine()


def step_tokens(engine: EngineCore, now: float = 0.0) -> dict[int, int]:
    """Schedule and complete one step; slot -> tokens it was given."""
    step = engine.schedule(now)
    assert step is not None
    engine.complete(step, step.end)
    return dict(zip(step.slots.tolist(), step.new_tokens.tolist(), strict=True))


def test_active_seqs_caps_running_below_max_num_seqs() -> None:
    engine = engine_for(max_num_active_seqs=3)
    slots = [engine.add_request(0.0, 10, 50) for _ in range(6)]
    assert set(step_tokens(engine)) == set(slots[:3])
    assert (engine.num_running, engine.num_waiting) == (3, 3)
    for _ in range(20):
        step_tokens(engine)
        assert engine.num_running <= 3


def test_without_active_seqs_max_num_seqs_caps_running() -> None:
    engine = engine_for()
    for _ in range(10):
        engine.add_request(0.0, 10, 50)
    step_tokens(engine)
    assert (engine.num_running, engine.num_waiting) == (8, 2)


def test_long_prefill_threshold_caps_each_chunk_of_waiting_and_running_requests() -> None:
    engine = engine_for(long_prefill_token_threshold=100)
    long_one = engine.add_request(0.0, 350, 5)
    short = engine.add_request(0.0, 60, 5)
    # two eligible: both capped; the short prompt is under the cap
    assert step_tokens(engine) == {long_one: 100, short: 60}
    assert step_tokens(engine) == {long_one: 100, short: 1}  # running: capped too; the short one decodes
    assert step_tokens(engine) == {long_one: 100, short: 1}
    assert step_tokens(engine) == {long_one: 50, short: 1}


def test_long_prefill_threshold_is_not_applied_to_the_only_eligible_request() -> None:
    engine = engine_for(long_prefill_token_threshold=100)
    alone = engine.add_request(0.0, 350, 5)
    assert step_tokens(engine) == {alone: 350}


def test_long_prefill_threshold_counts_running_and_waiting_before_the_step() -> None:
    engine = engine_for(long_prefill_token_threshold=100)
    first = engine.add_request(0.0, 350, 5)
    assert step_tokens(engine) == {first: 350}  # alone when the step began
    second = engine.add_request(0.0, 350, 5)
    assert step_tokens(engine) == {first: 1, second: 100}


def test_adaptive_threshold_is_floored_at_the_budgets_fair_share() -> None:
    # budget 1024, two eligible requests: max(100, 1024 // 2) = 512
    engine = engine_for(long_prefill_token_threshold=100, long_prefill_token_threshold_adaptive=True)
    a, b = engine.add_request(0.0, 900, 5), engine.add_request(0.0, 900, 5)
    assert step_tokens(engine) == {a: 512, b: 512}
    # five eligible: 1024 // 5 = 204 > 100
    more = [engine.add_request(0.0, 900, 5) for _ in range(3)]
    assert step_tokens(engine) == {a: 204, b: 204, more[0]: 204, more[1]: 204, more[2]: 204}


def test_adaptive_threshold_keeps_the_threshold_when_it_is_above_the_share() -> None:
    engine = engine_for(long_prefill_token_threshold=400, long_prefill_token_threshold_adaptive=True)
    a, b, c = (engine.add_request(0.0, 900, 5) for _ in range(3))
    assert step_tokens(engine) == {a: 400, b: 400, c: 224}  # max(400, 341); the budget ends at c


def test_adaptive_switch_alone_changes_nothing() -> None:
    engine = engine_for(long_prefill_token_threshold_adaptive=True)
    a, b = engine.add_request(0.0, 900, 5), engine.add_request(0.0, 900, 5)
    assert step_tokens(engine) == {a: 900, b: 124}


@pytest.mark.parametrize(("flags", "words"), [
    ({"max_num_active_seqs": 9}, "max_num_active_seqs (9) cannot be greater than max_num_seqs (8)."),
    ({"max_num_active_seqs": 0}, "must be in (0, 100000], got 0"),
    ({"max_num_queued_reqs": -1}, "must be in (-1, 1e+08], got -1"),
    ({"long_prefill_token_threshold": 4096},
     "long_prefill_token_threshold (4096) cannot be greater than the max_model_len (2048)."),
])
def test_bad_queue_knobs_are_refused_in_vllms_words(flags: dict, words: str) -> None:
    with pytest.raises((ValidationError, ValueError), match=re.escape(words)):
        engine_for(**flags)


def test_threshold_is_checked_against_the_profiles_context_when_max_model_len_is_unset() -> None:
    with pytest.raises(ValueError, match=r"cannot be greater than the max_model_len \(4096\)"):
        Deployment(ServeConfig(model="m", profile="tiny", long_prefill_token_threshold=5000))
