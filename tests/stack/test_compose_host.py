"""compose.yaml on a host that already runs things, checked without a Docker engine: every host port is a variable
(documented in docs/compose.md's one table), and the gpu profile refuses to measure a server other than vLLM."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.compose.test_compose import ROOT, command, raw, services

# (service, port inside its container): the host port's variable and today's default
HOST_PORTS = {
    ("simulator", "8000"): ("SIMULATOR_HOST_PORT", "8000"),
    ("vllm", "8000"): ("VLLM_HOST_PORT", "8001"),
    ("exporter", "9648"): ("EXPORTER_HOST_PORT", "9648"),
    ("locust-master", "8089"): ("LOCUST_WEB_HOST_PORT", "8089"),
    ("locust-master", "9646"): ("LOADGEN_METRICS_HOST_PORT", "9646"),
    ("locust-master", "5557"): ("LOCUST_MASTER_HOST_PORT", "5557"),
    ("prometheus", "9090"): ("PROMETHEUS_HOST_PORT", "9090"),
    ("alertmanager", "9093"): ("ALERTMANAGER_HOST_PORT", "9093"),
    ("grafana", "3000"): ("GRAFANA_HOST_PORT", "3000"),
}


def published() -> dict[tuple[str, str], str]:
    """(service, container port) -> the host part of its short-syntax `ports:` entry, unresolved."""
    return {(name, entry.rpartition(":")[2]): entry.removeprefix("127.0.0.1:").rpartition(":")[0]
            for name, service in raw()["services"].items() for entry in service.get("ports", [])}


def test_every_host_port_is_a_variable_with_todays_default():
    """Fixed host ports made `docker compose up` fail on a GPU box already running vLLM or Prometheus."""
    assert published() == {key: f"${{{var}:-{default}}}" for key, (var, default) in HOST_PORTS.items()}
    moved = {var: str(20000 + index) for index, (var, _) in enumerate(HOST_PORTS.values())}
    svc = services({**moved, "TARGET": "vllm"})
    for (name, inner), (var, _) in HOST_PORTS.items():
        assert f"127.0.0.1:{moved[var]}:{inner}" in svc[name]["ports"]


def test_docs_list_every_host_port_variable_in_one_table():
    text = (ROOT / "docs" / "compose.md").read_text()
    rows = re.findall(r"^\|\s*`([A-Z_]+_HOST_PORT)`\s*\|\s*`?(\d+)`?\s*\|", text, re.MULTILINE)
    assert dict(rows) == dict(HOST_PORTS.values())
    assert len(rows) == len(HOST_PORTS), "each variable once"


def check(target: str) -> subprocess.CompletedProcess:
    """gpu-target-check's command, run as its container runs it (the image's python; TARGET from compose)."""
    service = services({"TARGET": target})["gpu-target-check"]
    argv = command(service)
    assert argv[0] == "python"
    env = {"PATH": "/usr/bin:/bin", **{k: str(v) for k, v in service["environment"].items()}}
    return subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("target", ["simulator", "external"])
def test_the_gpu_profile_refuses_to_measure_another_server_in_one_line(target):
    """`--profile gpu up` without TARGET=vllm loaded vLLM onto the GPUs and measured the simulator, its master
    waiting up to 30 minutes for vLLM's health first."""
    done = check(target)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and f"TARGET={target}" in done.stderr and "TARGET=vllm" in done.stderr
    assert check("vllm").returncode == 0


def test_vllm_starts_only_once_the_check_passed_and_the_check_needs_the_gpu_profile():
    all_services = raw()["services"]
    assert all_services["gpu-target-check"]["profiles"] == ["gpu"] == all_services["vllm"]["profiles"]
    assert all_services["vllm"]["depends_on"]["gpu-target-check"] == {"condition": "service_completed_successfully"}
    # the master waits for vLLM's health only through the gpu profile, where the check made vLLM the target
    assert all_services["locust-master"]["depends_on"]["vllm"]["required"] is False
    assert services()["gpu-target-check"]["environment"]["TARGET"] == "simulator"  # TARGET's default
