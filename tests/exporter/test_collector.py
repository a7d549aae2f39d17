"""exporter.collector in the fast tier: a fresh CollectorRegistry per test, upstreams served from loopback stubs
(a vLLM /metrics text, the load generator's client metrics, /v1/models, /version), an injected timer and clock.
Every value is asserted by its exposed name with get_sample_value."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path

import docker
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from batchscope.exporter.changes import ChangeTracker
from batchscope.exporter.collector import BatchscopeCollector, ExporterSources, kv_capacity
from batchscope.exporter.config import ServingConfig
from batchscope.exporter.docker_source import ContainerView, DockerSource
from batchscope.runs.live_run import MAX_BYTES
from batchscope.vllm.catalogue import ADMISSION_REJECTIONS
from tests.conftest import free_port
from tests.exporter.clock import Clock
from tests.exporter.test_changes import Posted
from tests.stubs import HttpStub, Reply, json_reply

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
VLLM_METRICS = f"""\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 8.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{{engine="0",model_name="{MODEL}"}} 0.25
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",model_name="{MODEL}"}} 3.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="{MODEL}"}} 5.0
vllm:time_to_first_token_seconds_count{{engine="0",model_name="{MODEL}"}} 5.0
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="{MODEL}"}} 1.5
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",gpu_memory_utilization="0.9",num_gpu_blocks="2000"}} 1.0
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.7e+09
"""
CLIENT_METRICS = """\
# HELP batchscope_client_requests_total Requests that ended, by outcome.
# TYPE batchscope_client_requests_total counter
batchscope_client_requests_total{outcome="ok",scenario="chat"} 42.0
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 7.0
"""
MODELS = {"object": "list", "data": [{"id": "llama", "root": MODEL, "max_model_len": 4000}]}


class Upstream:
    """vLLM and the load generator as loopback stubs whose /metrics text a test may change between scrapes."""

    def __init__(self) -> None:
        self.vllm_text = VLLM_METRICS
        self.vllm = HttpStub(self._vllm).start()
        self.loadgen = HttpStub(lambda _method, _path: Reply(body=CLIENT_METRICS.encode(),
                                                             content_type="text/plain")).start()

    def _vllm(self, _method: str, path: str) -> Reply:
        if path == "/metrics":
            return Reply(body=self.vllm_text.encode(), content_type="text/plain")
        if path == "/v1/models":
            return json_reply(MODELS)
        if path == "/version":
            return json_reply({"version": "0.11.0"})
        return Reply(status=404)

    def stop(self) -> None:
        self.vllm.stop()
        self.loadgen.stop()


@pytest.fixture
def upstream():
    servers = Upstream()
    yield servers
    servers.stop()


def registry_of(collector: BatchscopeCollector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def collector_for(upstream: Upstream, *, clock: Clock | None = None, **sources) -> BatchscopeCollector:
    sources.setdefault("loadgen_url", upstream.loadgen.url)
    return BatchscopeCollector(ExporterSources(vllm_url=upstream.vllm.url, timeout_s=2.0, **sources),
                               ChangeTracker(clock=clock or Clock(0.0)))


def config_labels(registry: CollectorRegistry) -> dict[str, str]:
    samples = [s for m in registry.collect() if m.name == "batchscope_vllm_config_info" for s in m.samples]
    assert len(samples) == 1, samples
    return samples[0].labels


def test_vllm_and_client_families_pass_through_with_their_values(upstream):
    registry = registry_of(collector_for(upstream))
    labels = {"engine": "0", "model_name": MODEL}
    assert registry.get_sample_value("vllm:num_requests_running", labels) == 8.0
    assert registry.get_sample_value("vllm:time_to_first_token_seconds_bucket", {**labels, "le": "0.1"}) == 3.0
    assert registry.get_sample_value("vllm:time_to_first_token_seconds_sum", labels) == 1.5
    assert registry.get_sample_value("batchscope_client_requests_total",
                                     {"outcome": "ok", "scenario": "chat"}) == 42.0
    assert registry.get_sample_value("batchscope_up", {"target": "vllm"}) == 1
    assert registry.get_sample_value("batchscope_up", {"target": "loadgen"}) == 1


def test_families_outside_the_two_namespaces_are_not_reexported(upstream):
    names = {m.name for m in registry_of(collector_for(upstream)).collect()}
    assert "process_start_time_seconds" not in names  # read to tell restarts apart, not re-exposed
    assert "python_gc_objects_collected" not in names


def test_an_old_vllm_name_is_exposed_under_todays_and_the_mapping_reported(upstream):
    registry = registry_of(collector_for(upstream))
    labels = {"engine": "0", "model_name": MODEL}
    assert registry.get_sample_value("vllm:kv_cache_usage_perc", labels) == 0.25
    assert registry.get_sample_value("vllm:gpu_cache_usage_perc", labels) is None
    assert registry.get_sample_value("batchscope_vllm_metric_renamed_info", {
        "source_name": "vllm:gpu_cache_usage_perc", "exposed_name": "vllm:kv_cache_usage_perc"}) == 1


def test_the_configuration_comes_from_what_vllm_exposes_and_the_command_line_wins(upstream):
    exposed = config_labels(registry_of(collector_for(upstream)))
    assert (exposed["served_model_name"], exposed["model"], exposed["max_model_len"]) == ("llama", MODEL, "4000")
    assert (exposed["block_size"], exposed["gpu_memory_utilization"], exposed["vllm_version"]) == \
        ("16", "0.9", "0.11.0")
    assert exposed["max_num_seqs"] == ""  # vLLM does not expose it: unknown without a command line
    given = config_labels(registry_of(collector_for(
        upstream, vllm_command=f"vllm serve {MODEL} --max-num-seqs 64 --max-model-len 8000 --api-key sk-x")))
    assert (given["max_num_seqs"], given["max_model_len"]) == ("64", "8000")
    assert given["other_flags"] == "api_key=***"


def test_kv_capacity_is_blocks_times_block_size_and_concurrency_per_max_model_len(upstream):
    registry = registry_of(collector_for(upstream))
    assert registry.get_sample_value("batchscope_vllm_kv_cache_capacity_tokens") == 32_000
    assert registry.get_sample_value("batchscope_vllm_kv_cache_max_concurrency") == 8.0


def test_kv_capacity_falls_back_on_the_containers_log_line():
    container = ContainerView(ServingConfig(), started_at=None, kv_cache_tokens=1000, max_concurrency=3.5)
    assert kv_capacity({}, ServingConfig(max_model_len="100"), container) == (1000, 10.0)
    assert kv_capacity({}, ServingConfig(), container) == (1000, 3.5)
    assert kv_capacity({"num_gpu_blocks": "None", "block_size": "16"}, ServingConfig(), None) == (None, None)


def test_a_new_command_file_is_one_change_at_the_clocks_time(upstream, tmp_path):
    command_file = tmp_path / "vllm-command"
    command_file.write_text(f"vllm serve {MODEL} --max-num-batched-tokens 2048")
    clock = Clock(1_000.0)
    registry = registry_of(collector_for(upstream, clock=clock, vllm_command_file=command_file))
    assert config_labels(registry)["max_num_batched_tokens"] == "2048"
    assert registry.get_sample_value("batchscope_config_changes_total") == 0
    assert registry.get_sample_value("batchscope_config_last_change_timestamp_seconds") == 0
    command_file.write_text(f"vllm serve {MODEL} --max-num-batched-tokens 8192")  # a tuner's next setting
    clock.now = 1_060.0
    assert config_labels(registry)["max_num_batched_tokens"] == "8192"
    assert registry.get_sample_value("batchscope_config_changes_total") == 1
    assert registry.get_sample_value("batchscope_config_last_change_timestamp_seconds") == 1_060.0


def test_a_knob_passed_for_the_first_time_or_dropped_is_a_change_against_vllms_default(upstream, tmp_path):
    """`--max-num-seqs 64` added to `vllm serve M --max-model-len 8192` showed 64 in the labels and counted
    nothing: vLLM does not expose max_num_seqs, so the label was unknown before."""
    command_file = tmp_path / "vllm-command"
    plain = f"vllm serve {MODEL} --max-model-len 8192"
    command_file.write_text(plain)
    registry = registry_of(collector_for(upstream, vllm_command_file=command_file))
    config_labels(registry)
    command_file.write_text(f"{plain} --max-num-seqs 64")
    assert config_labels(registry)["max_num_seqs"] == "64"
    assert registry.get_sample_value("batchscope_config_changes_total") == 1
    command_file.write_text(plain)  # dropped again: back to vLLM's default
    config_labels(registry)
    assert registry.get_sample_value("batchscope_config_changes_total") == 2


def test_the_info_names_where_its_command_line_came_from(upstream, tmp_path):
    command_file = tmp_path / "vllm-command"
    command_file.write_text(f"vllm serve {MODEL} --max-num-seqs 64")
    by_source = {"file": {"vllm_command_file": command_file, "vllm_command": f"vllm serve {MODEL}"},
                 "flag": {"vllm_command": f"vllm serve {MODEL}"}, "none": {}}
    assert {source: config_labels(registry_of(collector_for(upstream, **flags)))["command_line_source"]
            for source, flags in by_source.items()} == {source: source for source in by_source}


def test_a_vllm_restart_without_a_command_line_is_counted_as_not_visible(upstream):
    registry = registry_of(collector_for(upstream))
    config_labels(registry)
    upstream.vllm_text = VLLM_METRICS.replace("process_start_time_seconds 1.7e+09",
                                              "process_start_time_seconds 1.8e+09")
    assert config_labels(registry)["max_num_seqs"] == ""
    assert registry.get_sample_value("batchscope_config_changes_total") == 1
    assert registry.get_sample_value("batchscope_config_changes_not_visible_total") == 1


def test_a_vllm_restart_with_the_same_configuration_is_a_change(upstream):
    clock = Clock(5.0)
    registry = registry_of(collector_for(upstream, clock=clock))
    assert registry.get_sample_value("batchscope_config_changes_total") == 0
    upstream.vllm_text = VLLM_METRICS.replace("process_start_time_seconds 1.7e+09",
                                              "process_start_time_seconds 1.8e+09")
    assert registry.get_sample_value("batchscope_config_changes_total") == 1


def test_a_restart_with_new_queue_knobs_is_one_change_annotated_with_their_diff(upstream, tmp_path):
    """The tuner's restart: a new command file and a new start time at the same scrape are one change, whose
    annotation is the diff (the adaptive switch as true / false, a knob passed for the first time against vLLM's
    default), and the info metric carries the new values."""
    command_file = tmp_path / "vllm-command"
    command_file.write_text(f"vllm serve {MODEL} --max-num-queued-reqs 4 --no-long-prefill-token-threshold-adaptive")
    posted = Posted()
    collector = BatchscopeCollector(ExporterSources(vllm_url=upstream.vllm.url, timeout_s=2.0,
                                                    vllm_command_file=command_file),
                                    ChangeTracker(posted, clock=Clock(0.0)))
    registry = registry_of(collector)
    assert config_labels(registry)["long_prefill_token_threshold_adaptive"] == "false"
    command_file.write_text(f"vllm serve {MODEL} --max-num-queued-reqs 8 --long-prefill-token-threshold-adaptive "
                            "--max-num-queued-tokens 4096")
    upstream.vllm_text = VLLM_METRICS.replace("process_start_time_seconds 1.7e+09",
                                              "process_start_time_seconds 1.8e+09")
    labels = config_labels(registry)
    assert (labels["max_num_queued_reqs"], labels["max_num_queued_tokens"],
            labels["long_prefill_token_threshold_adaptive"]) == ("8", "4096", "true")
    assert registry.get_sample_value("batchscope_config_changes_total") == 1
    assert [text for text, _, _ in posted.posts] == [
        "max_num_queued_reqs: 4 → 8; max_num_queued_tokens: vLLM default → 4096; "
        "long_prefill_token_threshold_adaptive: false → true"]


def test_vllm_032s_admission_rejections_pass_through_by_reason(upstream):
    """vLLM 0.32's counter of requests its API server refused (503), as a real server exposes it."""
    fixture = (Path(__file__).parent.parent / "fixtures" / "vllm-0.32-cpu-metrics.txt").read_text()
    rejected = {"max_num_queued_reqs": 17.0, "max_num_queued_tokens": 3.0}
    for reason, count in rejected.items():
        series = f'{ADMISSION_REJECTIONS.exposed_name}{{model_name="tiny-llama",reason="{reason}"}}'
        fixture = fixture.replace(f"{series} 0.0", f"{series} {count}")
    upstream.vllm_text = fixture
    registry = registry_of(collector_for(upstream))
    for reason, count in rejected.items():
        assert registry.get_sample_value(ADMISSION_REJECTIONS.exposed_name,
                                         {"model_name": "tiny-llama", "reason": reason}) == count
    [family] = [f for f in registry.collect() if f.name == ADMISSION_REJECTIONS.name]
    assert (family.type, family.documentation) == ("counter", ADMISSION_REJECTIONS.help)


