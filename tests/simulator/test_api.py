"""The simulator's HTTP API over loopback: vLLM's shapes, errors, auth, disconnects and faults."""

from __future__ import annotations

import json
import socket
import time

import openai
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import wait_until

pytestmark = pytest.mark.e2e


def aborted(base_url: str) -> int:
    """Requests the simulator aborted (client gone or stream cut): /sim/stats, since vLLM 0.32 counts none."""
    return requests.get(base_url + "/sim/stats", timeout=5).json()["num_requests_aborted"]


def metric_value(base_url: str, name: str, **labels: str) -> float:
    """One sample from the server's /metrics, parsed with prometheus_client's parser."""
    text = requests.get(base_url + "/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise KeyError(name)


@pytest.fixture
def tiny(simulator):
    return simulator("--profile", "tiny", "--seed", "7")


def test_openai_client_streams_chat_and_completion_with_usage(tiny):
    client = openai.OpenAI(base_url=tiny.url + "/v1", api_key="unused")
    chunks = list(client.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "Say something"}], max_completion_tokens=12,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    ))
    content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 12
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    prompt_tokens = requests.post(tiny.url + "/tokenize", json={"messages": [
        {"role": "user", "content": "Say something"}]}, timeout=5).json()["count"]
    assert chunks[-1].usage.prompt_tokens == prompt_tokens

    stream = client.completions.create(model="sim-model", prompt=[11, 12, 13, 14], max_tokens=20, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert sum(1 for c in chunks if c.choices) == 20
    assert chunks[-1].usage.prompt_tokens == 4 and chunks[-1].usage.completion_tokens == 20


def test_non_streaming_completion_and_chat_report_exact_usage(tiny):
    client = openai.OpenAI(base_url=tiny.url + "/v1", api_key="unused")
    completion = client.completions.create(model="sim-model", prompt="one two three", max_tokens=7,
                                           extra_body={"ignore_eos": True})
    assert completion.usage.prompt_tokens == 4  # BOS + three words
    assert completion.usage.completion_tokens == 7
    assert len(completion.choices[0].text.split()) == 7
    chat = client.chat.completions.create(model="sim-model", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=5, extra_body={"ignore_eos": True})
    assert chat.usage.completion_tokens == 5 and chat.choices[0].finish_reason == "length"


def test_without_ignore_eos_a_seeded_eos_ends_some_outputs_early_but_never_before_min_tokens(tiny):
    lengths = []
    for _ in range(30):
        body = {"prompt": [1, 2, 3], "max_tokens": 300, "min_tokens": 20}
        reply = requests.post(tiny.url + "/v1/completions", json=body, timeout=30).json()
        lengths.append((reply["usage"]["completion_tokens"], reply["choices"][0]["finish_reason"]))
    assert all(n >= 20 for n, _ in lengths)
    assert any(reason == "stop" and n < 300 for n, reason in lengths)  # tiny profile: EOS chance 1% per token
    assert all((reason == "length") == (n == 300) for n, reason in lengths)


@pytest.mark.parametrize("stream", [False, True])
def test_output_past_max_model_len_is_cut_to_fit_as_vllm_032_does(tiny, stream):
    """real-parts.md §1: prompt 2000 + max_tokens 100 at max_model_len 2048 -> 48 tokens, "length"."""
    body = {"prompt": [5] * 4000, "max_tokens": 200, "ignore_eos": True, "stream": stream,
            "stream_options": {"include_usage": True} if stream else None}
    reply = requests.post(tiny.url + "/v1/completions", json=body, timeout=30)
    assert reply.status_code == 200
    if stream:
        chunks = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: {")]
        usage, finish = chunks[-1]["usage"], [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
    else:
        usage, finish = reply.json()["usage"], reply.json()["choices"][0]["finish_reason"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], finish) == (4000, 96, "length")


def test_a_prompt_over_max_model_len_is_400_with_vllms_error_json(tiny):
    reply = requests.post(tiny.url + "/v1/completions", json={"prompt": [5] * 4097, "max_tokens": 5}, timeout=5)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("BadRequestError", 400, "input_tokens")
    assert error["message"].startswith("This model's maximum context length is 4096 tokens. However, your prompt "
                                       "contains 4097 input tokens")


def test_bad_requests_get_400_or_404(tiny):
    post = lambda body: requests.post(tiny.url + "/v1/completions", json=body, timeout=5)  # noqa: E731
    assert post({"prompt": "x", "max_tokens": 0}).status_code == 400
    assert post({"prompt": "x", "max_tokens": 5, "min_tokens": 9}).status_code == 400
    assert post({"prompt": {"a": 1}}).status_code == 400
    assert post({"prompt": "x", "model": "other"}).status_code == 404
    assert requests.post(tiny.url + "/v1/completions", data="{not json", timeout=5).status_code == 400


def test_api_key_is_enforced_on_v1_routes_only(simulator):
    sim = simulator("--profile", "tiny", "--api-key", "sekret")
    assert requests.get(sim.url + "/v1/models", timeout=5).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert requests.post(sim.url + "/v1/completions", json={"prompt": "x"}, headers=wrong, timeout=5).status_code == 401
    assert requests.get(sim.url + "/health", timeout=5).status_code == 200
    assert requests.get(sim.url + "/metrics", timeout=5).status_code == 200
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="sekret")
    assert client.completions.create(model="sim-model", prompt="x", max_tokens=2).usage.completion_tokens >= 1
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=sim.url + "/v1", api_key="bad").models.list()


