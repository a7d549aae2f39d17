"""The stack end to end on loopback, with the real parts: the project's prometheus.yml, recording rules and alerts
in a real Prometheus, the project's Alertmanager config in a real Alertmanager sending to a webhook stub, the
simulator, the load generator (headless) and the exporter.

Four deployments run side by side for the same time, each behind its own exporter (its own `instance`): a
baseline whose KV cache holds the load; a tight one whose KV cache is far too small for it; a slow one whose
steps take a quarter of a second, with max_num_seqs 2 below its load's concurrency and a fifth of its requests
answered 500; and one whose engine hangs for a while (the simulator's --fault-engine-stall-*). Then:
VllmPreemptionSpike reaches the webhook for the tight one; VllmTtftSloBurn, VllmTpotSloBurn,
VllmAdmissionLimited and VllmRequestErrorSpike fire for the slow one; VllmEngineStalled fires for the hung one
and resolves once its engine steps again; no vLLM alert so much as goes pending for the baseline; every PromQL
expression of every dashboard panel, variable and annotation returns data (a newer family's panel its data, not
its "not exposed" fallback); and the change annotation query places a point at the moment the baseline
simulator was restarted with another flag. A second test serves an older vLLM's /metrics (0.32's without the
families those panels guard, and with the pre-0.10 KV usage name) and reads "not exposed by this vLLM" there.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from batchscope.testkit.processes import SetupError
from tests.conftest import Exporter, SimProcess, free_port, start_simulator, wait_until
from tests.grafana.dashboard_queries import Query, dashboard_queries, substitute
from tests.stubs import HttpStub, Reply, json_reply

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
# the slow deployment: every step takes 0.25 s (TPOT above the 0.2 s target), 16-token answers hold a batch slot
# ~4 s, so with 2 slots for 4 users every later request queues that long (TTFT above the 2.5 s target) while the
# KV cache stays nearly empty (admission-limited); 1 in 5 requests is answered 500 (the error spike); vLLM's
# admission limit holds 3 in flight, so the fourth user is refused (503) and retries after its 0.1 s pause: most
# arrivals are refused (VllmAdmissionRejections) while the 500s still fire the error spike on their own
SLOW_STEP_S = "0.25"
SLOW_SPEC = {"input_tokens": 64, "output_tokens": 16, "scenario": "slow",
             "load": {"mode": "concurrency", "concurrency": 4, "ramp_up_s": 1}}
SLOW_FLAGS = ("--max-num-seqs", "2", "--max-num-queued-reqs", "3")
# the hung engine: 5 s after start-up it stops for 100 s, longer than Prometheus' start plus VllmEngineStalled's
# 30 s window and for: 30s, with slack for a busy machine
STALL_AFTER_S, STALL_S = "5", "100"
STALL_SPEC = {"input_tokens": 64, "output_tokens": 32, "scenario": "stalled",
              "load": {"mode": "concurrency", "concurrency": 2, "ramp_up_s": 1}}
RUN_S = 600  # longer than the test: the loads are stopped (SIGTERM) when it is done
ALERT_DEADLINE_S = 180  # for: 30s after the 1 m rate rises, plus Alertmanager's group_wait, with slack
NOT_EXPOSED = "not exposed by this vLLM"
FIXTURE_032 = Path(__file__).parent.parent / "fixtures" / "vllm-0.32-cpu-metrics.txt"


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


def deploy(tmp_path: Path, name: str, spec: dict, *vllm_flags: str, sim_only: tuple[str, ...] = ()) -> Deployment:
    """``vllm_flags`` are vLLM's (also written to the command file the exporter reads), ``sim_only`` the
    simulator's own (profile, faults)."""
    port = str(free_port())
    command_file = tmp_path / f"{name}-command"
    command_file.write_text(" ".join(["vllm serve sim-model", *vllm_flags]))
    sim = start_simulator(tmp_path, *SIM_FLAGS, "--port", port, *vllm_flags, *sim_only)
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


def slow_profile(tmp_path: Path) -> Path:
    """The tiny profile with every engine step a quarter of a second longer."""
    text = (Path("batchscope") / "simulator" / "profiles" / "tiny.yaml").read_text()
    text = re.sub(r"(?m)^name: tiny$", "name: tiny-slow", text)
    text = re.sub(r"(?m)^step_overhead_s: .*$", f"step_overhead_s: {SLOW_STEP_S}", text)
    path = tmp_path / "tiny-slow.yaml"
    path.write_text(text)
    return path


