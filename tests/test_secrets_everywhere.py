"""End to end: a unique key planted in every input that takes one, then every output searched for every key.

Inputs: the simulator's --api-key and the workload spec's api_key (one key: the run must authenticate to that
simulator), the exporter's --vllm-api-key, a --vllm-command and a --vllm-command-file holding --api-key and
--hf-token, and --grafana-token. Outputs: the simulator's log and /metrics, the load generator's console and
every file of its out dir, its client /metrics, the exporters' logs and /metrics, and the annotation bodies
Grafana received (not their Authorization header, which carries the Grafana token by design).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests
import yaml

from tests.conftest import free_port, samples, wait_until
from tests.stubs import HttpStub, json_reply

pytestmark = pytest.mark.e2e

KEYS = {
    "simulator --api-key and spec api_key": "sk-serve-7f3a91c2",
    "exporter --vllm-api-key": "sk-exporter-b84d0e15",
    "--vllm-command --api-key": "sk-command-2c6e9a70",
    "--vllm-command --hf-token": "hf_command_d41f8b33",
    "--vllm-command-file --api-key (before)": "sk-file-before-5a0c7e91",
    "--vllm-command-file --api-key (after)": "sk-file-after-e93b2d46",
    "--vllm-command-file --hf-token (after)": "hf_file_after_0b7c4f18",
    "exporter --grafana-token": "glsa_grafana_6d2e8a54",
}
SERVE_KEY = KEYS["simulator --api-key and spec api_key"]


def leaks(outputs: dict[str, str]) -> list[str]:
    return [f"{key_name} in {output_name}" for output_name, text in outputs.items()
            for key_name, key in KEYS.items() if key in text]


def config_info(exposition: str) -> dict[str, str]:
    return next(dict(labels) for (name, labels) in samples(exposition) if name == "batchscope_vllm_config_info")


def test_no_key_planted_in_any_input_reaches_any_output(simulator, exporters, tmp_path):
    grafana = HttpStub(lambda method, path: json_reply({"message": "Annotation added", "id": 1})).start()
    port = str(free_port())
    first = simulator("--profile", "tiny", "--port", port, "--api-key", SERVE_KEY, "--gpu-memory-utilization", "0.9")
    command_file = tmp_path / "vllm-command"
    command_file.write_text(f"vllm serve sim-model --api-key {KEYS['--vllm-command-file --api-key (before)']} "
                            "--max-num-batched-tokens 2048")
    metrics_port = free_port()
    by_command = exporters(
        "--vllm-url", first.url, "--loadgen-url", f"http://127.0.0.1:{metrics_port}",
        "--vllm-api-key", KEYS["exporter --vllm-api-key"],
        "--vllm-command", f"vllm serve sim-model --api-key {KEYS['--vllm-command --api-key']} "
                          f"--hf-token {KEYS['--vllm-command --hf-token']}",
        "--grafana-url", grafana.url, "--grafana-token", KEYS["exporter --grafana-token"])
    by_file = exporters("--vllm-url", first.url, "--vllm-command-file", str(command_file),
                        "--grafana-url", grafana.url, "--grafana-token", KEYS["exporter --grafana-token"])
    outputs: dict[str, str] = {}

    # a load run against that simulator, its client /metrics read while it runs
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"input_tokens": 32, "output_tokens": 8, "duration_s": 3, "api_key": SERVE_KEY,
                                    "load": {"mode": "concurrency", "concurrency": 2}}))
    out_dir = tmp_path / "out"
    console = tmp_path / "load-console.txt"
    with open(console, "w") as sink:
        load = subprocess.Popen([sys.executable, "-m", "batchscope.cli", "load", "--spec", str(spec), "--host",
                                 first.url, "--out", str(out_dir), "--metrics-port", str(metrics_port)],
                                stdout=sink, stderr=subprocess.STDOUT)
    try:
        def client_metrics() -> str | None:
            try:
                text = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
            except requests.RequestException:
                return None
            return text if "batchscope_client_requests_total{" in text else None

        outputs["client /metrics"] = wait_until(client_metrics, timeout_s=30, message="client metrics")
        outputs["exporter (command) /metrics during the run"] = requests.get(by_command.url, timeout=10).text
        assert load.wait(timeout=120) == 0, console.read_text()
    finally:
        if load.poll() is None:
            load.kill()
            load.wait(timeout=10)
    outputs["load console"] = console.read_text()
    for path in sorted(out_dir.rglob("*")):
        if path.is_file():
            outputs[f"out/{path.relative_to(out_dir)}"] = path.read_text(errors="replace")
    assert {"summary.json", "records.jsonl", "metrics.prom"} <= {p.name for p in out_dir.iterdir()}
    assert any(name.endswith(".csv") for name in outputs)
    assert '"api_key": "***"' in outputs["out/summary.json"]

    # a restart with another flag (and a rewritten command file): one change, one annotation per exporter
    outputs["simulator /metrics (first)"] = requests.get(first.url + "/metrics", timeout=5).text
    before = config_info(requests.get(by_command.url, timeout=10).text)
    first.stop()
    requests.get(by_command.url, timeout=10)  # a scrape while vLLM is down: its cause is logged
    command_file.write_text(f"vllm serve sim-model --api-key {KEYS['--vllm-command-file --api-key (after)']} "
                            "--max-num-batched-tokens 8192 "
                            f"--hf-token {KEYS['--vllm-command-file --hf-token (after)']}")
    second = simulator("--profile", "tiny", "--port", port, "--api-key", SERVE_KEY, "--gpu-memory-utilization", "0.8")
    for name, exporter in (("command", by_command), ("file", by_file)):
        assert exporter.scrape()[("batchscope_config_changes_total", ())] == 1
        outputs[f"exporter ({name}) /metrics"] = requests.get(exporter.url, timeout=10).text
    posts = wait_until(lambda: len(p := [r for r in grafana.requests if r.method == "POST"]) == 2 and p,
                       message="two annotation POSTs")
    grafana.stop()
    annotations = [post.json()["text"] for post in posts]
    for number, post in enumerate(posts):
        outputs[f"annotation body {number}"] = post.body.decode()
    outputs["simulator /metrics (second)"] = requests.get(second.url + "/metrics", timeout=5).text
    for name, sim in (("first", first), ("second", second)):
        outputs[f"simulator log ({name})"] = sim.log()
    for name, exporter in (("command", by_command), ("file", by_file)):
        outputs[f"exporter ({name}) log"] = wait_until(
            lambda e=exporter: "configuration change: " in (text := e.log.read_text()) and text,
            message=f"the {name} exporter's change line")

    assert leaks(outputs) == []
    # ... and `***` where the flags are shown
    assert before["other_flags"] == "api_key=***,hf_token=***"
    assert config_info(outputs["exporter (command) /metrics"])["other_flags"] == "api_key=***,hf_token=***"
    assert config_info(outputs["exporter (file) /metrics"])["other_flags"] == "api_key=***,hf_token=***"
    assert "gpu_memory_utilization: 0.9 → 0.8" in annotations[0] + annotations[1]
    assert any("other_flags: api_key=*** → api_key=***,hf_token=***" in text for text in annotations), annotations
    assert "'api_key': '***'" in outputs["simulator log (first)"]
    assert "target vllm is down at" in outputs["exporter (command) log"]
    assert all(post.headers["Authorization"] == f"Bearer {KEYS['exporter --grafana-token']}" for post in posts)
