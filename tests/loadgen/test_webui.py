"""The LLM tab of Locust's web UI: its figures against the end-of-run summary, and end to end (simulator, Locust
with its UI, headless Chromium clicking the tab).

Chromium is driven over the DevTools protocol with aiohttp's websocket client (a declared dependency).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
import requests

from loadgen.control import RunControl
from loadgen.request import RequestRecord
from loadgen.spec import load_spec
from loadgen.webui import Window, rows
from tests.conftest import wait_until

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-quic", "--remote-debugging-port=0")
SPEC = """\
input_tokens: 64
output_tokens: 32
duration_s: 60
load: {mode: concurrency, concurrency: 4}
"""
CLICK_LLM_TAB = """(() => {
  const tab = [...document.querySelectorAll('[role=tab]')].find(t => t.textContent.trim() === 'LLM');
  if (tab) tab.click();
  return Boolean(tab) && tab.getAttribute('aria-selected') === 'true';
})()"""
TABLE_ROWS = "[...document.querySelectorAll('tbody tr')].map(tr => [...tr.cells].map(td => td.textContent.trim()))"


def record(i: int, start: float, outcome: str = "ok") -> RequestRecord:
    scheduled = start + i * 0.1
    gaps = [0.001 * (1 + (i * k) % 7) for k in range(1, 4)]
    return RequestRecord(request_id=str(i), worker=0, scheduled_s=scheduled, sent_s=scheduled, end_s=scheduled + 0.5,
                         ttft_s=0.01 * (1 + i % 5), tpot_s=sum(gaps) / 3, e2e_s=0.5 + 0.01 * i, itl_s=gaps,
                         prompt_tokens=64, output_tokens=4, outcome=outcome)


def test_figures_match_the_summary_as_records_arrive(tmp_path):
    (tmp_path / "spec.yaml").write_text(SPEC)
    spec = load_spec(tmp_path / "spec.yaml", ["warmup_s=1"])
    ctl = RunControl(spec=spec, run_id="t", host="h", out_dir=None, request_stop=lambda: None,
                     sender_count=lambda: 1, start_s=1000.0)
    window = Window()
    assert rows(None, window) == [{"figure": "run", "value": "not started"}]
    for batch in (range(0, 30), range(30, 31), range(31, 80)):  # warm-up records first, then the window
        for i in batch:
            ctl.accept(record(i, ctl.start_s, outcome="timeout" if i % 9 == 0 else "ok"))
        figures = {r["figure"]: r["value"] for r in rows(ctl, window)}
        summary = ctl.summary()
        for name in ("ttft", "tpot", "itl", "e2e"):
            for p in ("p50", "p90", "p99"):
                expected = getattr(getattr(summary, name), p)
                assert figures[f"{name.upper()} {p} (ms)"] == ("-" if expected is None else f"{expected * 1000:.2f}")
        assert figures["completed (ok, in window)"] == str(summary.completed)
        assert figures["outcome timeout"] == str(summary.outcomes["timeout"])
    assert summary.completed > 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ui_answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def stop(process: subprocess.Popen, group: bool = False) -> None:
    """SIGTERM (the whole process group for a browser), then SIGKILL if it lingers."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if process.poll() is not None:
            return
        if group:
            os.killpg(process.pid, sig)
        else:
            process.send_signal(sig)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            continue


class DevTools:
    """A minimal DevTools protocol client: one page, commands answered in order (no domain enabled, no events)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.last_id = 0

    async def evaluate(self, expression: str):
        self.last_id += 1
        await self.ws.send_json({"id": self.last_id, "method": "Runtime.evaluate",
                                 "params": {"expression": expression, "returnByValue": True}})
        reply = json.loads((await self.ws.receive(timeout=10)).data)
        assert reply["id"] == self.last_id and "error" not in reply, reply
        return reply["result"]["result"].get("value")

    async def poll(self, expression: str, accept, timeout_s: float, what: str):
        """Evaluate until ``accept(value)`` holds (bounded); return the last value."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = await self.evaluate(expression)
            if accept(value):
                return value
            await asyncio.sleep(0.1)  # polling interval of a bounded wait
        raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last value: {value!r}")


def ttft_p50(table: list[list[str]]) -> float:
    values = {cells[0]: cells[1] for cells in table if len(cells) == 2}
    value = values.get("TTFT p50 (ms)", "-")
    return 0.0 if value == "-" else float(value)


async def read_llm_tab(devtools_port: int) -> list[list[str]]:
    """Click the LLM tab of the page Chromium opened and wait until it shows a TTFT; return the table."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{devtools_port}/json/list") as answer:
            page = next(t for t in await answer.json() if t["type"] == "page")
        async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            tools = DevTools(ws)
            await tools.poll(CLICK_LLM_TAB, bool, timeout_s=15, what="the LLM tab, selected")
            return await tools.poll(TABLE_ROWS, lambda table: ttft_p50(table) > 0, timeout_s=20,
                                    what="a TTFT p50 > 0 in the LLM tab")


def devtools_port(profile: Path) -> int:
    """Chromium writes the port it picked for --remote-debugging-port=0 into the profile directory."""
    active = profile / "DevToolsActivePort"
    return int(wait_until(lambda: active.exists() and active.read_text().split("\n")[0], timeout_s=15,
                          message="Chromium's DevTools port"))


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_llm_tab_shows_live_ttft(simulator, tmp_path):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Chromium is not installed (scripts/ensure-debian-packages chromium)")
    sim = simulator("--profile", "tiny")
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    web_port = free_port()
    ui = f"http://127.0.0.1:{web_port}/"
    locust_log = tmp_path / "locust.log"
    with open(locust_log, "w") as log:
        locust = subprocess.Popen(
            [sys.executable, "-m", "locust", "-f", "loadgen/locustfile.py", "--host", sim.url, "--spec", str(spec),
             "--web-host", "127.0.0.1", "--web-port", str(web_port), "--metrics-port", str(free_port()),
             "--autostart"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    browser = None
    try:
        wait_until(lambda: ui_answers(ui) or locust.poll() is not None, timeout_s=20, message="Locust's web UI")
        assert locust.poll() is None, f"Locust exited: {locust_log.read_text()}"
        profile = tmp_path / "chromium-profile"
        browser = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", ui],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        table = asyncio.run(read_llm_tab(devtools_port(profile)))
    finally:
        if browser is not None:
            stop(browser, group=True)
        stop(locust)
    figures = {cells[0]: cells[1] for cells in table}
    assert ttft_p50(table) > 0
    assert float(figures["completion throughput (req/s)"]) > 0
    assert figures["spec mode"] == "concurrency" and figures["spec concurrency (users)"] == "4"
