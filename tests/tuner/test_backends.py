"""The backends: argv building and knob replacement (pure), the docker backend at the SDK boundary (a stub
Docker Engine API records what would be created), and the simulator started through each process backend."""

from __future__ import annotations

import json
import shlex
import struct
import sys

import docker
import pytest
import requests

from batchscope.tuner.plan import CommandBackend, DockerBackend, ServingParams, SimulatorBackend
from batchscope.tuner.run.servers import (
    CommandServer,
    DockerServer,
    SimulatorServer,
    StartFailed,
    command_argv,
    recreate_spec,
    replace_knobs,
)
from tests.conftest import free_port
from tests.stubs import HttpStub, Reply, json_reply

PARAMS = ServingParams(model="meta-llama/Llama-3.1-8B-Instruct", max_model_len=8192, max_num_batched_tokens=8192)
# the real CPU build's lines (v0.32.0, shared/reference/real-parts.md): the device is named, one line
VLLM_LOG = ("(EngineCore_DP0 pid=4242) INFO 12-01 10:00:00 [cpu_worker.py:260] Explicitly set (1.0/10.71) GiB for KV "
            "cache on node 0.\n"
            "(EngineCore_DP0 pid=4242) INFO 12-01 10:00:00 [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 "
            "tokens, Maximum concurrency for 2,048 tokens per request: 1024.00x\n")


def test_knob_flags_are_replaced_in_either_spelling_and_other_flags_kept():
    command = ["meta-llama/Llama-3.1-8B-Instruct", "--max-num-seqs", "256", "--max_num_batched_tokens=2048",
               "--api-key", "sk-1", "--enable-prefix-caching"]
    replaced = replace_knobs(command, PARAMS)
    assert replaced[:4] == ["meta-llama/Llama-3.1-8B-Instruct", "--api-key", "sk-1", "--enable-prefix-caching"]
    assert replaced[4:] == ["--max-num-batched-tokens", "8192", "--max-model-len", "8192"]  # 256 is not kept


def test_the_command_template_is_split_without_a_shell_and_takes_literal_braces():
    backend = CommandBackend(command="vllm serve {model} --port {port} {flags} --override-generation-config "
                             "'{\"temperature\": 0}'", port=8123)
    argv = command_argv(backend, PARAMS)
    assert argv[:5] == ["vllm", "serve", PARAMS.model, "--port", "8123"]
    assert argv[-1] == '{"temperature": 0}' and "--max-num-batched-tokens" in argv


