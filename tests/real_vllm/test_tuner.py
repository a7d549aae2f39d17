"""The tuner's command backend restarting a real `vllm serve` per setting, with an exporter following the plan;
then the report, the plan's what-if on the simulator, and MLPerf's offline scenario. (`--resume` is the same code
whatever the server: tests/tuner/test_resume.py proves it on the simulator, which saves CI a real start here.)

One plan (real_plan's comment says what each setting does to sixteen closed-loop users) covers the one-knob
settings and a queue cap, so the tier starts its baseline once. Every server is a lean start (LEAN_FLAGS): the
tests count what vLLM did, they do not time it.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

from batchscope.vllm.catalogue import ADMISSION_REJECTIONS
from tests.conftest import free_port
from tests.real_vllm.support import LEAN_FLAGS, SERVED_NAME, TIER_FLAGS, tier
from tests.stubs import HttpStub, json_reply
from tests.tuner.support import run_files, write_plan

TUNE_TIMEOUT_S = 900


# The baseline leaves vLLM's knobs to vLLM but max_num_seqs 8 (block size 128 and the KV cache are the CPU build's
# own choice, read back from the server): eight users run, eight wait. `mns-2` lets two run at once; `kv-9` gives
# the cache 9 blocks of 128 tokens (one is vLLM's null block), which the users outgrow at 256 tokens, so vLLM
# preempts; `kv-4` cannot hold one 1,024-token request and vLLM refuses to start; `mnqr-8` caps waiting + running
# at 8, so vLLM answers the other eight 503 (each pauses the load generator's 0.1 s and tries again) and nobody
# waits behind a running batch: a lower TTFT, bought with a large rejected share.
def real_plan(**overrides) -> dict:
    real = tier()
    command = shlex.join([str(real.vllm), "serve"]) + " {model} " + shlex.join(
        ["--served-model-name", SERVED_NAME, *TIER_FLAGS, *LEAN_FLAGS]) + " --host {host} --port {port} {flags}"
    plan = {
        "name": "real",
        "workload": {"input_tokens": 200, "output_tokens": 100, "timeout_s": 60, "seed": 3,
                     "load": {"mode": "concurrency", "concurrency": 16}},
        "backend": {"kind": "command", "command": command, "port": free_port(), "startup_timeout_s": 300},
        "baseline": {"model": str(real.model), "max_model_len": 1024, "max_num_seqs": 8},
        "variations": [{"name": "mns-2", "set": {"max_num_seqs": 2}},
                       {"name": "kv-9", "set": {"num_gpu_blocks_override": 9}},
                       {"name": "kv-4", "set": {"num_gpu_blocks_override": 4}},
                       {"name": "mnqr-8", "set": {"max_num_queued_reqs": 8}}],
        "warmup_s": 1,
        "window_s": 4,
    }
    plan.update(overrides)
    return plan


def tune(tmp_path, plan: dict, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "batchscope.cli", "tune", str(write_plan(tmp_path, plan)),
                           "--results", str(tmp_path / "results"), *flags], capture_output=True, text=True,
                          timeout=TUNE_TIMEOUT_S, env=tier().env(lean=True))


def at_the_end(run_dir, sample_name: str) -> float:
    """``sample_name``'s samples summed in the run's last /metrics read (metrics-after.prom): since the server's
    start."""
    text = (run_dir / "metrics-after.prom").read_text()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == sample_name)


def preemptions_at_the_end(run_dir) -> float:
    return at_the_end(run_dir, "vllm:num_preemptions_total")


def rejected_since_start(run_dir) -> float:
    """vLLM's admission counter (every reason) at the run's end: refusals since its start."""
    return at_the_end(run_dir, ADMISSION_REJECTIONS.exposed_name)


def rejected_by_the_client(run_dir) -> int:
    """The load generator's rejected_busy records over the whole run (warm-up and the end included)."""
    lines = (run_dir / "load" / "records.jsonl").read_text().splitlines()
    return sum(json.loads(line)["outcome"] == "rejected_busy" for line in lines if line.strip())


class Scraper:
    """Scrapes an exporter twice a second on a thread while a plan runs (changes are seen at scrape time)."""

    def __init__(self, exporter) -> None:
        self.exporter, self.stop = exporter, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            try:
                self.exporter.scrape()
            except Exception:  # noqa: BLE001 - a scrape during a restart may fail; the next one counts
                continue

    def __enter__(self) -> Scraper:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