def test_an_unreadable_command_file_falls_back_on_the_command_without_showing_the_file(upstream, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="batchscope.exporter")
    registry = registry_of(collector_for(upstream, vllm_command_file=tmp_path,  # a folder: cannot be read
                                         vllm_command=f"vllm serve {MODEL} --max-num-seqs 32"))
    assert config_labels(registry)["max_num_seqs"] == "32"
    assert any("cannot read a command line" in r.getMessage() for r in caplog.records)


def test_a_down_vllm_gives_up_0_no_configuration_and_the_rest_is_served(upstream):
    upstream.vllm.stop()
    registry = registry_of(collector_for(upstream))
    assert registry.get_sample_value("batchscope_up", {"target": "vllm"}) == 0
    assert registry.get_sample_value("batchscope_up", {"target": "loadgen"}) == 1
    assert registry.get_sample_value("batchscope_client_requests_total",
                                     {"outcome": "ok", "scenario": "chat"}) == 42.0
    assert "batchscope_vllm_config_info" not in {m.name for m in registry.collect()}
    assert registry.get_sample_value("batchscope_config_changes_total") == 0


def test_without_a_load_generator_only_vllm_is_a_target(upstream):
    registry = registry_of(collector_for(upstream, loadgen_url=None))
    assert registry.get_sample_value("batchscope_up", {"target": "vllm"}) == 1
    assert registry.get_sample_value("batchscope_up", {"target": "loadgen"}) is None


