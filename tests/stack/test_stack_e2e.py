"""The stack end to end on loopback, with the real parts: the project's prometheus.yml, recording rules and alerts
in a real Prometheus, the project's Alertmanager config in a real Alertmanager sending to a webhook stub, the
simulator, the load generator (headless) and the exporter.

Two deployments run side by side for the same time, each behind its own exporter (its own `instance`): a
baseline whose KV cache holds the load, and a tight one whose KV cache is far too small for it. Then:
VllmPreemptionSpike reaches the webhook for the tight one and never for the baseline; every PromQL expression
of every dashboard panel, variable and annotation returns data; and the change annotation query places a
point at the moment the baseline simulator was restarted with another flag.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from tests.conftest import Exporter, SimProcess, free_port, start_simulator, wait_until
from tests.grafana.dashboard_queries import Query, dashboard_queries, substitute
from tests.stubs import HttpStub, json_reply

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROMETHEUS_DIR = Path("prometheus")
ALERTMANAGER_CONFIG = PROMETHEUS_DIR / "alertmanager" / "alertmanager.yml"
ALERTMANAGER = "prometheus-alertmanager"  # the Debian package's binary name
SIM_FLAGS = ("--profile", "tiny", "--max-model-len", "1024")
# the tight deployment: 0.26 of the tiny profile's 4 GiB leaves a KV cache of 4,256 tokens, about five of its
# 768-token requests, while sixteen are sent at once; the baseline's cache holds ~200,000 tokens
TIGHT_UTILIZATION = "0.26"
BASELINE_SPEC = {"input_tokens": 128, "output_tokens": 64, "scenario": "baseline",
                 "load": {"mode": "concurrency", "concurrency": 4, "ramp_up_s": 1}}
TIGHT_SPEC = {"input_tokens": 512, "output_tokens": 256, "scenario": "tight",
              "load": {"mode": "concurrency", "concurrency": 16, "ramp_up_s": 1}}
RUN_S = 600  # longer than the test: the loads are stopped (SIGTERM) when it is done
ALERT_DEADLINE_S = 180  # for: 30s after the 1 m rate rises, plus Alertmanager's group_wait, with slack


@dataclass
class Deployment:
    """A simulator, the fixed load against it, and the exporter in front of both."""

    name: str
    sim: SimProcess
    load: subprocess.Popen
    exporter: Exporter
    command_file: Path

    @property
    def instance(self) -> str:
        return f"127.0.0.1:{self.exporter.port}"

    def stop(self) -> None:
        self.load.terminate()  # SIGTERM ends a run cleanly
        try:
            self.load.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.load.kill()
        self.exporter.stop()
        self.sim.stop()


def deploy(tmp_path: Path, name: str, spec: dict, *sim_flags: str) -> Deployment:
    port = str(free_port())
    command_file = tmp_path / f"{name}-command"
    command_file.write_text(" ".join(["vllm serve sim-model", *sim_flags]))
    sim = start_simulator(tmp_path, *SIM_FLAGS, "--port", port, *sim_flags)
    spec_path = tmp_path / f"{name}-spec.yaml"
    spec_path.write_text(yaml.safe_dump({**spec, "warmup_s": 0, "duration_s": RUN_S}))
    metrics_port = free_port()
    with open(tmp_path / f"{name}-load.log", "w") as log:
        load = subprocess.Popen([sys.executable, "-m", "batchscope.cli", "load", "--spec", str(spec_path), "--host",
                                 sim.url, "--out", str(tmp_path / f"{name}-out"), "--run-id", name,
                                 "--metrics-port", str(metrics_port)], stdout=log, stderr=subprocess.STDOUT)
    wait_until(lambda: answers(f"http://127.0.0.1:{metrics_port}/metrics"), timeout_s=30,
               message=f"{name} load generator metrics")
    exporter = Exporter(tmp_path, "--vllm-url", sim.url, "--loadgen-url", f"http://127.0.0.1:{metrics_port}",
                        "--vllm-command-file", str(command_file))
    return Deployment(name, sim, load, exporter, command_file)


def answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def prometheus_config(tmp_path: Path, exporters: list[str], prometheus_port: int, alertmanager_port: int) -> Path:
    """The project's prometheus.yml with its targets on loopback, 1 s intervals and absolute rule paths."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(PROMETHEUS_DIR.resolve() / pattern) for pattern in config["rule_files"]]
    targets = {"batchscope": exporters, "prometheus": [f"127.0.0.1:{prometheus_port}"],
               "alertmanager": [f"127.0.0.1:{alertmanager_port}"]}
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": targets[job["job_name"]]}]
    config["alerting"]["alertmanagers"] = [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def alertmanager_config(tmp_path: Path, webhook_url: str) -> Path:
    """The project's alertmanager.yml with every webhook pointed at the stub."""
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    for receiver in config["receivers"]:
        for webhook in receiver.get("webhook_configs", []):
            webhook["url"] = webhook_url
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def start(tmp_path: Path, name: str, argv: list[str], ready_url: str) -> subprocess.Popen:
    with open(tmp_path / f"{name}.log", "w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    wait_until(lambda: answers(ready_url) or process.poll() is not None, timeout_s=30, message=f"{name} ready")
    assert process.poll() is None, (tmp_path / f"{name}.log").read_text()
    return process


class PromAPI:
    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/api/v1"

    def _get(self, path: str, **params) -> list[dict]:
        reply = requests.get(self.url + path, params=params, timeout=10).json()
        assert reply["status"] == "success", f"{params.get('query')}: {reply.get('error')}"
        return reply["data"]["result"]

    def instant(self, query: str) -> list[dict]:
        return self._get("/query", query=query)

    def range(self, query: str, start: float, end: float, step: str = "1s") -> list[dict]:
        return self._get("/query_range", query=query, start=start, end=end, step=step)


def finite_values(result: list[dict]) -> list[float]:
    values = [v for series in result for _, v in series.get("values", [series.get("value", [0, "NaN"])])]
    return [float(v) for v in values if math.isfinite(float(v))]


def alerts_received(webhook: HttpStub) -> list[dict]:
    return [alert for r in webhook.requests if r.method == "POST" for alert in r.json()["alerts"]]


@pytest.mark.skipif(shutil.which(ALERTMANAGER) is None or shutil.which("prometheus") is None,
                    reason="needs the Debian packages prometheus and prometheus-alertmanager (make test installs them)")
def test_the_stack_alerts_on_a_preemption_spike_and_every_dashboard_query_returns_data(tmp_path):
    webhook = HttpStub(lambda method, path: json_reply({})).start()
    processes: list[subprocess.Popen] = []
    deployments: list[Deployment] = []
    try:
        am_port, prom_port = free_port(), free_port()
        processes.append(start(tmp_path, "alertmanager", [
            ALERTMANAGER, f"--config.file={alertmanager_config(tmp_path, webhook.url + '/alerts')}",
            f"--storage.path={tmp_path / 'am'}", f"--web.listen-address=127.0.0.1:{am_port}",
            "--cluster.listen-address="], f"http://127.0.0.1:{am_port}/-/ready"))
        baseline = deploy(tmp_path, "baseline", BASELINE_SPEC, "--max-num-batched-tokens", "2048")
        deployments.append(baseline)
        tight = deploy(tmp_path, "tight", TIGHT_SPEC, "--gpu-memory-utilization", TIGHT_UTILIZATION)
        deployments.append(tight)
        started = time.time()
        config = prometheus_config(tmp_path, [baseline.instance, tight.instance], prom_port, am_port)
        processes.append(start(tmp_path, "prometheus", [
            "prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}"], f"http://127.0.0.1:{prom_port}/-/ready"))
        prom = PromAPI(prom_port)

        # one knob changed on the baseline: the simulator restarted with another token budget, same port
        wait_until(lambda: prom.instant(f'batchscope_up{{instance="{baseline.instance}",target="vllm"}} == 1'),
                   timeout_s=30, message="Prometheus to scrape the baseline")
        baseline.sim.stop()
        baseline.command_file.write_text("vllm serve sim-model --max-num-batched-tokens 4096")
        port = baseline.sim.url.rsplit(":", 1)[1]
        baseline.sim = start_simulator(tmp_path, *SIM_FLAGS, "--port", port, "--max-num-batched-tokens", "4096")
        restarted = time.time()

        def spike_alert() -> list[dict]:
            return [a for a in alerts_received(webhook) if a["labels"]["alertname"] == "VllmPreemptionSpike"
                    and a["status"] == "firing"]

        fired = wait_until(spike_alert, timeout_s=ALERT_DEADLINE_S, interval_s=1,
                           message="VllmPreemptionSpike at the webhook")
        assert {alert["labels"]["instance"] for alert in fired} == {tight.instance}
        # the baseline ran just as long and never preempted, so the alert never even went pending for it
        assert not prom.range(f'ALERTS{{alertname="VllmPreemptionSpike",instance="{baseline.instance}"}}',
                              started, time.time())
        assert not prom.instant(f'vllm:num_preemptions_total{{instance="{baseline.instance}"}} > 0')
        assert prom.instant(f'vllm:num_preemptions_total{{instance="{tight.instance}"}} > 100')

        end = time.time()
        span = f"{int(end - started)}s"
        empty = [f"{q.dashboard} / {q.where}: {q.expr}" for q in dashboard_queries()
                 if not finite_values(prom.range(substitute(q.expr, range_=span), started, end, "2s"))]
        assert not empty, "dashboard queries without data:\n" + "\n".join(empty)

        change_marks = [q for q in dashboard_queries() if q.where.startswith("annotation") and
                        "batchscope_config_last_change_timestamp_seconds" in q.expr]
        assert change_marks, "no annotation query on the exporter's change metrics"
        for query in change_marks:
            assert_marks_the_restart(prom, query, baseline.instance, started, end, restarted)
    finally:
        for deployment in deployments:
            deployment.stop()
        for process in processes:
            process.terminate()
            process.wait(timeout=20)
        webhook.stop()


def assert_marks_the_restart(prom: PromAPI, query: Query, instance: str, start: float, end: float,
                             restarted: float) -> None:
    """The annotation's points (useValueForTime: the value is the event time in ms) mark the restart only."""
    result = prom.range(substitute(query.expr), start, end, "2s")
    marks = {float(value) / 1000 for series in result for _, value in series["values"]}
    assert {series["metric"].get("instance") for series in result} == {instance}
    # the exporter notices the new start time at its first scrape after the restart (1 s interval)
    assert marks and all(restarted - 1 <= mark <= restarted + 5 for mark in marks), (marks, restarted)