def firing_instances(prom: PromAPI, alert: str, start: float, end: float) -> set[str]:
    result = prom.range(f'ALERTS{{alertname="{alert}",alertstate="firing"}}', start, end)
    return {series["metric"]["instance"] for series in result}


def not_exposed_fallbacks(result: list[dict]) -> list[dict]:
    return [series["metric"] for series in result if NOT_EXPOSED in series["metric"].values()]


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
        slow = deploy(tmp_path, "slow", SLOW_SPEC, *SLOW_FLAGS,
                      sim_only=("--profile", str(slow_profile(tmp_path)), "--fault-error-rate", "0.2"))
        deployments.append(slow)
        # deployed last, right before Prometheus starts, so Prometheus sees the whole stall however slow the machine
        stalled = deploy(tmp_path, "stalled", STALL_SPEC, sim_only=(
            "--fault-engine-stall-after-s", STALL_AFTER_S, "--fault-engine-stall-s", STALL_S))
        deployments.append(stalled)
        started = time.time()
        config = prometheus_config(tmp_path, [d.instance for d in deployments], prom_port, am_port)
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

        # the failure modes, each where it was staged (Prometheus' own alert state: the webhook path is the above)
        expected = {"VllmEngineStalled": stalled, "VllmTtftSloBurn": slow, "VllmTpotSloBurn": slow,
                    "VllmAdmissionLimited": slow, "VllmRequestErrorSpike": slow, "VllmAdmissionRejections": slow}

        def not_fired() -> list[str]:
            return [alert for alert, deployment in expected.items()
                    if deployment.instance not in firing_instances(prom, alert, started, time.time())]

        try:
            wait_until(lambda: not not_fired(), timeout_s=ALERT_DEADLINE_S, interval_s=2,
                       message="every failure-mode alert firing")
        except SetupError:
            pytest.fail(f"not fired within {ALERT_DEADLINE_S} s: {not_fired()}")

        end = time.time()
        span = f"{int(end - started)}s"
        results = {q: prom.range(substitute(q.expr, range_=span), started, end, "2s") for q in dashboard_queries()}
        empty = [f"{q.dashboard} / {q.where}: {q.expr}" for q, result in results.items() if not finite_values(result)]
        assert not empty, "dashboard queries without data:\n" + "\n".join(empty)
        # at the end, every family scraped (before the first scrape absent() holds for all): the real data only
        fallbacks = {q.where: found for q in results if "absent(" in q.expr
                     if (found := not_exposed_fallbacks(prom.instant(substitute(q.expr, range_=span))))}
        assert not fallbacks, f"'{NOT_EXPOSED}' against vLLM 0.32's families: {fallbacks}"

        change_marks = [q for q in dashboard_queries() if q.where.startswith("annotation") and
                        "batchscope_config_last_change_timestamp_seconds" in q.expr]
        assert change_marks, "no annotation query on the exporter's change metrics"
        for query in change_marks:
            assert_marks_the_restart(prom, query, baseline.instance, started, end, restarted)

        # checked last, so the queries above run while the hung engine is still stopped: it steps again at
        # STALL_AFTER_S + STALL_S, and its alert is over soon after
        wait_until(lambda: not prom.instant(f'ALERTS{{alertname="VllmEngineStalled",instance="{stalled.instance}"}}'),
                   timeout_s=float(STALL_AFTER_S) + float(STALL_S) + 30, interval_s=1,
                   message="VllmEngineStalled resolved once the engine steps again")
        assert prom.instant(f'increase(vllm:generation_tokens_total{{instance="{stalled.instance}"}}[30s]) > 0')
        # healthy: the baseline never had a vLLM alert even pending, for all its load and its restart
        assert not prom.range(f'ALERTS{{alertname=~"Vllm.+",instance="{baseline.instance}"}}', started, time.time())
        # the tight cache's preemptions show in the per-request histogram and the recomputation estimate
        for rule in ("model:vllm_request_preemptions:mean1m", "model:vllm_recomputed_prompt_tokens:rate1m"):
            values = finite_values(prom.range(f'{rule}{{instance="{tight.instance}"}}', started, time.time()))
            assert values and max(values) > 0, rule
        # the API server's CPU is the simulator process's own (VllmApiServerCpuSaturated's input; its 5 m `for:` is
        # too long here: test_live_alerts.py checks it, opt-in): busy, and within the machine's cores
        cpu = finite_values(prom.range(f'instance:batchscope_vllm_api_server_cpu:rate1m{{instance="{tight.instance}"}}',
                                       started, time.time()))
        assert cpu and 0 < max(cpu) <= (os.cpu_count() or 1) + 0.1, cpu
    finally:
        for deployment in deployments:
            deployment.stop()
        for process in processes:
            process.terminate()
            process.wait(timeout=20)
        webhook.stop()


