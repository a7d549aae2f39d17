"""`batchscope load --web --workers 2`: Locust's web UI on a master with two worker processes (simulator, headless
Chromium, read in the DOM). Start runs the spec's users on both workers; the master's LLM tab shows the merged run
while it goes and after its stop; the summary's counts are the sum of both workers' records.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
import requests

from tests.conftest import free_port, wait_until
from tests.loadgen.test_web_command import READ_FORM, START
from tests.loadgen.test_webui import CLICK_LLM_TAB, READ_TAB, ROOT, DevTools, headless_chromium, stop, ui_answers

SPEC = """\
input_tokens: 64
output_tokens: 32
warmup_s: 1
duration_s: 6
load: {mode: concurrency, concurrency: 4}
"""
WORKERS = 2


def count(tab: dict, figure: str) -> int:
    return int(tab["figures"][figure][0].replace(",", ""))


def workers_ready(ui: str) -> bool:
    """Both workers connected to the master (Locust's own stats JSON lists them)."""
    try:
        return len(requests.get(ui + "stats/requests", timeout=2).json().get("workers", [])) == WORKERS
    except requests.RequestException:
        return False


def merged(summary_file: Path):
    """Whether the tab, stopped, shows the summary's path and the summary's counts (every worker's final report)."""
    def accept(tab: dict | None) -> bool:
        if tab is None or tab["state"] != "stopped" or not summary_file.exists():
            return False
        if tab["figures"]["summary.json"] != [str(summary_file)]:
            return False
        summary = json.loads(summary_file.read_text())
        return (count(tab, "started"), count(tab, "outcome ok")) == (summary["started"], summary["outcomes"]["ok"])
    return accept


async def drive(port: int, summary_file: Path) -> tuple[dict, dict, dict]:
    """The start form, then Start, the LLM tab running with requests started, and stopped with the summary's
    counts."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/json/list") as answer:
            page = next(t for t in await answer.json() if t["type"] == "page")
        async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            tools = DevTools(ws)
            form = await tools.poll(READ_FORM, bool, timeout_s=20, what="the start form with the spec's load")
            await tools.evaluate(START)
            await tools.poll(CLICK_LLM_TAB, bool, timeout_s=15, what="the LLM tab, selected")
            running = await tools.poll(READ_TAB, lambda tab: tab is not None and tab["state"] == "running"
                                       and count(tab, "started") > 0, timeout_s=30, what="requests started")
            stopped = await tools.poll(READ_TAB, merged(summary_file), timeout_s=60,
                                       what="the tab stopped with the summary's counts")
            return form, running, stopped


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_the_web_ui_of_a_master_with_workers_runs_the_spec_on_all_and_shows_their_merged_counts(simulator, tmp_path):
    sim = simulator("--profile", "tiny")
    (tmp_path / "spec.yaml").write_text(SPEC)
    out, port = tmp_path / "out", free_port()
    ui = f"http://127.0.0.1:{port}/"
    log = tmp_path / "load.log"
    with open(log, "w") as sink:
        load = subprocess.Popen([sys.executable, "-m", "batchscope.cli", "load", "--web", "--web-port", str(port),
                                 "--workers", str(WORKERS), "--master-port", str(free_port()),
                                 "--spec", str(tmp_path / "spec.yaml"), "--host", sim.url, "--out", str(out),
                                 "--metrics-port", str(free_port())],
                                cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: (ui_answers(ui) and workers_ready(ui)) or load.poll() is not None, timeout_s=30,
                   message="the web UI with both workers")
        assert load.poll() is None, log.read_text()
        with headless_chromium(tmp_path, ui, (1400, 1600)) as devtools:
            form, running, stopped = asyncio.run(drive(devtools, out / "summary.json"))
    finally:
        stop(load)
    assert form["load"]["mode"] == "concurrency" and form["host_read_only"]
    assert "requests" in running["cards"] and count(running, "started") <= count(stopped, "started")
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    per_worker = Counter(record["worker"] for record in records)
    assert sorted(per_worker) == list(range(WORKERS)) and min(per_worker.values()) > 0, per_worker
    assert summary["started"] == len(records) == sum(summary["outcomes"].values()) == count(stopped, "started")
    assert summary["outcomes"]["ok"] == count(stopped, "outcome ok") > 0
