"""Single requests a real vLLM refuses or cuts, measured by the load generator, and the simulator answering each
the same way (its parity with the release we test): the outcome, the status and vLLM's message."""

from __future__ import annotations

from dataclasses import replace

import pytest

from batchscope.loadgen.stream.request import RequestRecord, rejected
from batchscope.loadgen.stream.target import Target
from tests.loadgen.support import send, target_for
from tests.real_vllm.support import SERVED_NAME, tier

MAX_MODEL_LEN = 1024


def send_with(target: Target, **body) -> RequestRecord:
    """One request of ``target`` with ``body``'s fields in its body (the loadgen tests' send)."""
    return send(replace(target, body={**target.body, **body}))


@pytest.fixture(scope="module")
def parity_simulator(tmp_path_factory):
    """The simulator configured as the tier's vLLM: the tiny model's vocabulary and context."""
    from batchscope.testkit.simulator import start_simulator

    sim = start_simulator(tmp_path_factory.mktemp("sim"), "--profile", "tiny", "--served-model-name", SERVED_NAME,
                          "--vocab-size", str(tier().model_facts()["vocab_size"]), "--max-model-len",
                          str(MAX_MODEL_LEN))
    yield sim
    sim.stop()


CASES = {
    # ids past the vocabulary in a stream: HTTP 200, then an error event of code 400
    "out of vocabulary, streamed": {"prompt": [12000] * 50},
    "out of vocabulary": {"prompt": [12000] * 50, "stream": False, "stream_options": None},
    "min_tokens above max_tokens": {"min_tokens": 30},
    "a prompt that fills the context": {"prompt": [1500] * MAX_MODEL_LEN},
}


def answer(record: RequestRecord) -> tuple:
    return record.outcome, record.status, rejected(record)


@pytest.mark.parametrize("case", list(CASES))
def test_a_refused_request_is_a_counted_rejection_and_the_simulator_refuses_it_alike(vllm, parity_simulator, case):
    body = {key: value for key, value in CASES[case].items() if value is not None}
    drop = [key for key, value in CASES[case].items() if value is None]
    real_target, sim_target = target_for(vllm.url, timeout_s=30), target_for(parity_simulator.url, timeout_s=30)
    real_target = replace(real_target, body={k: v for k, v in real_target.body.items() if k not in drop})
    sim_target = replace(sim_target, body={k: v for k, v in sim_target.body.items() if k not in drop})
    real, simulated = send_with(real_target, **body), send_with(sim_target, **body)
    assert answer(real) == ("http_error", 400, True), real.error
    assert answer(simulated) == answer(real)
    assert simulated.error == real.error  # vLLM's own message, word for word


def test_a_request_longer_than_the_context_is_cut_not_refused(vllm, parity_simulator):
    # prompt + max_tokens past max_model_len: vLLM 0.32 cuts max_tokens to what the context leaves
    prompt = [1500] * (MAX_MODEL_LEN - 8)
    for server in (vllm, parity_simulator):
        record = send_with(target_for(server.url, timeout_s=30), prompt=prompt)
        assert (record.outcome, record.prompt_tokens, record.output_tokens) == ("length_mismatch", 1016, 8)