@pytest.mark.timeout(TUNE_TIMEOUT_S * 2)
def test_a_plan_on_real_vllm_records_its_settings_preemptions_rejections_and_failures_and_ranks_as_its_what_if(
        tmp_path, exporters):
    grafana = HttpStub(lambda method, path: json_reply({"message": "Annotation added", "id": 1})).start()
    live_file = tmp_path / "live.json"
    exporter = exporters("--vllm-url", f"http://127.0.0.1:{free_port()}", "--follow", str(live_file),
                         "--grafana-url", grafana.url, "--grafana-token", "glsa_test")
    plan = real_plan()
    with Scraper(exporter):
        result = tune(tmp_path, plan, "--live-file", str(live_file))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "5 runs done (1 failed)" in result.stdout
    plan_dir = tmp_path / "results" / "real"
    runs = run_files(plan_dir)

    baseline = runs["baseline-r0"]
    assert baseline["status"] == "ok" and baseline["client"]["completed"] > 0
    command = " ".join(baseline["command_line"])
    # only the knobs the plan set are passed; vLLM chose the rest, and the run says what it chose
    assert "--max-num-seqs 8" in command and "--max-model-len 1024" in command
    assert "--block-size" not in command and "--gpu-memory-utilization" not in command
    reported = baseline["reported"]
    assert (reported["vllm_version"], reported["block_size"], reported["max_model_len"]) == ("0.32.0", 128, 1024)
    logged = (plan_dir / "baseline-r0" / "server.log").read_text()
    assert f"CPU KV cache size: {reported['kv_capacity_tokens']:,} tokens" in logged
    assert reported["kv_capacity_tokens"] == reported["num_gpu_blocks"] * 128

    narrow = runs["mns-2-r0"]
    assert narrow["status"] == "ok" and narrow["server"]["max_running"] <= 2 <= narrow["server"]["max_waiting"]
    small = runs["kv-9-r0"]
    assert small["status"] == "ok" and small["reported"]["kv_capacity_tokens"] == 9 * 128
    # the users start together with equal lengths, so those running outgrow the 8 blocks together at least once;
    # in the short window itself they may have fallen out of step: count over the whole run (its last /metrics)
    assert preemptions_at_the_end(plan_dir / "kv-9-r0") > 0 and preemptions_at_the_end(plan_dir / "baseline-r0") == 0

    refused = runs["kv-4-r0"]
    assert refused["status"] == "failed" and refused["client"] is None
    assert "ValueError: To serve at least one request with the model's max seq len (1024)" in refused["failure"]
    assert "\n" not in refused["failure"] and "--num-gpu-blocks-override 4" in " ".join(refused["command_line"])

    assert "--max-num-queued-reqs 8" in " ".join(runs["mnqr-8-r0"]["command_line"])
    # every refusal the load generator recorded is one vLLM counted, exactly, and no other setting refuses any
    for name in ("baseline-r0", "mns-2-r0", "kv-9-r0", "mnqr-8-r0"):
        assert rejected_by_the_client(plan_dir / name) == rejected_since_start(plan_dir / name), name
    assert rejected_since_start(plan_dir / "baseline-r0") == 0

    # the exporter followed every run: one change per restart with another setting, each posted with its diff
    texts = [request.json()["text"] for request in grafana.requests if request.method == "POST"]
    assert any("max_num_seqs: 8 → 2" in text for text in texts), texts
    grafana.stop()

    report = subprocess.run([sys.executable, "-m", "batchscope.cli", "report", str(plan_dir)], capture_output=True,
                            text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    text = (plan_dir / "report.md").read_text()
    assert "kv-4" in text and "failed" in text
    comparison = json.loads((plan_dir / "comparison.json").read_text())
    explanations = json.dumps(comparison)
    assert "preempt" in explanations and "waiting" in explanations

    what_if = tune(tmp_path, plan, "--what-if")
    assert what_if.returncode == 0, what_if.stderr[-3000:]
    for folder in ("real", "real.what-if"):  # the queue cap ranks alike, real and previewed
        comparison = json.loads((tmp_path / "results" / folder / "comparison.json").read_text())
        values = {s["setting"]: s["values"] for s in comparison["settings"]}
        capped, free = values["mnqr-8"], values["baseline"]
        assert free["rejected"] == 0 and capped["rejected_share"] > 0.3, (folder, capped["rejected_share"])
        assert capped["ttft_p50"] < free["ttft_p50"], (folder, capped["ttft_p50"], free["ttft_p50"])
        report = (tmp_path / "results" / folder / "report.md").read_text()
        assert "the queue is capped at 8 requests (max_num_queued_reqs)" in report, folder
        assert "Suggested max_num_queued_tokens for " in report, folder


@pytest.mark.timeout(TUNE_TIMEOUT_S)
def test_the_offline_scenario_on_real_vllm_reports_the_batch_throughput(tmp_path):
    result = tune(tmp_path, real_plan(variations=[]), "--scenario", "offline", "--requests", "16")
    assert result.returncode == 0, result.stderr[-3000:]
    offline = json.loads((tmp_path / "results" / "real" / "mlperf-offline" / "baseline.json").read_text())
    assert offline["status"] == "ok" and offline["completed"] == 16
    assert offline["requests_per_s"] == offline["completed"] / offline["duration_s"] > 0
