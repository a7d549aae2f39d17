"""Where the simulator's API must answer exactly as vLLM's does: lax pydantic types, SamplingParams' 400s,
FastAPI's 404, aborts of held requests, and an API key that never shows."""

from __future__ import annotations

import json
import socket
import uuid

import pytest
import requests

from tests.conftest import wait_until
from tests.simulator.test_api import metric_value

pytestmark = pytest.mark.e2e


@pytest.fixture
def tiny(simulator):
    return simulator("--profile", "tiny", "--seed", "7")


def complete(sim, **body) -> requests.Response:
    return requests.post(sim.url + "/v1/completions", json={"prompt": "x", **body}, timeout=10)


@pytest.mark.parametrize("text", ["false", "0", "no", "off", "False", "OFF"])
def test_a_false_string_for_stream_is_false_as_pydantic_reads_it(tiny, text):
    reply = complete(tiny, stream=text, max_tokens=3, ignore_eos=True)
    assert reply.status_code == 200 and reply.headers["Content-Type"].startswith("application/json")
    assert reply.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("text", ["true", "1", "yes", "on"])
def test_true_strings_turn_on_stream_ignore_eos_and_include_usage(tiny, text):
    body = {"stream": text, "ignore_eos": text, "stream_options": {"include_usage": text}, "max_tokens": 50}
    with requests.post(tiny.url + "/v1/completions", json={"prompt": "x", **body}, stream=True, timeout=10) as reply:
        assert reply.headers["Content-Type"] == "text/event-stream"
        events = [line.removeprefix(b"data: ") for line in reply.iter_lines() if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    assert json.loads(events[-2])["usage"]["completion_tokens"] == 50  # ignore_eos: exactly max_tokens


def test_numbers_as_strings_are_read_as_numbers(tiny):
    assert complete(tiny, max_tokens="4", ignore_eos=True).json()["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize(("field", "value"), [
    ("stream", "maybe"), ("ignore_eos", "sometimes"), ("stream", 2), ("stream_options", {"include_usage": "often"}),
    ("max_tokens", "many"), ("max_tokens", 2.5), ("temperature", "hot"),
])
def test_a_value_pydantic_cannot_read_is_vllms_400(tiny, field, value):
    reply = complete(tiny, **{field: value})
    assert reply.status_code == 400
    error = reply.json()["error"]
    # vLLM answers type errors from FastAPI's validation handler: type is the HTTP phrase, loc names the field
    assert error["type"] == "Bad Request" and error["code"] == 400
    assert f"'loc': ('body', '{field}'" in error["message"]


@pytest.mark.parametrize(("body", "message", "param"), [
    ({"temperature": -0.5}, "temperature must be non-negative, got -0.5.", "temperature"),
    ({"top_p": 0}, "top_p must be in (0, 1], got 0.0.", "top_p"),
    ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5.", "top_p"),
    ({"max_tokens": 0}, "max_tokens must be at least 1, got 0.", "max_tokens"),
    ({"max_tokens": -3}, "max_tokens must be at least 1, got -3.", "max_tokens"),
    ({"n": 0}, "n must be at least 1, got 0.", None),
    ({"n": 2}, "n must be 1", "n"),
    ({"top_k": -2}, "top_k must be 0 (disable), or at least 1, got -2.", None),
    ({"min_p": 1.5}, "min_p must be in [0, 1], got 1.5.", None),
    ({"presence_penalty": 3}, "presence_penalty must be in [-2, 2], got 3.0.", None),
    ({"frequency_penalty": -2.5}, "frequency_penalty must be in [-2, 2], got -2.5.", None),
    ({"repetition_penalty": 0}, "repetition_penalty must be greater than zero, got 0.0.", None),
    ({"min_tokens": -1}, "min_tokens must be greater than or equal to 0, got -1.", None),
    ({"max_tokens": 5, "min_tokens": 9}, "min_tokens must be less than or equal to max_tokens=5, got 9.", None),
])
def test_sampling_values_vllm_rejects_are_400_with_its_message(tiny, body, message, param):
    for reply in (complete(tiny, **body), requests.post(tiny.url + "/v1/chat/completions", timeout=10, json={
            "messages": [{"role": "user", "content": "hi"}], **body})):
        assert reply.status_code == 400
        assert reply.json() == {"error": {"message": reply.json()["error"]["message"], "type": "BadRequestError",
                                          "param": param, "code": 400}}
        assert message in reply.json()["error"]["message"]


def test_sampling_values_in_range_are_accepted(tiny):
    reply = complete(tiny, temperature=0, top_p=1, top_k=-1, min_p=0, n=1, presence_penalty=-2, max_tokens=2)
    assert reply.status_code == 200


OUT_OF_VOCABULARY = {"error": {"message": "Token id 12000 is out of vocabulary", "type": "BadRequestError",
                               "param": None, "code": 400}}