def test_the_scrape_duration_is_the_timed_fetch_and_parse(upstream):
    ticks = itertools.count(start=10.0, step=0.25)  # each reading of the timer is a quarter second later
    collector = BatchscopeCollector(ExporterSources(vllm_url=upstream.vllm.url), ChangeTracker(),
                                    timer=lambda: next(ticks))
    registry = registry_of(collector)
    assert registry.get_sample_value("batchscope_scrape_duration_seconds", {"target": "vllm"}) == 0.25


def test_the_api_key_goes_to_the_json_endpoints_and_never_into_the_exposition(upstream):
    secret = "sk-never-exposed-1234"
    registry = registry_of(collector_for(upstream, vllm_api_key=secret,
                                         vllm_command=f"vllm serve {MODEL} --api-key {secret}"))
    text = "".join(str(s) for m in registry.collect() for s in m.samples)
    assert secret not in text
    by_path = {r.path: r.headers.get("Authorization") for r in upstream.vllm.requests}
    assert by_path["/v1/models"] == by_path["/version"] == f"Bearer {secret}"
    assert by_path["/metrics"] is None


def test_the_exposition_parses_back_with_the_exporters_own_families(upstream):
    text = generate_latest(registry_of(collector_for(upstream))).decode()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"batchscope_up", "batchscope_scrape_duration_seconds", "batchscope_config_changes",
            "batchscope_config_last_change_timestamp_seconds", "batchscope_vllm_config_info"} <= names


