"""Where the exporter learns the serving configuration: command lines, and the docker SDK (against a stub
Docker engine API, since no engine runs here)."""

from __future__ import annotations

import json
import logging
import socket
import struct
from urllib.parse import parse_qs, urlsplit

import docker
import pytest

from batchscope.exporter.config import ServingConfig, from_exposed, parse_command
from batchscope.exporter.docker_source import DockerSource
from batchscope.vllm.log import parse_capacity
from tests.stubs import HttpStub, Reply, json_reply

COMMAND = ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--max-num-seqs", "256",
           "--max-num-batched-tokens=8192", "--gpu-memory-utilization", "0.95", "--max-model-len", "8192",
           "--enable-prefix-caching", "--tensor-parallel-size", "1"]
# the real CPU build (v0.32.0, shared/reference/real-parts.md): the device named, one line
LOG = ("(EngineCore_DP0 pid=4242) INFO 12-01 10:00:00 [cpu_worker.py:260] Explicitly set (1.0/10.71) GiB for KV "
       "cache on node 0.\n"
       "(EngineCore_DP0 pid=4242) INFO 12-01 10:00:00 [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 "
       "tokens, Maximum concurrency for 2,048 tokens per request: 1024.00x\n")
# the forms vLLM has written (shared/reference/vllm.md; the `+ host` one from v0.32's kv_cache_utils.py)
CAPACITY_LINES = {
    "GPU, two lines (2025)": ("(EngineCore_DP0 pid=1133552) INFO 10-03 16:22:17 [kv_cache_utils.py:864] GPU KV cache "
                              "size: 42,656 tokens\n(EngineCore_DP0 pid=1133552) INFO 10-03 16:22:17 "
                              "[kv_cache_utils.py:868] Maximum concurrency for 32,768 tokens per request: 1.30x\n",
                              (42_656, 1.30)),
    "CPU, one line (2026)": (LOG, (2_097_152, 1024.0)),
    "CPU, a forced tiny cache": ("INFO 12-01 10:00:00 [kv_cache_utils.py:2327] CPU KV cache size: 2,560 tokens, "
                                 "Maximum concurrency for 2,048 tokens per request: 1.25x\n", (2560, 1.25)),
    "GPU + host": ("INFO 12-01 10:00:00 [kv_cache_utils.py:2327] GPU + host KV cache size: 1,048,576 tokens, "
                   "Maximum concurrency for 8,192 tokens per request: 128.00x\n", (1_048_576, 128.0)),
}


def test_vllm_serve_command_line_is_parsed_into_known_fields_and_other_flags():
    config = parse_command(" ".join(COMMAND))
    assert (config.model, config.max_num_seqs, config.max_num_batched_tokens) == (
        "meta-llama/Llama-3.1-8B-Instruct", "256", "8192")
    assert (config.gpu_memory_utilization, config.max_model_len) == ("0.95", "8192")
    assert config.other_flags == {"enable_prefix_caching": "true", "tensor_parallel_size": "1"}


def test_the_api_server_module_form_is_parsed_too():
    config = parse_command("python3 -m vllm.entrypoints.openai.api_server --model m --max-num-seqs 64")
    assert (config.model, config.max_num_seqs) == ("m", "64")


def test_command_values_win_over_exposed_ones_and_diff_reads_like_a_change_log():
    exposed = from_exposed({"block_size": "16", "gpu_memory_utilization": "0.9"},
                           {"id": "llama", "root": "/models/llama", "max_model_len": 8192}, "0.11.0")
    merged = parse_command("vllm serve /models/llama --gpu-memory-utilization 0.95").merged_over(exposed)
    assert (merged.gpu_memory_utilization, merged.block_size, merged.vllm_version) == ("0.95", "16", "0.11.0")
    later = ServingConfig(**{**merged.model_dump(), "max_num_batched_tokens": "8192"})
    before = ServingConfig(**{**merged.model_dump(), "max_num_batched_tokens": "2048"})
    assert later.diff(before) == ["max_num_batched_tokens: 2048 → 8192"]
    assert later.diff(ServingConfig()) == []  # unknown before: a source answering, not a change


def test_a_knob_newly_passed_or_left_out_is_a_change_against_vllms_default():
    plain = parse_command("vllm serve m --max-model-len 8192")
    seqs = parse_command("vllm serve m --max-model-len 8192 --max-num-seqs 64")
    assert seqs.diff(plain) == ["max_num_seqs: vLLM default → 64"]
    assert plain.diff(seqs) == ["max_num_seqs: 64 → vLLM default"]
    # a flag passed at vLLM's fixed default changes nothing
    assert parse_command("vllm serve m --max-model-len 8192 --gpu-memory-utilization 0.92").diff(plain) == []
    # another flag given or dropped is a change of other_flags
    assert parse_command("vllm serve m --max-model-len 8192 --enforce-eager").diff(plain) == [
        "other_flags: none → enforce_eager=true"]


