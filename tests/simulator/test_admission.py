"""vLLM 0.32's admission check in the simulator: the rule object's counting (``>`` for requests with n slots,
``>=`` for prefill tokens, requests first) and the virtual driver's refusals, on the virtual clock."""

from __future__ import annotations

import math

import pytest

from batchscope.simulator.admission import BY_REQUESTS, BY_TOKENS, AdmissionControl
from batchscope.simulator.config import Deployment, ServeConfig
from batchscope.simulator.engine import EngineCore
from batchscope.simulator.virtual import REJECTED, ClosedLoop, FixedArrivals, RequestSpec, run_timed, run_virtual


def test_requests_are_refused_when_current_plus_n_passes_the_limit() -> None:
    control = AdmissionControl(max_num_queued_reqs=2)
    assert control.admit("a", 10) is None and control.admit("b", 10) is None
    assert control.check() == BY_REQUESTS and control.admit("c", 10) == BY_REQUESTS
    control.prefilled("a")
    assert control.check() == BY_REQUESTS, "a request still counts after its prefill, until it ends"
    control.leave("a")
    assert control.check() is None and control.check(n=2) == BY_REQUESTS  # 1 + 2 > 2
    assert control.rejections == {BY_REQUESTS: 4, BY_TOKENS: 0}


def test_limit_zero_refuses_everything() -> None:
    assert AdmissionControl(max_num_queued_reqs=0).check() == BY_REQUESTS
    assert AdmissionControl(max_num_queued_tokens=0).check() == BY_TOKENS


def test_tokens_are_refused_once_the_prefill_backlog_reaches_the_limit() -> None:
    control = AdmissionControl(max_num_queued_tokens=100)
    assert control.admit("a", 60) is None
    assert control.admit("b", 500) is None, "60 < 100: any prompt passes, whatever its own length"
    assert control.queued_tokens == 560 and control.check() == BY_TOKENS
    control.prefilled("b")
    control.prefilled("b")  # a second output changes nothing
    assert control.queued_tokens == 60 and control.check() is None
    control.leave("b")
    control.leave("a")
    control.leave("a")
    assert (control.requests, control.queued_tokens) == (0, 0)


def test_the_request_limit_is_checked_first() -> None:
    control = AdmissionControl(max_num_queued_reqs=1, max_num_queued_tokens=10)
    assert control.admit("a", 50) is None
    assert control.check() == BY_REQUESTS
    assert control.rejections == {BY_REQUESTS: 1, BY_TOKENS: 0}


def engine_for(**flags) -> EngineCore:
    return Deployment(ServeConfig(model="m", profile="tiny", max_model_len=2048, max_num_seqs=8,
                                  max_num_batched_tokens=1024, **flags)).new_engine()


def test_a_simultaneous_burst_over_the_request_limit_is_refused_past_it() -> None:
    engine = engine_for(max_num_queued_reqs=3)
    result = run_virtual(engine, [RequestSpec(0.0, 20, 200) for _ in range(8)])
    rejected = [record for record in result.records if record.rejected]
    assert len(rejected) == 5 and {record.rejected for record in rejected} == {BY_REQUESTS}
    assert all(record.finish_reason == REJECTED and record.output_tokens == 0 and math.isnan(record.first_token)
               for record in rejected)
    assert sorted(record.index for record in result.records if not record.rejected) == [0, 1, 2]
    assert engine.admission.rejections == {BY_REQUESTS: 5, BY_TOKENS: 0}
    assert engine.stats.request_success["length"] == 3, "a refused request never reaches the engine"
    assert (engine.admission.requests, engine.admission.queued_tokens) == (0, 0)


def test_the_token_limit_counts_whole_prompts_until_their_first_token_is_back() -> None:
    # 300 + 300 + 300 >= 800 by the fourth arrival; once the first tokens are back the backlog is empty again
    engine = engine_for(max_num_queued_tokens=800)
    burst = [RequestSpec(0.0, 300, 50) for _ in range(4)] + [RequestSpec(0.0 + 5.0, 300, 50)]
    result = run_virtual(engine, burst)
    assert [record.rejected for record in sorted(result.records, key=lambda r: r.index)] == [
        None, None, None, BY_TOKENS, None]


def test_a_refused_closed_loop_user_pauses_before_its_next_request() -> None:
    engine = engine_for(max_num_queued_reqs=2)
    run = run_timed(engine, ClosedLoop(4, 20, 50, issue_until=3.0, rejected_pause_s=0.25), stop=3.0)
    refused = [record for record in run.records if record.rejected]
    assert refused and engine.admission.rejections[BY_REQUESTS] == len(refused)
    # a refused user is back 0.25 s later: at most 3 s / 0.25 s refusals per user over the run, two users
    assert len(refused) <= 2 * 12 + 2
    with pytest.raises(ValueError, match="rejected_pause_s must be > 0"):
        ClosedLoop(1, 20, 50, rejected_pause_s=0)


def test_without_limits_nothing_is_refused_and_the_counts_empty() -> None:
    engine = engine_for()
    run = run_timed(engine, FixedArrivals([RequestSpec(0.01 * i, 100, 20) for i in range(50)]))
    assert len(run.records) == 50 and not any(record.rejected for record in run.records)
    assert engine.admission.rejections == {BY_REQUESTS: 0, BY_TOKENS: 0}
    assert (engine.admission.requests, engine.admission.queued_tokens) == (0, 0)