def live_file(tmp_path: Path, upstream: Upstream, **fields) -> Path:
    """A tuner's live file (`batchscope tune --live-file`) naming a run on ``upstream``'s servers."""
    path = tmp_path / "live.json"
    path.write_text(json.dumps({"vllm_url": upstream.vllm.url, "loadgen_url": upstream.loadgen.url,
                                "command_line": ["vllm", "serve", MODEL, "--max-num-seqs", "64", "--api-key", "***"],
                                "plan": "tiny", "setting": "mns-64", "repeat": 0,
                                "started_at": "2026-12-01T10:00:00+00:00", **fields}))
    return path


def nowhere() -> str:
    return f"http://127.0.0.1:{free_port()}"


def test_a_followed_run_gives_the_targets_and_the_command_line_over_the_flags(upstream, tmp_path):
    registry = registry_of(collector_for(upstream, follow=live_file(tmp_path, upstream), loadgen_url=nowhere(),
                                         vllm_command=f"vllm serve {MODEL} --max-num-seqs 8"))
    assert registry.get_sample_value("batchscope_up", {"target": "vllm"}) == 1
    assert registry.get_sample_value("batchscope_up", {"target": "loadgen"}) == 1
    assert registry.get_sample_value("batchscope_client_requests_total", {"outcome": "ok", "scenario": "chat"}) == 42
    assert config_labels(registry)["max_num_seqs"] == "64"


def test_each_new_run_in_the_followed_file_is_read_at_the_next_scrape(upstream, tmp_path):
    other = Upstream()
    other.vllm_text = VLLM_METRICS.replace("} 8.0", "} 3.0", 1)  # num_requests_running of the next run's server
    try:
        path = live_file(tmp_path, upstream)
        registry = registry_of(collector_for(upstream, follow=path))
        labels = {"engine": "0", "model_name": MODEL}
        assert registry.get_sample_value("vllm:num_requests_running", labels) == 8.0
        live_file(tmp_path, other, setting="mns-2", command_line=["vllm", "serve", MODEL, "--max-num-seqs", "2"])
        assert registry.get_sample_value("vllm:num_requests_running", labels) == 3.0
        assert config_labels(registry)["max_num_seqs"] == "2"
    finally:
        other.stop()