def test_models_version_tokenize_and_health(tiny):
    card = requests.get(tiny.url + "/v1/models", timeout=5).json()["data"][0]
    assert card["id"] == "sim-model" and card["max_model_len"] == 4096 and card["owned_by"] == "vllm"
    assert requests.get(tiny.url + "/version", timeout=5).json() == {"version": "0.32.0"}  # the release it follows
    tokens = requests.post(tiny.url + "/tokenize", json={"prompt": "Hello, world"}, timeout=5).json()
    assert tokens["count"] == 4 and tokens["max_model_len"] == 4096
    text = requests.post(tiny.url + "/detokenize", json={"tokens": [5, 6]}, timeout=5).json()["prompt"]
    assert len(text.split()) == 2


def test_served_model_name_is_reported_and_labels_metrics(simulator):
    sim = simulator("--profile", "tiny", "--served-model-name", "alias")
    assert requests.get(sim.url + "/v1/models", timeout=5).json()["data"][0]["id"] == "alias"
    assert metric_value(sim.url, "vllm:num_requests_running", model_name="alias", engine="0") == 0


def test_client_disconnect_aborts_the_request_and_frees_its_kv_blocks(tiny):
    body = json.dumps({"prompt": list(range(1, 1000)), "max_tokens": 3000, "ignore_eos": True, "stream": True})
    host, port = tiny.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
        received = b""
        for _ in range(100):  # headers arrive first, then the first token event
            received += sock.recv(4096)
            if b"data: " in received:
                break
        assert b"data: " in received
        wait_until(lambda: metric_value(tiny.url, "vllm:kv_cache_usage_perc") > 0, message="KV in use")
    wait_until(lambda: aborted(tiny.url) == 1, message="the request aborted")
    # vLLM 0.32 counts a client disconnect nowhere in request_success_total (real-parts.md §1)
    assert metric_value(tiny.url, "vllm:request_success_total", finished_reason="abort") == 0
    assert metric_value(tiny.url, "vllm:e2e_request_latency_seconds_count") == 0
    assert metric_value(tiny.url, "vllm:kv_cache_usage_perc") == 0
    assert metric_value(tiny.url, "vllm:num_requests_running") == 0
    assert metric_value(tiny.url, "vllm:generation_tokens_total") < 3000


def test_injected_500s(simulator):
    sim = simulator("--profile", "tiny", "--fault-error-rate", "1")
    reply = requests.post(sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3}, timeout=5)
    assert reply.status_code == 500 and reply.json()["error"]["code"] == 500


def test_cut_streams_end_without_done(simulator):
    sim = simulator("--profile", "tiny", "--fault-cut-rate", "1")
    body = {"prompt": "x", "max_tokens": 40, "ignore_eos": True, "stream": True}
    events, broken = [], False
    try:
        with requests.post(sim.url + "/v1/completions", json=body, stream=True, timeout=10) as reply:
            events = [line for line in reply.iter_lines() if line.startswith(b"data: ")]
    except requests.exceptions.ChunkedEncodingError:
        broken = True
    assert broken or (events and events[-1] != b"data: [DONE]")
    wait_until(lambda: aborted(sim.url) == 1, message="cut stream aborted in the engine")
    assert metric_value(sim.url, "vllm:request_success_total", finished_reason="abort") == 0
    assert metric_value(sim.url, "vllm:kv_cache_usage_perc") == 0


