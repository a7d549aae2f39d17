"""The Docker stack tier: compose.yaml, unchanged, brought up with `docker compose up --wait` on a real Docker engine.

scripts/docker-setup (run by `make test`, which sets BATCHSCOPE_DOCKER to the folder it prints) installs the engine
and Compose v2 and builds the stand-ins for the images compose.yaml pins, none of which can be pulled here
(tests/stack/standins: each Dockerfile says what it stands in for and how faithfully; Grafana is a recording stub).
This module starts a private dockerd on those images and always stops it. Compose reads compose.yaml plus two
files: .ci/compose.ci.yaml (only what this engine cannot do: pulls, NAT for the build, the GPU) and compose.webhook.yaml
(the webhook receiver alertmanager.yml names as its placeholder, the recording stub). Every host port is set to a
free one through the stack's *_HOST_PORT variables, so the tier runs beside whatever else the machine runs.

One stack for the module, in the order of the tests below: up; services, ports, targets and series; a load that
preempts (the documented GPU_MEMORY_UTILIZATION and LOADGEN_SPEC) fires VllmPreemptionSpike through Alertmanager
to the webhook; the run's summary agrees with the exporter's figures; a knob changed the documented way is read
through the docker socket, counted, annotated and in Prometheus. Beside it, from its start (vLLM's start overlaps
the tests above), a second project with the same service names runs the gpu profile on a real vLLM (the
vllm/vllm-openai stand-in, built from the real-vLLM tier): each exporter reads its own project's containers. `down
-v` of both leaves nothing. Without BATCHSCOPE_DOCKER the tier is skipped; `make test SKIP_DOCKER=1` leaves it out.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from batchscope.loadgen.spec import WorkloadSpec
from batchscope.loadgen.stream.target import probes_answered
from batchscope.testkit.processes import wait_until
from batchscope.wire.listen import free_port

pytestmark = [pytest.mark.docker_stack, pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
ENV_VAR = "BATCHSCOPE_DOCKER"
SETUP = ROOT / "scripts" / "docker-setup"
DOCKER = "/usr/bin/docker"  # the CLI scripts/docker-setup installs with the engine (docker.io)
FILES = ("compose.yaml", ".ci/compose.ci.yaml", "tests/stack/compose.webhook.yaml")
SERVICES = {"simulator", "exporter", "locust-master", "locust-worker", "prometheus", "alertmanager", "grafana",
            "webhook"}
SPEC = ROOT / "tests" / "stack" / "preempting-spec.yaml"
# 17,088 tokens of KV cache for the simulator's default model (Llama-3.1-8B on an H100), 12,176 with the knob
# change's 8,192 batched tokens (more activation memory), still above one request's max_model_len of 8,192 (0.225
# leaves too little then, and the re-created simulator refuses to start, as vLLM does): the spec's 32 users want
# ~49,000 at once
TIGHT_UTILIZATION = "0.235"
# the default model's vocabulary (batchscope/simulator/profiles/h100-llama-3.1-8b.yaml): the pre-flight's probes
VOCAB_SIZE = 128256
UP_S = 300  # cold: the project's image is built first (separately); a warm `up --wait` took 38 s here
ALERT_S = 240  # preemptions from the first requests; 1 m rate, for: 30s, 5 s evaluation, group_wait 10s
RUN_END_S = 300  # the spec's 85 s (the gpu project's 20 s and vLLM's start) from the run's start, and the summary
SCRAPE_S = 60  # a few of Prometheus' 5 s scrapes and the exporter's answer
# the gpu profile's second project: the stand-in's baked-in model (scripts/build_tiny_model.py's vocabulary)
REAL_VLLM_ENV = "BATCHSCOPE_REAL_VLLM"
GPU_PROJECT = "batchscope-gpu"
VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"
TINY_MODEL = "/models/tiny-llama"
TINY_VOCAB_SIZE = 8000
VLLM_SPEC = ROOT / "tests" / "stack" / "vllm-spec.yaml"
# families a 0.32 vLLM exposes and the overview reads (waiting_by_reason and cache_config_info are vLLM's own)
REAL_VLLM_SERIES = ("vllm:num_requests_waiting_by_reason", "vllm:kv_cache_usage_perc",
                    "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                    "vllm:cache_config_info", "batchscope_client_requests_total", "batchscope_vllm_config_info")


@dataclass
class Stack:
    """The compose project on the tier's private engine: its environment and its host ports."""

    folder: Path
    run: Path
    ports: dict[str, int] = field(default_factory=dict)
    project: str = "batchscope"  # compose.yaml's name
    variables: dict[str, str] = field(default_factory=lambda: {
        "GPU_MEMORY_UTILIZATION": TIGHT_UTILIZATION, "LOADGEN_SPEC": f"./{SPEC.relative_to(ROOT)}"})
    # the gpu profile's project, brought up in the background beside this one (None: no vllm stand-in built)
    gpu: Stack | None = None
    gpu_up: subprocess.Popen | None = None
    gpu_up_log: Path | None = None

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": f"unix://{self.run}/docker.sock",
                "DOCKER_CONFIG": str(self.folder / "config"), "COMPOSE_BAKE": "false",
                "DOCKER_SOCKET": str(self.run / "docker.sock"), "COMPOSE_PROJECT_NAME": self.project,
                **self.variables, **{name: str(port) for name, port in self.ports.items()}, **extra}

    def docker(self, *args: str, timeout_s: float = 120, **extra: str) -> str:
        result = subprocess.run([DOCKER, *args], cwd=ROOT, env=self.env(**extra), capture_output=True, text=True,
                                timeout=timeout_s)
        assert result.returncode == 0, f"docker {' '.join(args)} exited {result.returncode}:\n{result.stderr[-3000:]}"
        return result.stdout

    def compose_argv(self, *args: str) -> list[str]:
        return [DOCKER, "compose", *[part for name in FILES for part in ("-f", name)], *args]

    def compose(self, *args: str, timeout_s: float = 120, **extra: str) -> str:
        return self.docker(*self.compose_argv(*args)[1:], timeout_s=timeout_s, **extra)

    def url(self, variable: str, path: str = "") -> str:
        return f"http://127.0.0.1:{self.ports[variable]}{path}"

    def get(self, variable: str, path: str, **kwargs) -> requests.Response:
        return requests.get(self.url(variable, path), timeout=5, **kwargs)

    def query(self, promql: str) -> list[dict]:
        reply = self.get("PROMETHEUS_HOST_PORT", "/api/v1/query", params={"query": promql})
        reply.raise_for_status()
        return reply.json()["data"]["result"]

    def exporter(self) -> dict[tuple[str, tuple], float]:
        """The exporter's /metrics: (sample name, sorted labels) -> value."""
        text = self.get("EXPORTER_HOST_PORT", "/metrics").text
        return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
                for family in text_string_to_metric_families(text) for sample in family.samples}

    def recorded(self, variable: str) -> list[dict]:
        return self.get(variable, "/_stub/requests").json()