@pytest.mark.parametrize("content", ["{not json", '{"vllm_url": "ftp://x", "plan": "p", "setting": "s", '
                                     '"repeat": 0, "started_at": "t"}', " " * (MAX_BYTES + 1)])
def test_an_unusable_live_file_falls_back_on_the_flags_and_is_logged_once(upstream, tmp_path, caplog, content):
    caplog.set_level(logging.WARNING, logger="batchscope.exporter")
    path = tmp_path / "live.json"
    path.write_text(content)
    registry = registry_of(collector_for(upstream, follow=path))
    assert registry.get_sample_value("batchscope_up", {"target": "vllm"}) == 1  # the flags' vLLM
    registry.get_sample_value("batchscope_up", {"target": "vllm"})
    warnings = [r.getMessage() for r in caplog.records if "--follow" in r.getMessage()]
    assert len(warnings) == 1 and str(path) in warnings[0] and "ftp" not in warnings[0]


def test_before_any_run_starts_the_flags_targets_are_read_quietly(upstream, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="batchscope.exporter")
    registry = registry_of(collector_for(upstream, follow=tmp_path / "not-yet.json"))
    assert registry.get_sample_value("batchscope_up", {"target": "vllm"}) == 1
    assert not caplog.records


class Engine:
    """Docker's API as a loopback stub serving one compose service's container, which a test may replace or
    remove between scrapes (as `docker compose up -d` re-creating it does)."""

    def __init__(self) -> None:
        self.container: dict | None = None
        self.stub = HttpStub(self._route).start()

    def serve(self, cid: str, batched_tokens: int, started_at: str) -> None:
        self.container = {"Id": cid, "Name": "/batchscope-vllm-1",
                          "Config": {"Entrypoint": ["vllm", "serve"], "Tty": False,
                                     "Cmd": [MODEL, "--max-num-batched-tokens", str(batched_tokens)],
                                     "Labels": {"com.docker.compose.service": "vllm"}},
                          "State": {"Status": "running", "StartedAt": started_at}}

    def _route(self, _method: str, path: str) -> Reply:
        found = self.container
        if path.startswith("/v1.43/containers/json"):
            return json_reply([] if found is None else [{"Id": found["Id"], "Labels": found["Config"]["Labels"]}])
        if found is not None and path.startswith(f"/v1.43/containers/{found['Id']}/json"):
            return json_reply(found)
        if found is not None and path.startswith(f"/v1.43/containers/{found['Id']}/logs"):
            return Reply(body=b"", content_type="application/vnd.docker.raw-stream")
        return json_reply({"message": "no such container"}, status=404)


@pytest.mark.parametrize("between", ["no container", "the old container"])
def test_a_container_re_created_with_a_new_knob_is_one_change_with_its_diff(upstream, between, caplog):
    """The restart scrape may catch the engine between two containers, or still answering about the old one:
    neither is "vLLM restarted, configuration unchanged"; the next whole scrape counts the change, once."""
    engine = Engine()
    source = DockerSource(lambda: docker.DockerClient(base_url=engine.stub.url.replace("http", "tcp"),
                                                      version="1.43"), service="vllm", project="")
    registry = registry_of(collector_for(upstream, docker=source))
    try:
        engine.serve("c0ffee", 2048, "2026-12-01T17:00:00Z")
        registry.get_sample_value("batchscope_config_changes_total")
        upstream.vllm_text = VLLM_METRICS.replace("process_start_time_seconds 1.7e+09",
                                                  "process_start_time_seconds 1.8e+09")
        if between == "no container":
            engine.container = None
        with caplog.at_level(logging.INFO, logger="batchscope.exporter"):
            assert registry.get_sample_value("batchscope_config_changes_total") == 0
            engine.serve("f00d", 8192, "2026-12-01T17:05:00Z")
            assert registry.get_sample_value("batchscope_config_changes_total") == 1
            assert registry.get_sample_value("batchscope_config_changes_total") == 1
        changes = [r.getMessage() for r in caplog.records if "configuration change" in r.getMessage()]
        assert changes == ["configuration change: max_num_batched_tokens: 2048 → 8192"]
    finally:
        engine.stub.stop()
