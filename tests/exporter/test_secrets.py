"""Secrets on a vLLM command line are masked where the ServingConfig is built, so the info metric, the
configuration-change log line and the Grafana annotation only ever see `***`."""

from __future__ import annotations

import logging

import docker
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from batchscope.exporter.changes import ChangeTracker
from batchscope.exporter.collector import BatchscopeCollector, ExporterSources
from batchscope.exporter.config import ServingConfig, parse_command
from batchscope.exporter.docker_source import DockerSource
from tests.stubs import HttpStub, Reply, json_reply

KEY, HF, OTHER = "sk-key-1111", "hf_token_2222", "pw-3333"
COMMAND = (f"vllm serve m --api-key {KEY} --hf-token={HF} --max-num-seqs 64 --ssl-keyfile /k.pem "
           f"--db-password {OTHER} --max-num-batched-tokens 2048")


class Annotations:
    def __init__(self) -> None:
        self.texts: list[str] = []

    def post(self, text: str, when_s: float, tags: list[str]) -> None:
        self.texts.append(text)


def test_secret_flags_are_masked_in_both_spellings_and_the_rest_kept():
    config = parse_command(COMMAND)
    assert config.other_flags == {"api_key": "***", "hf_token": "***", "ssl_keyfile": "/k.pem",
                                  "db_password": "***"}
    assert config.max_num_seqs == "64"
    assert "api_key=***,db_password=***,hf_token=***" in config.labels()["other_flags"]
    assert not any(secret in str(config.model_dump()) for secret in (KEY, HF, OTHER))


def test_every_serving_config_is_masked_however_it_is_built():
    config = ServingConfig(other_flags={"api_key": KEY}).merged_over(ServingConfig(other_flags={"hf_token": HF}))
    assert config.other_flags == {"api_key": "***", "hf_token": "***"}


def test_a_new_key_alone_is_no_change_but_adding_a_secret_flag_is_shown_masked(caplog):
    caplog.set_level(logging.INFO, logger="batchscope.exporter")
    annotations = Annotations()
    tracker = ChangeTracker(annotations)
    tracker.observe(parse_command(COMMAND), 100.0)
    tracker.observe(parse_command(COMMAND.replace(KEY, "sk-rotated-9999")), 100.0)
    assert tracker.changes == 0  # the masked values are equal: a key rotation cannot be seen, by design
    tracker.observe(parse_command(COMMAND.replace("2048", "8192") + " --openai-api-key=sk-new-5555"), 100.0)
    assert tracker.changes == 1
    (text,) = annotations.texts
    assert "max_num_batched_tokens: 2048 → 8192" in text and "openai_api_key=***" in text
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "configuration change: " + text in logged
    assert not any(secret in text + logged for secret in (KEY, HF, OTHER, "sk-rotated-9999", "sk-new-5555"))


def test_config_info_shows_masked_flags_and_the_vllm_key_is_only_a_header(caplog):
    caplog.set_level(logging.DEBUG)
    seen = []

    def route(method: str, path: str) -> Reply:
        if path == "/metrics":
            return Reply(body=b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n",
                         content_type="text/plain")
        return json_reply({"data": [{"id": "m", "max_model_len": 4096}]}) if path == "/v1/models" \
            else json_reply({"version": "0.11.0"})

    vllm = HttpStub(route).start()
    try:
        sources = ExporterSources(vllm_url=vllm.url, vllm_api_key=KEY, vllm_command=COMMAND)
        registry = CollectorRegistry()
        registry.register(BatchscopeCollector(sources, ChangeTracker()))
        exposition = generate_latest(registry).decode()
        seen = [r.headers.get("Authorization") for r in vllm.requests if r.path == "/v1/models"]
    finally:
        vllm.stop()
    assert 'other_flags="api_key=***,db_password=***,hf_token=***,ssl_keyfile=/k.pem"' in exposition
    assert seen == [f"Bearer {KEY}"]
    assert not any(secret in exposition + caplog.text for secret in (KEY, HF, OTHER))


def test_the_docker_containers_cmd_is_masked(engine_with_secrets):
    client = lambda: docker.DockerClient(base_url=engine_with_secrets.url.replace("http", "tcp"),  # noqa: E731
                                         version="1.43")
    view = DockerSource(client, container="vllm").read()
    assert view.config.other_flags["api_key"] == "***" and view.config.other_flags["hf_token"] == "***"
    assert KEY not in view.config.model_dump_json() and HF not in view.config.model_dump_json()


def _engine_route(method: str, path: str) -> Reply:
    attrs = {"Id": "c0ffee", "Config": {"Entrypoint": ["vllm"], "Cmd": COMMAND.split()[1:], "Tty": False},
             "State": {"StartedAt": "2026-11-30T05:00:00Z"}}
    if path.startswith(("/v1.43/containers/vllm/json", "/v1.43/containers/c0ffee/json")):
        return json_reply(attrs)
    if path.startswith("/v1.43/containers/c0ffee/logs"):
        return Reply(body=b"", content_type="application/vnd.docker.raw-stream")
    return json_reply({"message": "no such thing"}, status=404)


@pytest.fixture
def engine_with_secrets():
    """A Docker engine API stub whose vLLM container was started with keys on its command line."""
    stub = HttpStub(_engine_route).start()
    yield stub
    stub.stop()
