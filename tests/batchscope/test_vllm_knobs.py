"""vLLM 0.32's queue knobs in batchscope.vllm.knobs: the switch's two spellings and the rules across knobs, in
vLLM's words (vllm/config/scheduler.py)."""

import pytest

from batchscope.vllm import knobs


def test_a_switch_is_passed_without_a_value_and_its_off_form_is_removed_like_its_on_form():
    flags = knobs.knob_flags({"max_num_queued_reqs": 0, "long_prefill_token_threshold_adaptive": True})
    assert flags == ["--max-num-queued-reqs", "0", "--long-prefill-token-threshold-adaptive"]
    assert knobs.knob_flags({"long_prefill_token_threshold_adaptive": False}) == [
        "--no-long-prefill-token-threshold-adaptive"]
    argv = ["m", "--no-long-prefill-token-threshold-adaptive", "--port", "1",
            "--long_prefill_token_threshold_adaptive", "--max-num-queued-tokens=9", "--max-num-active-seqs", "2"]
    assert knobs.without_knobs(argv) == ["m", "--port", "1"]


def test_an_unknown_no_flag_is_not_taken_for_a_knob():
    assert knobs.without_knobs(["--no-max-num-seqs", "3"]) == ["--no-max-num-seqs", "3"]


@pytest.mark.parametrize(("values", "message"), [
    ({"max_num_seqs": 8, "max_num_active_seqs": 9},
     "max_num_active_seqs (9) cannot be greater than max_num_seqs (8)."),
    ({"max_model_len": 512, "long_prefill_token_threshold": 513},
     "long_prefill_token_threshold (513) cannot be greater than the max_model_len (512)."),
    ({"max_num_seqs": 8, "max_num_batched_tokens": 4},
     "max_num_batched_tokens (4) must be greater than or equal to max_num_seqs (8)."),
])
def test_the_rules_across_knobs_are_vllms(values, message):
    assert knobs.cross_knob_problem(values) == message


def test_each_rule_is_checked_only_when_both_its_knobs_are_set():
    assert knobs.cross_knob_problem({"max_num_active_seqs": 9}) is None
    assert knobs.cross_knob_problem({"max_num_seqs": 8, "max_num_active_seqs": 8,
                                     "long_prefill_token_threshold": 512, "max_model_len": 512}) is None


def test_an_admission_503_is_told_from_another_503_by_vllms_message():
    import json

    from batchscope.vllm import admission

    for reason in admission.MESSAGES:
        body = json.dumps(admission.error_body(reason))
        assert admission.reason_of(503, body) == reason
        assert admission.reason_of(500, body) is None
    other = json.dumps({"error": {"message": "overloaded", "type": "ServiceUnavailable", "code": 503}})
    for status, text in ((503, other), (503, "Service Unavailable"), (503, "[]"), (503, None), (503, '{"error": 1}')):
        assert admission.reason_of(status, text) is None


def test_a_switch_reads_on_or_off_in_a_diff():
    assert [knobs.shown(value) for value in (True, False, None, 64)] == ["on", "off", "vLLM default", "64"]