def test_stall_delays_the_response(simulator):
    sim = simulator("--profile", "tiny", "--fault-stall-rate", "1", "--fault-stall-s", "0.4")
    started = time.monotonic()
    requests.post(sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=10).raise_for_status()
    assert time.monotonic() - started >= 0.4


def test_engine_stall_holds_requests_in_the_engine_without_generating_tokens(simulator):
    """A hung engine core (--fault-engine-stall-*): the request admitted stays running, the next one waits, no token
    is generated for as long as the stall lasts; when it ends both finish."""
    sim = simulator("--profile", "tiny", "--max-num-seqs", "1", "--fault-engine-stall-after-s", "0",
                    "--fault-engine-stall-s", "5")
    body = {"prompt": [1] * 50, "max_tokens": 5, "ignore_eos": True, "stream": True}
    replies = [requests.post(sim.url + "/v1/completions", json=body, stream=True, timeout=20) for _ in range(2)]
    wait_until(lambda: metric_value(sim.url, "vllm:num_requests_waiting") == 2, message="both requests queued")
    # the tiny profile serves 5 tokens in milliseconds: a second of nothing is the stall, sampled every 0.1 s
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:
        assert metric_value(sim.url, "vllm:generation_tokens_total") == 0
        assert metric_value(sim.url, "vllm:num_requests_waiting") == 2
        time.sleep(0.1)
    for reply in replies:
        assert [line for line in reply.iter_lines() if line][-1] == b"data: [DONE]"
    assert metric_value(sim.url, "vllm:generation_tokens_total") == 10


def test_stream_event_cpu_cost_is_real_cpu_of_the_server_process(simulator):
    """--fault-stream-event-cpu-s: each stream event (one step's tokens for one stream) costs the server process
    that much CPU, in its process_cpu_seconds_total (what the API-server CPU alert reads); the stream stays whole."""
    cost, tokens = 0.01, 50
    sim = simulator("--profile", "tiny", "--fault-stream-event-cpu-s", str(cost))
    before = metric_value(sim.url, "process_cpu_seconds_total")
    body = {"prompt": "x", "max_tokens": tokens, "ignore_eos": True, "stream": True}
    with requests.post(sim.url + "/v1/completions", json=body, stream=True, timeout=30) as reply:
        events = [line for line in reply.iter_lines() if line.startswith(b"data: ")]
    assert events[-1] == b"data: [DONE]" and len(events) == tokens + 1
    spent = metric_value(sim.url, "process_cpu_seconds_total") - before
    # one stream: one event per step, so about one per token (the first may carry two); the tiny profile's own
    # work for 50 tokens is a few milliseconds, so without the cost this is far below the bound
    assert spent >= 0.8 * tokens * cost, spent


def test_ground_truth_log_matches_what_the_client_sees(simulator, tmp_path):
    truth = tmp_path / "truth.jsonl"
    sim = simulator("--profile", "tiny", "--ground-truth-log", str(truth))
    client_ttfts = []
    for _ in range(5):
        sent = time.time()
        with requests.post(sim.url + "/v1/completions", stream=True, timeout=10, json={
                "prompt": [1] * 500, "max_tokens": 30, "ignore_eos": True, "stream": True}) as reply:
            lines = reply.iter_lines()
            next(line for line in lines if line.startswith(b"data: {"))
            client_ttfts.append(time.time() - sent)
            assert [line for line in lines if line][-1] == b"data: [DONE]"
    records = [json.loads(line) for line in wait_until(lambda: truth.read_text().splitlines()
                                                      if len(truth.read_text().splitlines()) == 5 else None)]
    assert all(r["outcome"] == "ok" and r["output_tokens"] == 30 and r["prompt_tokens"] == 500 for r in records)
    for client_ttft, record in zip(client_ttfts, records, strict=True):
        server_ttft = record["first_token_s"] - record["arrival_s"]
        assert 0 < server_ttft <= client_ttft < server_ttft + 0.05
        assert record["last_token_s"] > record["first_token_s"]