QUEUE_KNOBS = ("vllm serve m --max-num-seqs 16 --max-num-active-seqs 8 --max-num-queued-reqs 4 "
               "--max-num-queued-tokens 4096 --long-prefill-token-threshold 256")


def test_the_queue_knobs_are_labels_of_their_own_and_a_switch_reads_true_or_false():
    labels = parse_command(QUEUE_KNOBS + " --long-prefill-token-threshold-adaptive").labels()
    assert {key: labels[key] for key in ("max_num_active_seqs", "max_num_queued_reqs", "max_num_queued_tokens",
                                         "long_prefill_token_threshold", "long_prefill_token_threshold_adaptive")} \
        == {"max_num_active_seqs": "8", "max_num_queued_reqs": "4", "max_num_queued_tokens": "4096",
            "long_prefill_token_threshold": "256", "long_prefill_token_threshold_adaptive": "true"}
    assert labels["other_flags"] == ""  # none of them, nor the switch's off form, is another flag
    off = parse_command("vllm serve m --no-long-prefill-token-threshold-adaptive")
    assert (off.long_prefill_token_threshold_adaptive, off.other_flags) == ("false", {})
    assert parse_command("vllm serve m --long_prefill_token_threshold_adaptive").long_prefill_token_threshold_adaptive \
        == "true"


def test_the_queue_knobs_diff_like_the_others():
    before = parse_command(QUEUE_KNOBS)
    after = parse_command(QUEUE_KNOBS.replace("--max-num-queued-reqs 4", "--max-num-queued-reqs 8")
                          + " --long-prefill-token-threshold-adaptive")
    assert after.diff(before) == ["max_num_queued_reqs: 4 → 8",
                                  "long_prefill_token_threshold_adaptive: vLLM default → true"]
    off = parse_command(QUEUE_KNOBS + " --no-long-prefill-token-threshold-adaptive")
    assert off.diff(after) == ["max_num_queued_reqs: 8 → 4", "long_prefill_token_threshold_adaptive: true → false"]
    # the switch's off form is vLLM's default, and so is a threshold of 0: passing either changes nothing
    assert off.diff(before) == [] and before.diff(off) == []
    assert parse_command(QUEUE_KNOBS + " --long-prefill-token-threshold-adaptive").diff(before) == [
        "long_prefill_token_threshold_adaptive: vLLM default → true"]
    plain = parse_command("vllm serve m")
    assert parse_command("vllm serve m --long-prefill-token-threshold 0").diff(plain) == []
    # no limit is vLLM's default for the admission knobs: any value passed, 0 included (refuse all), is a change
    assert parse_command("vllm serve m --max-num-queued-tokens 0").diff(plain) == [
        "max_num_queued_tokens: vLLM default → 0"]
    assert plain.diff(parse_command("vllm serve m --max-num-active-seqs 8")) == [
        "max_num_active_seqs: 8 → vLLM default"]


def test_a_knob_only_one_side_knows_without_a_command_line_is_still_no_change():
    """The command line left a knob out on both sides: vLLM's answer arriving at one scrape only (block_size from
    cache_config_info, max_model_len from /v1/models) is a source answering, not a change."""
    command = parse_command("vllm serve m")
    exposed = from_exposed({"block_size": "16"}, {"id": "m", "max_model_len": 4096}, None)
    assert command.merged_over(exposed).diff(command) == []
    assert command.diff(command.merged_over(exposed)) == []
    # no command line on one side (the docker engine away at that scrape): nothing is known to be left out
    assert exposed.diff(command) == [] and command.diff(exposed) == []
    assert "defaulted" not in command.labels()


@pytest.mark.parametrize("form", CAPACITY_LINES)
def test_capacity_is_read_from_vllms_log_lines_on_any_device(form):
    text, figures = CAPACITY_LINES[form]
    assert parse_capacity(text) == figures
    assert parse_capacity("INFO [gpu_worker.py:298] Available KV cache memory: 58.11 GiB") == (None, None)


def docker_frames(text: str) -> bytes:
    """Docker's multiplexed log stream: an 8-byte header (stream 2 = stderr, big-endian size) per frame."""
    payload = text.encode()
    return struct.pack(">BxxxL", 2, len(payload)) + payload


@pytest.fixture
def engine():
    attrs = {"Id": "c0ffee", "Name": "/batchscope-vllm-1",
             "Config": {"Entrypoint": ["vllm"], "Cmd": COMMAND[1:], "Tty": False,
                        "Labels": {"com.docker.compose.service": "vllm"}},
             "State": {"Status": "running", "StartedAt": "2026-11-30T05:00:00.123456789Z"}}

    def route(method: str, path: str) -> Reply:
        if path.startswith("/v1.43/containers/json"):
            return json_reply([{"Id": "c0ffee", "Names": ["/batchscope-vllm-1"], "Labels": attrs["Config"]["Labels"]}])
        if path.startswith(("/v1.43/containers/c0ffee/json", "/v1.43/containers/batchscope-vllm-1/json")):
            return json_reply(attrs)
        if path.startswith("/v1.43/containers/c0ffee/logs"):
            return Reply(body=docker_frames(LOG), content_type="application/vnd.docker.raw-stream")
        return json_reply({"message": "no such thing"}, status=404)

    stub = HttpStub(route).start()
    yield stub
    stub.stop()


