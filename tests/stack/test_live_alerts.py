"""Alerts whose `for:` is too long for the e2e stack test, proven live (opt-in: `make test-live-alerts`, ~6 min).

VllmApiServerCpuSaturated (0.9 of a core for 5 m): a real Prometheus with the project's rules and alerts, as
they are, scrapes two deployments behind their exporters. One simulator's API server burns real CPU on every
stream event (--fault-stream-event-cpu-s) under a small closed-loop load, so its one event loop is busy all the
time and its process_cpu_seconds_total grows at about a core; the alert goes pending, then fires once its `for:`
has passed. A healthy deployment under a light Poisson load, scraped by the same Prometheus, has no vLLM alert at
all. Left out of `make test` (the `live_alerts` marker) because the `for:` alone is five minutes.

It needs a core for the saturated simulator: while other work keeps both cores busy, the API server honestly gets
less than 0.9 of one and the alert rightly does not fire; a failure then says how long the simulator waited for a
CPU (the kernel's schedstat) beside the rate.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from batchscope.testkit.processes import SetupError
from tests.conftest import free_port, wait_until
from tests.stack.test_stack_e2e import (
    PROMETHEUS_DIR,
    Deployment,
    PromAPI,
    deploy,
    finite_values,
    prometheus_config,
    start,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.live_alerts, pytest.mark.timeout(720)]

ALERT = "VllmApiServerCpuSaturated"
ALERTS_FILE = PROMETHEUS_DIR / "alerts" / "batchscope.alerts.yml"
CPU_RULE = "instance:batchscope_vllm_api_server_cpu:rate1m"
# 5 ms of CPU per stream event: four streams on the tiny profile's ~1 ms steps ask ~20 ms of CPU per step, far more
# than the loop can give, so it runs flat out (about one core) while the load generator sees few events
EVENT_CPU_S = "0.005"
SATURATED_SPEC = {"input_tokens": 128, "output_tokens": 64, "scenario": "saturated",
                  "load": {"mode": "concurrency", "concurrency": 4, "ramp_up_s": 1}}
# light, so the two cores leave the saturated process its whole core: ~2 requests/s of 64 tokens
HEALTHY_SPEC = {"input_tokens": 128, "output_tokens": 64, "scenario": "healthy",
                "load": {"mode": "poisson", "rate": 2}}
PENDING_DEADLINE_S = 90  # from Prometheus' start: its first scrapes, two samples for the 1 m rate, with slack
FIRING_SLACK_S = 90  # past the `for:` after pending was seen
POLL_S = 1.0
SCRAPE_LAG_CPU_S = 3.0  # CPU a process at about a core spends between a 1 s scrape and the kernel's read, with slack


def alert_rule(name: str) -> dict:
    """The rule as the project ships it (the test follows its `for:`, never a copy)."""
    groups = yaml.safe_load(ALERTS_FILE.read_text())["groups"]
    [rule] = [rule for group in groups for rule in group["rules"] if rule.get("alert") == name]
    return rule


def duration_s(text: str) -> float:
    """A Prometheus duration of one unit (`5m`, `30s`, `1h`) in seconds."""
    match = re.fullmatch(r"(\d+)([smh])", text)
    assert match, f"unsupported duration {text!r}"
    return int(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2)]


def alert_states(prom: PromAPI, instance: str) -> set[str]:
    return {series["metric"]["alertstate"]
            for series in prom.instant(f'ALERTS{{alertname="{ALERT}",instance="{instance}"}}')}


def active_at(prom: PromAPI, instance: str) -> float:
    """When Prometheus made the alert active (pending) for ``instance``, Unix seconds (its ALERTS_FOR_STATE)."""
    [series] = prom.instant(f'ALERTS_FOR_STATE{{alertname="{ALERT}",instance="{instance}"}}')
    return float(series["value"][1])


def cpu_and_wait_s(pid: int) -> str:
    """The process's time on a CPU and waiting in a run queue (the kernel's schedstat), to tell a busy machine from
    an idle server when the rate stays low."""
    on_cpu, waiting = (int(ns) / 1e9 for ns in Path(f"/proc/{pid}/schedstat").read_text().split()[:2])
    return f"{on_cpu:.0f} s on a CPU and {waiting:.0f} s waiting for one"


def wait_for_state(prom: PromAPI, deployment: Deployment, state: str, timeout_s: float) -> float:
    """Poll until the alert is in ``state`` for the deployment; when it was first seen so, Unix seconds."""
    try:
        wait_until(lambda: state in alert_states(prom, deployment.instance), timeout_s=timeout_s, interval_s=POLL_S,
                   message=f"{ALERT} {state}", alive=deployment.sim.child.check_alive)
    except SetupError as exc:
        cpu = finite_values(prom.instant(f'{CPU_RULE}{{instance="{deployment.instance}"}}'))
        pytest.fail(f"{exc}; {CPU_RULE} now {cpu}; the simulator spent {cpu_and_wait_s(deployment.sim.process.pid)}")
    return time.time()


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus (make test installs it)")
def test_api_server_cpu_saturation_goes_pending_then_fires_and_a_healthy_deployment_stays_silent(tmp_path):
    rule = alert_rule(ALERT)
    for_s = duration_s(rule["for"])
    prometheus: subprocess.Popen | None = None
    deployments: list[Deployment] = []
    try:
        saturated = deploy(tmp_path, "saturated", SATURATED_SPEC, sim_only=("--fault-stream-event-cpu-s", EVENT_CPU_S))
        deployments.append(saturated)
        healthy = deploy(tmp_path, "healthy", HEALTHY_SPEC)
        deployments.append(healthy)
        prom_port = free_port()
        # no Alertmanager: the alert's state is Prometheus' own (the webhook path is the e2e stack test's)
        config = prometheus_config(tmp_path, [d.instance for d in deployments], prom_port, free_port())
        prometheus = start(tmp_path, "prometheus", [
            "prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}"], f"http://127.0.0.1:{prom_port}/-/ready")
        prom = PromAPI(prom_port)
        started = time.time()

        pending_seen = wait_for_state(prom, saturated, "pending", PENDING_DEADLINE_S)
        firing_seen = wait_for_state(prom, saturated, "firing", for_s + FIRING_SLACK_S)
        activated = active_at(prom, saturated.instance)  # of the activation that fired (a dip would have reset it)
        # the series is the process's real CPU: what Prometheus last scraped is what the kernel counts for the
        # simulator, up to the second or so of CPU since that scrape
        counter = f'sum(batchscope_vllm_process_cpu_seconds_total{{instance="{saturated.instance}"}})'
        [scraped] = finite_values(prom.instant(counter))
        kernel = saturated.sim.cpu_seconds()
        scheduled = cpu_and_wait_s(saturated.sim.process.pid)
        end = time.time()
        # from the evaluation after activation: the rule's sample at that instant may predate what the alert read
        cpu = finite_values(prom.range(f'{CPU_RULE}{{instance="{saturated.instance}"}}', activated + POLL_S,
                                       firing_seen))
        healthy_cpu = finite_values(prom.range(f'{CPU_RULE}{{instance="{healthy.instance}"}}', started, end))
        print(f"\n{ALERT}: pending {pending_seen - started:.0f} s after Prometheus started, firing "
              f"{firing_seen - started:.0f} s after (active at +{activated - started:.0f} s, `for:` {for_s:g} s); "
              f"saturated CPU while pending {min(cpu, default=math.nan):.3f}-{max(cpu, default=math.nan):.3f} "
              f"cores, healthy max {max(healthy_cpu, default=math.nan):.3f}; CPU scraped {scraped:.1f} s, kernel "
              f"{kernel:.1f} s; the simulator spent {scheduled}")

        # the `for:` held: firing only once the alert had been active that long (one clock: the same machine)
        assert firing_seen - activated >= for_s, (activated, firing_seen)
        assert 0 <= kernel - scraped <= SCRAPE_LAG_CPU_S, (kernel, scraped)
        # active all along: the rate stayed above the threshold, and within what one process on this machine can use
        assert cpu and min(cpu) > 0.9 and max(cpu) <= (os.cpu_count() or 1) + 0.1, cpu
        # healthy: its CPU measured (so the silence is not missing data), and no vLLM alert ever, not even pending
        assert healthy_cpu and max(healthy_cpu) < 0.9, healthy_cpu
        assert not prom.range(f'ALERTS{{alertname=~"Vllm.+",instance="{healthy.instance}"}}', started, end)
    finally:
        for deployment in deployments:
            deployment.stop()
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(timeout=20)