def older_vllm_metrics(families: set[str]) -> str:
    """vLLM 0.32's real /metrics as an older release serves it: without ``families`` (those the dashboards guard
    with absent(): the newer ones, and the process_* that --api-server-count > 1 drops), and with the KV cache
    usage under its pre-0.10 name, which the exporter maps back."""
    lines = [line for line in FIXTURE_032.read_text().splitlines()
             if not any(re.match(rf"(# (HELP|TYPE) )?{re.escape(family)}(_total|_created|_bucket|_sum|_count)?[ {{]",
                                 line) for family in families)]
    return "\n".join(lines).replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc") + "\n"


def guarded_families() -> dict[Query, str]:
    """Each dashboard query with an absent() fallback -> the family (as vLLM names it) it guards."""
    guarded = {}
    for query in dashboard_queries():
        match = re.search(r"absent\(([a-z_:]+)", query.expr)
        if match:
            name = re.sub(r"(_total|_count|_bucket|_sum)$", "", match.group(1))
            guarded[query] = name.removeprefix("batchscope_vllm_")
    return guarded


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus (make test installs it)")
def test_panels_of_newer_families_say_not_exposed_against_an_older_vllm(tmp_path, exporters):
    guarded = guarded_families()
    assert {"vllm:num_requests_waiting_by_reason", "vllm:request_num_preemptions", "vllm:prompt_tokens_by_source",
            "process_cpu_seconds"} <= set(guarded.values())
    text = older_vllm_metrics(set(guarded.values()))
    vllm = HttpStub(lambda _method, path: Reply(body=text.encode(), content_type="text/plain; version=0.0.4")
                    if path == "/metrics" else Reply(status=404, body=b'{"detail":"Not Found"}')).start()
    prometheus = None
    try:
        exporter = exporters("--vllm-url", vllm.url)
        prom_port = free_port()
        config = prometheus_config(tmp_path, [f"127.0.0.1:{exporter.port}"], prom_port, free_port())
        prometheus = start(tmp_path, "prometheus", [
            "prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}"], f"http://127.0.0.1:{prom_port}/-/ready")
        prom = PromAPI(prom_port)
        wait_until(lambda: prom.instant('batchscope_up{target="vllm"} == 1'), timeout_s=30,
                   message="Prometheus to scrape the older vLLM")
        for query, family in guarded.items():
            result = prom.instant(substitute(query.expr, variables={"model": "tiny-llama"}))
            assert [float(series["value"][1]) for series in result] == [-1], (query.where, family, result)
            assert not_exposed_fallbacks(result), (query.where, result)
        # a renamed family of the same meaning is mapped by the exporter, so its panel reads the real value
        [kv] = prom.instant('vllm:kv_cache_usage_perc{model_name="tiny-llama"}')
        assert float(kv["value"][1]) == float(re.search(r"^vllm:kv_cache_usage_perc\{.*\} (\S+)$",
                                                        FIXTURE_032.read_text(), re.M).group(1))
    finally:
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(timeout=20)
        vllm.stop()


def assert_marks_the_restart(prom: PromAPI, query: Query, instance: str, start: float, end: float,
                             restarted: float) -> None:
    """The annotation's points (useValueForTime: the value is the event time in ms) mark the restart only."""
    result = prom.range(substitute(query.expr), start, end, "2s")
    marks = {float(value) / 1000 for series in result for _, value in series["values"]}
    assert {series["metric"].get("instance") for series in result} == {instance}
    # the exporter notices the new start time at its first scrape after the restart (1 s interval)
    assert marks and all(restarted - 1 <= mark <= restarted + 5 for mark in marks), (marks, restarted)