CONTAINER = {
    "Id": "c0ffee0123456789", "Name": "/batchscope-vllm-1",
    "Config": {"Image": "vllm/vllm-openai:v0.11.0", "Entrypoint": ["vllm", "serve"],
               "Cmd": ["meta-llama/Llama-3.1-8B-Instruct", "--max-num-seqs", "128", "--max-num-batched-tokens",
                       "2048", "--api-key", "sk-secret"],
               "Env": ["HF_TOKEN=hf_x", "VLLM_LOGGING_LEVEL=INFO"], "ExposedPorts": {"8000/tcp": {}},
               "Labels": {"com.docker.compose.service": "vllm", "com.docker.compose.project": "batchscope"},
               "Tty": False},
    "HostConfig": {"Binds": ["/srv/hf:/root/.cache/huggingface:rw"], "NetworkMode": "batchscope_default",
                   "PortBindings": {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": "8000"}]},
                   "ShmSize": 17179869184, "IpcMode": "host",
                   "DeviceRequests": [{"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]}]},
    "NetworkSettings": {"Networks": {"batchscope_default": {"Aliases": ["vllm", "c0ffee012345"]}}},
    "State": {"Status": "running"},
}


def test_recreate_spec_keeps_the_container_and_changes_only_the_knobs():
    spec = recreate_spec(CONTAINER, PARAMS)
    assert spec["host_config"] == CONTAINER["HostConfig"] and spec["image"] == "vllm/vllm-openai:v0.11.0"
    assert spec["networking_config"] == {"EndpointsConfig": {"batchscope_default": {"Aliases": ["vllm"]}}}
    assert spec["command"][:3] == ["meta-llama/Llama-3.1-8B-Instruct", "--api-key", "sk-secret"]
    assert (spec["name"], spec["ports"]) == ("batchscope-vllm-1", [("8000", "tcp")])


def docker_frames(text: str) -> bytes:
    payload = text.encode()
    return struct.pack(">BxxxL", 2, len(payload)) + payload


@pytest.fixture
def engine():
    """A Docker Engine API stub (v1.43) whose /health and /metrics also stand in for the new container's vLLM."""
    created = {**CONTAINER, "Id": "beef", "State": {"Status": "running"}}

    def route(method: str, path: str) -> Reply:
        if method == "GET" and path.startswith("/v1.43/containers/batchscope-vllm-1/json"):
            return json_reply(CONTAINER)
        if method == "GET" and path.startswith("/v1.43/containers/beef/json"):
            return json_reply(created)
        if method == "POST" and path.startswith(("/v1.43/containers/c0ffee0123456789/stop",
                                                  "/v1.43/containers/beef/start", "/v1.43/containers/beef/stop")):
            return Reply(status=204)
        if method == "DELETE" and path.startswith("/v1.43/containers/c0ffee0123456789"):
            return Reply(status=204)
        if method == "POST" and path.startswith("/v1.43/containers/create"):
            return json_reply({"Id": "beef", "Warnings": []}, status=201)
        if path.startswith("/v1.43/containers/beef/logs"):
            return Reply(body=docker_frames(VLLM_LOG), content_type="application/vnd.docker.raw-stream")
        if path == "/health":
            return Reply(body=b"")
        return json_reply({"message": f"no such thing: {method} {path}"}, status=404)

    stub = HttpStub(route).start()
    yield stub
    stub.stop()


def test_the_docker_backend_recreates_the_container_with_the_new_flags(engine, tmp_path):
    client = lambda: docker.DockerClient(base_url=engine.url.replace("http", "tcp"), version="1.43")  # noqa: E731
    server = DockerServer(DockerBackend(container="batchscope-vllm-1", url=engine.url, startup_timeout_s=10),
                          client_factory=client)
    started = server.start(PARAMS, tmp_path / "server.log")
    calls = [(r.method, r.path.split("?")[0]) for r in engine.requests if r.path.startswith("/v1.43")]
    order = [calls.index(call) for call in [("POST", "/v1.43/containers/c0ffee0123456789/stop"),
                                            ("DELETE", "/v1.43/containers/c0ffee0123456789"),
                                            ("POST", "/v1.43/containers/create"),
                                            ("POST", "/v1.43/containers/beef/start")]]
    assert order == sorted(order)
    create = next(r for r in engine.requests if r.path.startswith("/v1.43/containers/create"))
    assert "name=batchscope-vllm-1" in create.path
    body = create.json()
    assert body["Image"] == "vllm/vllm-openai:v0.11.0" and body["Entrypoint"] == ["vllm", "serve"]
    assert body["HostConfig"]["DeviceRequests"] == CONTAINER["HostConfig"]["DeviceRequests"]
    assert body["HostConfig"]["Binds"] == ["/srv/hf:/root/.cache/huggingface:rw"]
    assert body["HostConfig"]["NetworkMode"] == "batchscope_default" and body["HostConfig"]["ShmSize"] == 17179869184
    assert body["Labels"] == CONTAINER["Config"]["Labels"] and body["Env"] == CONTAINER["Config"]["Env"]
    assert body["NetworkingConfig"]["EndpointsConfig"]["batchscope_default"]["Aliases"] == ["vllm"]
    command = " ".join(body["Cmd"])
    # the setting's knobs only: the container's --max-num-seqs 128 is not the setting's, so it goes
    assert "--max-num-batched-tokens 8192" in command and "max-num-seqs" not in command and "2048" not in command
    assert started.reported.kv_capacity_tokens == 2_097_152 and started.url == engine.url  # the CPU build's line
    assert started.command_line[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert "sk-secret" not in json.dumps(started.command_line)
    server.stop()
    assert any(r.path.startswith("/v1.43/containers/beef/stop") for r in engine.requests)


@pytest.mark.e2e
def test_the_command_backend_runs_the_simulator_as_its_command(tmp_path):
    port = free_port()
    template = shlex.quote(sys.executable) + " -m batchscope.cli sim serve {model} --port {port} {flags} " \
        "--profile tiny --api-key sk-1"
    backend = CommandBackend(command=template, port=port, startup_timeout_s=30)
    server = CommandServer(backend)
    params = ServingParams(model="sim-model", max_model_len=1024, max_num_seqs=8)
    started = server.start(params, tmp_path / "server.log")
    try:
        assert started.url == f"http://127.0.0.1:{port}" and server.alive()
        assert requests.get(started.url + "/health", timeout=5).status_code == 200
        assert started.reported.kv_capacity_tokens and started.reported.kv_capacity_tokens > 1024
        assert "--max-num-seqs" in started.command_line and "sk-1" not in started.command_line
        assert started.command_line[-2:] == ["--api-key", "***"]
    finally:
        server.stop()
    assert not server.alive() and "GPU KV cache size" in (tmp_path / "server.log").read_text()
    with pytest.raises(requests.ConnectionError):
        requests.get(started.url + "/health", timeout=2)


@pytest.mark.e2e
def test_a_server_that_refuses_to_start_is_one_line_with_the_log_tail(tmp_path):
    server = SimulatorServer(SimulatorBackend(profile="tiny"))
    params = ServingParams(model="sim-model", max_model_len=1024, gpu_memory_utilization=0.05)
    with pytest.raises(StartFailed) as failure:
        server.start(params, tmp_path / "server.log")
    assert "server exited with status 2" in str(failure.value) and "\n" not in str(failure.value)
    assert "gpu_memory_utilization" in str(failure.value) or "memory" in str(failure.value)
    assert failure.value.log_tail and not server.alive()