def host_port_variables() -> list[str]:
    """Every *_HOST_PORT variable compose.yaml and the webhook file publish a port with."""
    text = "".join((ROOT / name).read_text() for name in FILES)
    return sorted(set(re.findall(r"\$\{(\w+_HOST_PORT):-", text)))


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[Path, Path]]:
    """(the tier's folder, the run folder of a private dockerd on its data-root), stopped after the module."""
    folder = os.environ.get(ENV_VAR)
    if not folder:
        pytest.skip(f"{ENV_VAR} is not set: `make test` sets it (scripts/docker-setup builds the engine's images)")
    if not (Path(folder) / "ready").exists():
        pytest.fail(f"{ENV_VAR}={folder} is not a built tier (run scripts/docker-setup)")
    run = Path(tempfile.mkdtemp(prefix="bsd-", dir="/tmp"))  # short: dockerd's unix sockets live under it
    try:
        subprocess.run([SETUP, "start", str(run)], check=True, capture_output=True, text=True, timeout=60)
        yield Path(folder), run
    finally:
        subprocess.run([SETUP, "stop", str(run)], capture_output=True, timeout=60)
        shutil.rmtree(run, ignore_errors=True)


@pytest.fixture(scope="module")
def stack(engine: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack(*engine, ports={name: free_port() for name in host_port_variables()})
    logs = tmp_path_factory.mktemp("docker-stack")
    try:
        # one build of our image (compose would build it once per service that names it, concurrently)
        stack.compose("build", "simulator", timeout_s=UP_S)
        stack.compose("up", "--wait", "--wait-timeout", str(UP_S), timeout_s=UP_S + 60)
        start_gpu_project(stack, logs / "gpu-up.log")  # vLLM's start overlaps the tests of the first project
        yield stack
    finally:
        if stack.gpu_up is not None and stack.gpu_up.poll() is None:  # a test failed before waiting for it
            stack.gpu_up.terminate()
            stack.gpu_up.wait(timeout=60)
        for project in (stack, stack.gpu):
            if project is not None:
                take_down(project, logs / f"{project.project}.log")
        # the cached data-root keeps the stand-ins and this build; earlier builds of our image would pile up
        subprocess.run([DOCKER, "image", "prune", "-f"], env=stack.env(), capture_output=True, timeout=120)


def start_gpu_project(stack: Stack, log: Path) -> None:
    """A second compose project on the same engine, with the same service names: the gpu profile measuring the
    real vLLM (the vllm/vllm-openai stand-in) under a short load, on its own host ports; `up --wait` in the
    background (the gpu test waits for it). Nothing when no stand-in was built (the test says why)."""
    if subprocess.run([DOCKER, "image", "inspect", VLLM_IMAGE], env=stack.env(), capture_output=True).returncode:
        return
    stack.gpu = Stack(stack.folder, stack.run, ports={name: free_port() for name in stack.ports},
                      project=GPU_PROJECT,
                      variables={"TARGET": "vllm", "MODEL": TINY_MODEL, "MAX_MODEL_LEN": "1024", "MAX_NUM_SEQS": "8",
                                 "LOADGEN_SPEC": f"./{VLLM_SPEC.relative_to(ROOT)}"})
    stack.gpu_up_log = log
    with log.open("w") as out:
        stack.gpu_up = subprocess.Popen(stack.gpu.compose_argv("--profile", "gpu", "up", "--wait", "--wait-timeout",
                                                               str(UP_S)), cwd=ROOT, env=stack.gpu.env(),
                                        stdout=out, stderr=subprocess.STDOUT)


def take_down(project: Stack, log: Path) -> None:
    """Every service's log (for a failed test; path printed; the engine's is in the run folder), then `down -v`."""
    with log.open("w") as out:
        subprocess.run(project.compose_argv("--profile", "gpu", "logs", "--no-color", "--timestamps"), cwd=ROOT,
                       env=project.env(), stdout=out, stderr=subprocess.STDOUT, timeout=120)
    print(f"the {project.project} project's logs: {log}")
    subprocess.run(project.compose_argv("--profile", "gpu", "down", "-v", "--timeout", "10"), cwd=ROOT,
                   env=project.env(), capture_output=True, timeout=120)


def containers(stack: Stack) -> list[dict]:
    ids = stack.docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={stack.project}").split()
    return json.loads(stack.docker("inspect", *ids)) if ids else []


def test_every_service_comes_up_healthy_from_local_images(stack: Stack):
    services = [json.loads(line) for line in stack.compose("ps", "--format", "json").splitlines() if line]
    assert {s["Service"] for s in services} == SERVICES
    for service in services:
        assert service["State"] == "running", service
        # the webhook stub is test support without a healthcheck; every service of compose.yaml has one
        assert service["Health"] == ("" if service["Service"] == "webhook" else "healthy"), service
    for image in stack.compose("config", "--images").split():
        stack.docker("image", "inspect", image)  # built here or a stand-in: nothing was pulled


def test_nothing_is_published_beyond_loopback_and_the_locust_ui_and_llm_tab_answer(stack: Stack):
    bindings = [(c["Name"], port, binding) for c in containers(stack)
                for port, host in (c["NetworkSettings"]["Ports"] or {}).items() for binding in host or []]
    assert bindings and all(binding["HostIp"] == "127.0.0.1" for _, _, binding in bindings), bindings
    assert {int(binding["HostPort"]) for _, _, binding in bindings} == set(stack.ports.values()) - {
        stack.ports["VLLM_HOST_PORT"]}  # vllm is in the gpu profile
    page = stack.get("LOCUST_WEB_HOST_PORT", "/")
    assert page.status_code == 200 and '"title": "LLM"' in page.text and "llm/static/llm_tab.js" in page.text
    state = stack.get("LOCUST_WEB_HOST_PORT", "/llm/state").json()
    assert state["state"] in ("running", "stopped") and state["rows"], state


def test_prometheus_scrapes_every_target_and_holds_the_exporters_vllm_and_client_series(stack: Stack):
    def all_up() -> list[dict] | None:
        targets = stack.get("PROMETHEUS_HOST_PORT", "/api/v1/targets").json()["data"]["activeTargets"]
        return targets if targets and all(t["health"] == "up" for t in targets) else None

    targets = wait_until(all_up, timeout_s=SCRAPE_S, interval_s=1, message="every Prometheus target up")
    assert {t["labels"]["job"] for t in targets} == {"batchscope", "prometheus", "alertmanager"}
    for series in ("vllm:num_requests_running", "vllm:request_success_total", "batchscope_client_requests_total",
                   'batchscope_up{target="vllm"}', 'batchscope_up{target="loadgen"}'):
        wait_until(lambda series=series: stack.query(series), timeout_s=SCRAPE_S, interval_s=1,
                   message=f"{series} in Prometheus")
    assert all(r["value"][1] == "1" for r in stack.query("batchscope_up"))


def test_a_preempting_load_fires_the_alert_through_alertmanager_to_the_webhook(stack: Stack):
    firing = 'ALERTS{alertname="VllmPreemptionSpike", alertstate="firing"}'
    wait_until(lambda: stack.query(firing), timeout_s=ALERT_S, interval_s=2, message=f"{firing} in Prometheus")

    def in_alertmanager() -> list[dict]:
        alerts = stack.get("ALERTMANAGER_HOST_PORT", "/api/v2/alerts").json()
        return [a for a in alerts if a["labels"]["alertname"] == "VllmPreemptionSpike"]

    alert = wait_until(in_alertmanager, timeout_s=SCRAPE_S, interval_s=1, message="the alert in Alertmanager")[0]
    assert alert["status"]["state"] == "active" and alert["labels"]["severity"] == "warning"

    def delivered() -> list[dict]:
        return [alert for r in stack.recorded("WEBHOOK_HOST_PORT") if r["path"] == "/alerts"
                for alert in r["body"]["alerts"] if alert["labels"]["alertname"] == "VllmPreemptionSpike"]

    sent = wait_until(delivered, timeout_s=SCRAPE_S, interval_s=1, message="the alert at the webhook")[0]
    assert sent["status"] == "firing" and sent["labels"]["job"] == "batchscope"


def test_the_exporters_client_and_server_figures_agree_with_the_load_generators_summary(stack: Stack, tmp_path):
    wait_until(lambda: stack.get("LOCUST_WEB_HOST_PORT", "/llm/state").json()["state"] == "stopped",
               timeout_s=RUN_END_S, interval_s=2, message="the end of the spec's run (the LLM tab's state)")
    metrics = settled(stack)
    result = final_summary(stack, tmp_path)
    assert result["balanced"] and result["started"] > 0 and result["outcomes"]["ok"] > 0, result
    run = (("run_id", result["run_id"]), ("scenario", result["spec"]["scenario"]))

    def client(name: str, *labels: tuple[str, str]) -> float:
        return metrics[(name, tuple(sorted((*run, *labels))))]

    assert client("batchscope_client_requests_started_total") == result["started"]
    for outcome, count in result["outcomes"].items():
        assert client("batchscope_client_requests_total", ("outcome", outcome)) == count, outcome
    assert_vllm_served_the_run(metrics, result, VOCAB_SIZE)
    assert total(metrics, "vllm:num_preemptions_total") > 0


def settled(stack: Stack) -> dict[tuple[str, tuple], float]:
    """The exporter's /metrics once every request the client started has its outcome there. The LLM tab says
    "stopped" when the master stops the run; the workers' last records (the requests the end aborted) reach the
    master's merged figures with their next report, a few seconds later."""
    def balanced() -> dict[tuple[str, tuple], float] | None:
        metrics = stack.exporter()
        started = total(metrics, "batchscope_client_requests_started_total")
        return metrics if started > 0 and total(metrics, "batchscope_client_requests_total") == started else None

    return wait_until(balanced, timeout_s=SCRAPE_S, interval_s=1, message="every started request's outcome at the "
                      "exporter")


def total(metrics: dict[tuple[str, tuple], float], name: str) -> float:
    """A family's samples summed over their labels (the exporter's /metrics as Stack.exporter reads it)."""
    return sum(value for (sample, _), value in metrics.items() if sample == name)


def final_summary(project: Stack, tmp_path: Path) -> dict:
    """The run's summary.json: as docs/compose.md says, the master writes it when its container stops."""
    project.compose("stop", "locust-master", timeout_s=60)
    project.compose("cp", "locust-master:/out/latest/summary.json", str(tmp_path / "summary.json"))
    return json.loads((tmp_path / "summary.json").read_text())


def assert_vllm_served_the_run(metrics: dict[tuple[str, tuple], float], result: dict, vocab_size: int) -> None:
    """vLLM's successes: the client's ok requests and the pre-flight's answered probes, and at most the requests the
    client gave up on besides (one may still finish in vLLM)."""
    served = total(metrics, "vllm:request_success_total")
    probes = probes_answered(WorkloadSpec.model_validate(result["spec"]), vocab_size)
    failed = result["started"] - result["outcomes"]["ok"]
    assert result["outcomes"]["ok"] + probes <= served <= result["outcomes"]["ok"] + probes + failed


def test_a_knob_changed_the_documented_way_is_read_counted_once_annotated_and_in_prometheus(stack: Stack):
    changes = ("batchscope_config_changes_total", ())
    before = stack.exporter()[changes]
    annotations_before = [r for r in stack.recorded("GRAFANA_HOST_PORT") if r["path"] == "/api/annotations"]
    stack.compose("up", "-d", "simulator", timeout_s=180, MAX_NUM_BATCHED_TOKENS="8192")

    def new_annotations() -> list[dict]:
        return [r for r in stack.recorded("GRAFANA_HOST_PORT") if r["path"] == "/api/annotations"
                and r["method"] == "POST"][len(annotations_before):]

    posted = wait_until(new_annotations, timeout_s=SCRAPE_S, interval_s=1, message="the change's annotation")
    assert posted[0]["auth_user"] == "admin" and posted[0]["body"]["text"] == "max_num_batched_tokens: 2048 → 8192"
    assert set(posted[0]["body"]["tags"]) >= {"batchscope", "config-change"}
    kept = stack.get("GRAFANA_HOST_PORT", "/api/annotations", params={"tags": "config-change"},
                     auth=("admin", "admin")).json()
    assert kept[-1]["text"] == posted[0]["body"]["text"]
    # the dashboard's "Config changes (Prometheus)" annotation query
    dashboard = json.loads((ROOT / "grafana" / "dashboards" / "overview.json").read_text())
    expr = next(a["expr"] for a in dashboard["annotations"]["list"] if a["name"] == "Config changes (Prometheus)")
    marked = wait_until(lambda: [r for r in stack.query(expr) if r["metric"]["max_num_batched_tokens"] == "8192"],
                        timeout_s=SCRAPE_S, interval_s=1, message="the annotation series in Prometheus")
    assert float(marked[0]["value"][1]) / 1000 == pytest.approx(posted[0]["body"]["time"] / 1000, abs=1)
    # counted once: still one change two scrapes later, in Prometheus and at the exporter
    changed_s = posted[0]["body"]["time"] / 1000
    wait_until(lambda: float(stack.query("timestamp(batchscope_config_changes_total)")[0]["value"][1]) > changed_s + 10,
               timeout_s=SCRAPE_S, interval_s=1, message="two scrapes after the change")
    assert stack.query("batchscope_config_changes_total")[0]["value"][1] == str(int(before + 1))
    assert stack.exporter()[changes] == before + 1 and len(new_annotations()) == 1


def config_labels(stack: Stack) -> dict[str, str]:
    return dict(next(labels for (name, labels), _ in stack.exporter().items() if name == "batchscope_vllm_config_info"))


def test_the_gpu_profile_measures_a_real_vllm_and_a_second_project_does_not_confuse_either_exporter(
        stack: Stack, tmp_path):
    if stack.gpu is None or stack.gpu_up is None:
        if not os.environ.get(REAL_VLLM_ENV):
            pytest.skip(f"{REAL_VLLM_ENV} is not set: scripts/docker-setup builds the {VLLM_IMAGE} stand-in from it")
        pytest.fail(f"{REAL_VLLM_ENV} is set but scripts/docker-setup built no {VLLM_IMAGE} stand-in")
    gpu = stack.gpu
    assert stack.gpu_up.wait(timeout=UP_S + 60) == 0, f"the gpu project's `up --wait` failed: {stack.gpu_up_log}"
    # each exporter reads its own project's served container: vllm's command line there, our simulator here (its
    # one change the knob test's), though both projects have a simulator and started while the other ran
    served = config_labels(gpu)
    assert (served["model"], served["max_num_seqs"], served["max_model_len"]) == (TINY_MODEL, "8", "1024")
    assert gpu.exporter()[("batchscope_vllm_kv_cache_capacity_tokens", ())] > 0  # vLLM's own start-up line
    ours = config_labels(stack)
    assert (ours["model"], ours["max_num_seqs"], ours["max_num_batched_tokens"]) == (
        "meta-llama/Llama-3.1-8B-Instruct", "128", "8192")
    assert stack.exporter()[("batchscope_config_changes_total", ())] == 1
    wait_until(lambda: gpu.get("LOCUST_WEB_HOST_PORT", "/llm/state").json()["state"] == "stopped",
               timeout_s=RUN_END_S, interval_s=2, message="the end of the real vLLM's run")
    metrics = gpu.exporter()
    # the series the dashboards read, from the real vLLM through the exporter, in this project's Prometheus (the
    # client's while the master still serves them)
    for series in REAL_VLLM_SERIES:
        wait_until(lambda series=series: gpu.query(series), timeout_s=SCRAPE_S, interval_s=1,
                   message=f"{series} in the gpu project's Prometheus")
    result = final_summary(gpu, tmp_path)
    assert result["balanced"] and result["outcomes"]["ok"] > 0, result
    assert_vllm_served_the_run(metrics, result, TINY_VOCAB_SIZE)
    assert config_labels(stack) == ours


def test_down_removes_every_container_network_and_volume(stack: Stack):
    for project in (stack.gpu, stack):
        if project is not None:
            project.compose("--profile", "gpu", "down", "-v", "--timeout", "30", timeout_s=180)
    assert stack.docker("ps", "-aq").split() == []
    assert stack.docker("volume", "ls", "-q").split() == []
    # the engine runs with --bridge=none: only its built-in host and null networks remain
    assert sorted(stack.docker("network", "ls", "--format", "{{.Name}}").split()) == ["host", "none"]