def test_a_prompt_id_out_of_the_vocabulary_is_vllms_400_and_in_a_stream_its_error_event(simulator):
    # real vLLM 0.32, asked for [5, 7999, 12000, 9000] by a model of 8,000 tokens: the largest id is named
    sim = simulator("--profile", "tiny", "--vocab-size", "8000")
    ids = [5, 7999, 12000, 9000]
    plain = complete(sim, prompt=ids, max_tokens=2)
    assert (plain.status_code, plain.json()) == (400, OUT_OF_VOCABULARY)
    streamed = complete(sim, prompt=ids, max_tokens=2, stream=True)
    assert streamed.status_code == 200 and streamed.headers["Content-Type"].startswith("text/event-stream")
    assert streamed.text == f"data: {json.dumps(OUT_OF_VOCABULARY)}\n\ndata: [DONE]\n\n"
    assert complete(sim, prompt=[5, 7999], max_tokens=2).status_code == 200
    assert complete(sim, prompt=[5, 7999], max_tokens=2, stream=True).text.endswith("data: [DONE]\n\n")


@pytest.mark.parametrize(("profile", "vocab_size"), [("h100-llama-3.1-8b", 128256), ("tiny", 32000)])
def test_each_profile_has_its_models_vocabulary(simulator, profile, vocab_size):
    sim = simulator("--profile", profile)
    assert complete(sim, prompt=[vocab_size - 1], max_tokens=1).status_code == 200
    refused = complete(sim, prompt=[vocab_size], max_tokens=1)
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == f"Token id {vocab_size} is out of vocabulary"


@pytest.mark.parametrize("tokens", [["a"], [1.5], "abc", [[1, 2]], None])
def test_detokenize_takes_integer_token_ids_only(tiny, tokens):
    reply = requests.post(tiny.url + "/detokenize", json={"tokens": tokens}, timeout=5)
    assert reply.status_code == 400 and reply.json()["error"]["code"] == 400


@pytest.mark.parametrize(("method", "path", "status", "detail"), [
    ("GET", "/no/such/route", 404, "Not Found"),
    ("POST", "/v1/embeddings", 404, "Not Found"),
    ("GET", "/v1/completions", 405, "Method Not Allowed"),
])
def test_routing_errors_are_fastapis_json(tiny, method, path, status, detail):
    reply = requests.request(method, tiny.url + path, timeout=5)
    assert reply.status_code == status
    assert reply.headers["Content-Type"].startswith("application/json")
    assert reply.json() == {"detail": detail}


def test_a_client_that_gives_up_on_a_stalled_request_is_an_abort(simulator, tmp_path):
    truth = tmp_path / "truth.jsonl"
    sim = simulator("--profile", "tiny", "--fault-stall-rate", "1", "--fault-stall-s", "60",
                    "--ground-truth-log", str(truth))
    stalled = lambda: requests.get(sim.url + "/sim/stats", timeout=5).json()["num_requests_stalled"]  # noqa: E731
    body = json.dumps({"prompt": "x", "max_tokens": 5, "stream": True})
    host, port = sim.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                      f"X-Request-Id: held-1\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
        wait_until(lambda: stalled() == 1, message="request held by the stall")
    wait_until(lambda: requests.get(sim.url + "/sim/stats", timeout=5).json()["num_requests_aborted"] == 1,
               message="abort counted")
    assert metric_value(sim.url, "vllm:request_success_total", finished_reason="abort") == 0  # as vLLM 0.32
    assert stalled() == 0
    record = json.loads(wait_until(truth.read_text, message="ground-truth record"))
    assert record["request_id"] == "held-1" and record["outcome"] == "aborted"
    assert record["first_token_s"] is None and record["output_tokens"] == 0


def test_the_api_key_is_masked_in_the_start_up_log_and_shown_nowhere(simulator, tmp_path):
    key = f"sk-batchscope-{uuid.uuid4().hex}"
    truth = tmp_path / "truth.jsonl"
    sim = simulator("--profile", "tiny", "--api-key", key, "--ground-truth-log", str(truth))
    auth = {"Authorization": f"Bearer {key}"}
    assert complete(sim, max_tokens=2).status_code == 401
    for body in ({"max_tokens": 3}, {"max_tokens": 3, "stream": True}, {"max_tokens": 0}):
        requests.post(sim.url + "/v1/completions", json={"prompt": "x", **body}, headers=auth, timeout=10)
    wait_until(lambda: len(truth.read_text().splitlines()) == 2, message="two served requests logged")
    shown = {path: requests.get(sim.url + path, headers=auth, timeout=5).text
             for path in ("/metrics", "/v1/models", "/version", "/sim/stats", "/no/such/route")}
    shown["ground truth"] = truth.read_text()
    shown["log"] = sim.log()
    assert all(key not in text for text in shown.values()), [where for where, text in shown.items() if key in text]
    assert "'api_key': '***'" in shown["log"]  # the non-default args line, masked as vLLM's config is shown
