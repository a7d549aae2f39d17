"""vLLM 0.32's queue knobs in a plan: each set one at a time like the others, a switch written true/false, vLLM's
rules across knobs, and every backend handed them (the what-if's ServeConfig, the flags of a command line and of a
re-created container)."""

from __future__ import annotations

import pytest

from batchscope.tuner.plan import CommandBackend, Plan, PlanError, ServingParams, load_plan
from batchscope.tuner.run.observers import diff
from batchscope.tuner.run.servers import command_argv, replace_knobs
from batchscope.tuner.whatif import _deployment
from batchscope.vllm import knobs as vllm_knobs
from tests.tuner.support import tiny_plan, write_plan

QUEUE_KNOBS = {"max_num_active_seqs": 2, "max_num_queued_reqs": 8, "max_num_queued_tokens": 4096,
               "long_prefill_token_threshold": 32, "long_prefill_token_threshold_adaptive": True}


def _plan(variations: list[dict], **baseline) -> Plan:
    return Plan.model_validate(tiny_plan(baseline={"model": "sim-model", "max_num_seqs": 4, **baseline},
                                         variations=variations))


def test_each_queue_knob_is_a_variation_of_its_own_and_reads_as_a_change_from_vllm_default():
    plan = _plan([{"name": name.replace("_", "-")[:30], "set": {name: value}} for name, value in QUEUE_KNOBS.items()])
    (_, baseline), *variations = plan.settings()
    assert baseline.flags() == ["--max-num-seqs", "4"]
    changes = [diff(baseline, params) for _, params in variations]
    assert changes == [[f"{name}: vLLM default → {vllm_knobs.shown(value)}"] for name, value in QUEUE_KNOBS.items()]
    assert changes[-1] == ["long_prefill_token_threshold_adaptive: vLLM default → on"]
    assert [params.flags()[2:] for _, params in variations] == [
        ["--max-num-active-seqs", "2"], ["--max-num-queued-reqs", "8"], ["--max-num-queued-tokens", "4096"],
        ["--long-prefill-token-threshold", "32"], ["--long-prefill-token-threshold-adaptive"]]


def test_a_switch_stays_true_or_false_in_the_plan_and_off_is_passed_as_its_no_flag():
    plan = _plan([{"name": "plain", "set": {"long_prefill_token_threshold_adaptive": False}}],
                 long_prefill_token_threshold=32, long_prefill_token_threshold_adaptive=True)
    assert plan.model_dump()["variations"][0]["set"] == {"long_prefill_token_threshold_adaptive": False}
    (_, baseline), (_, plain) = plan.settings()
    assert diff(baseline, plain) == ["long_prefill_token_threshold_adaptive: on → off"]
    assert plain.flags() == ["--max-num-seqs", "4", "--long-prefill-token-threshold", "32",
                             "--no-long-prefill-token-threshold-adaptive"]


def test_a_zero_queue_limit_is_a_value_vllm_takes():
    # ge=0 in vLLM's SchedulerConfig: 0 rejects every request, and is passed as it is, not taken for unset
    plan = _plan([{"name": "none-queued", "set": {"max_num_queued_reqs": 0}}])
    assert plan.settings()[1][1].flags()[2:] == ["--max-num-queued-reqs", "0"]


@pytest.mark.parametrize(("variation", "message"), [
    ({"max_num_queued_reqs": True}, "plan: variations.0.set.max_num_queued_reqs: must be a number, not "
                                    "true or false"),
    ({"long_prefill_token_threshold_adaptive": 1}, "plan: variations.0.set.long_prefill_token_threshold_adaptive: "
                                                   "is a switch: true or false"),
    ({"max_num_queued_reqs": -1}, "plan: variations.0.set.max_num_queued_reqs: Input should be greater than -1"),
    ({"max_num_active_seqs": 8}, "max_num_active_seqs (8) cannot be greater than max_num_seqs (4)."),
    ({"long_prefill_token_threshold": 2048}, "long_prefill_token_threshold (2048) cannot be greater than the "
                                             "max_model_len (1024)."),
    ({"max_num_queued_reqs": 8, "max_num_queued_tokens": 64}, "plan: variations.0: changes 2 parameters "
                                                               "(max_num_queued_reqs, max_num_queued_tokens)"),
])
def test_a_bad_queue_knob_is_one_line_naming_the_field(tmp_path, variation, message):
    plan = tiny_plan(baseline={"model": "sim-model", "max_num_seqs": 4, "max_model_len": 1024},
                     variations=[{"name": "bad", "set": variation}])
    with pytest.raises(PlanError) as caught:
        load_plan(write_plan(tmp_path, plan))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_every_backend_is_handed_the_queue_knobs():
    params = ServingParams(model="m", max_num_seqs=4, **QUEUE_KNOBS)
    flags = ["--max-num-seqs", "4", "--max-num-active-seqs", "2", "--max-num-queued-reqs", "8",
             "--max-num-queued-tokens", "4096", "--long-prefill-token-threshold", "32",
             "--long-prefill-token-threshold-adaptive"]
    assert command_argv(CommandBackend(port=8123), params)[7:] == flags
    # a re-created container: the previous setting's queue flags go, in any spelling, this setting's come
    previous = ["m", "--max_num_queued_reqs=64", "--no-long-prefill-token-threshold-adaptive", "--enforce-eager"]
    assert replace_knobs(previous, params) == ["m", "--enforce-eager", *flags]
    config = _deployment(params, "tiny", 0).config  # what-if: the simulator's own ServeConfig
    assert {name: getattr(config, name) for name in QUEUE_KNOBS} == QUEUE_KNOBS