@pytest.mark.parametrize("by", ["service", "name"])
def test_container_command_and_kv_line_are_read_through_the_docker_sdk(engine, by):
    client = lambda: docker.DockerClient(base_url=engine.url.replace("http", "tcp"), version="1.43")  # noqa: E731
    source = DockerSource(client, container="batchscope-vllm-1" if by == "name" else None, service="vllm")
    view = source.read()
    assert view.config.max_num_batched_tokens == "8192" and view.config.max_num_seqs == "256"
    assert (view.kv_cache_tokens, view.max_concurrency) == (2_097_152, 1024.0)  # the CPU build's line
    assert view.started_at == pytest.approx(1796014800.123456)
    source.read()
    log_reads = [r for r in engine.requests if "/logs" in r.path]
    assert len(log_reads) == 1  # logs are read once per container start, not per scrape
    if by == "service":
        assert any("com.docker.compose.service%3Dvllm" in r.path or "com.docker.compose.service=vllm" in r.path
                   for r in engine.requests if r.path.startswith("/v1.43/containers/json"))


def test_no_daemon_means_no_view_and_no_exception():
    def no_daemon():
        raise docker.errors.DockerException("Error while fetching server API version")

    assert DockerSource(no_daemon).read() is None


def container_attrs(ident: str, labels: dict[str, str], cmd: list[str]) -> dict:
    return {"Id": ident, "Name": f"/{ident}", "Config": {"Entrypoint": ["vllm"], "Cmd": cmd, "Tty": False,
                                                        "Labels": labels},
            "State": {"Status": "running", "StartedAt": "2026-11-30T05:00:00Z"}}


def compose_labels(project: str, service: str) -> dict[str, str]:
    return {"com.docker.compose.project": project, "com.docker.compose.service": service}


class Engine:
    """A stub Docker engine holding containers of two compose projects with the same service names, answering
    /containers/json by its label filters as the engine does (every label given must match)."""

    def __init__(self, containers: list[dict]) -> None:
        self.containers = {c["Id"]: c for c in containers}
        self.stub = HttpStub(self.route).start()

    def route(self, _method: str, path: str) -> Reply:
        url = urlsplit(path)
        if url.path == "/v1.43/containers/json":
            wanted = json.loads(parse_qs(url.query).get("filters", ["{}"])[0]).get("label", [])
            listed = [c for c in self.containers.values()
                      if all(c["Config"]["Labels"].get(k) == v for k, _, v in (w.partition("=") for w in wanted))]
            return json_reply([{"Id": c["Id"], "Names": [c["Name"]], "Labels": c["Config"]["Labels"]} for c in listed])
        parts = url.path.split("/")  # /v1.43/containers/<id>/json | logs
        if len(parts) == 5 and parts[2] == "containers" and parts[3] in self.containers:
            if parts[4] == "json":
                return json_reply(self.containers[parts[3]])
            return Reply(body=docker_frames(LOG), content_type="application/vnd.docker.raw-stream")
        return json_reply({"message": f"No such container: {parts[3] if len(parts) > 3 else path}"}, status=404)

    def source(self, **kwargs) -> DockerSource:
        url = self.stub.url.replace("http", "tcp")
        return DockerSource(lambda: docker.DockerClient(base_url=url, version="1.43"), service="vllm", **kwargs)


@pytest.fixture
def two_projects():
    """Project "other" (listed first) and this stack's "batchscope", each with a vllm service; the exporter's own
    container (named as this host: a container's hostname is its id) is in "batchscope"."""
    engine = Engine([
        container_attrs("0other", compose_labels("other", "vllm"), ["serve", "m", "--max-num-seqs", "8"]),
        container_attrs("1ours", compose_labels("batchscope", "vllm"), ["serve", "m", "--max-num-seqs", "64"]),
        container_attrs(socket.gethostname(), compose_labels("batchscope", "exporter"), ["batchscope", "exporter"]),
    ])
    yield engine
    engine.stub.stop()


def test_the_served_container_is_the_one_of_the_exporters_own_compose_project(two_projects):
    assert two_projects.source().read().config.max_num_seqs == "64"
    # a project given wins over the own container's
    assert two_projects.source(project="other").read().config.max_num_seqs == "8"


def test_outside_a_container_two_projects_are_not_guessed_between(two_projects, caplog):
    source = two_projects.source(own_container="not-a-container")
    with caplog.at_level(logging.WARNING, logger="batchscope.exporter"):
        assert source.read() is None and source.read() is None
    warnings = [r.getMessage() for r in caplog.records if "projects" in r.getMessage()]
    assert warnings == ["docker: service vllm runs in compose projects batchscope, other; set --docker-project to "
                        "read one"]  # once, not at every scrape
    del two_projects.containers["0other"]  # one project left: no doubt which container is meant
    assert source.read().config.max_num_seqs == "64"
