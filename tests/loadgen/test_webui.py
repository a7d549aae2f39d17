"""The LLM tab of Locust's web UI: its figures against the end-of-run summary, the server rows from vLLM's
/metrics, and end to end (simulator, Locust with its UI and its /stats/requests JSON, headless Chromium clicking
the tab).

Chromium is driven over the DevTools protocol with aiohttp's websocket client (a declared dependency).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from loadgen.control import RunControl
from loadgen.request import RequestRecord
from loadgen.spec import load_spec
from loadgen.webui import MIN_READ_INTERVAL_S, ServerMetrics, Window, rows
from tests.conftest import free_port, wait_until
from tests.stubs import HttpStub, Reply

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
TABLE_HEAD = "[...document.querySelectorAll('thead th')].map(th => th.textContent.trim())"
TABLE_ROWS = "[...document.querySelectorAll('tbody tr')].map(tr => [...tr.cells].map(td => td.textContent.trim()))"
COLUMNS = ("value", "p50", "p90", "p99")  # after "figure"; a latency row's "value" is its mean
LATENCY_ROWS = ("TTFT (ms)", "TPOT (ms)", "ITL (ms)", "E2E (ms)")
SERVER_ROWS = ("server running (requests)", "server waiting (requests)", "server KV cache usage (%)",
               "server preemptions (in window)")
GRAFANA = "http://grafana.test:3000/"


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
        table = {r["figure"]: r for r in rows(ctl, window)}
        figures = {figure: r["value"] for figure, r in table.items()}
        summary = ctl.summary()
        for name in ("ttft", "tpot", "itl", "e2e"):
            for column, stat in zip(COLUMNS, ("mean", "p50", "p90", "p99"), strict=True):
                expected = getattr(getattr(summary, name), stat)
                assert table[f"{name.upper()} (ms)"][column] == ("-" if expected is None else f"{expected * 1000:.2f}")
        assert figures["completed (ok, in window)"] == str(summary.completed)
        assert figures["outcome timeout"] == str(summary.outcomes["timeout"])
    assert summary.completed > 0


def exposition(preemptions: float, kv: tuple[float, float] = (0.25, 0.5)) -> str:
    """Two engines' worth of vLLM samples, with the histogram and _created lines a real /metrics has around them."""
    lines = ["# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
             "# TYPE vllm:num_preemptions_total counter"]
    for engine, usage in enumerate(kv):
        labels = f'{{engine="{engine}",model_name="m"}}'
        lines += [f"vllm:num_requests_running{labels} {3 + engine}.0", f"vllm:num_requests_waiting{labels} 2.0",
                  f"vllm:kv_cache_usage_perc{labels} {usage}",
                  f"vllm:num_preemptions_total{labels} {preemptions / 2}",
                  f"vllm:num_preemptions_created{labels} 1.7e9",
                  f'vllm:e2e_request_latency_seconds_bucket{{engine="{engine}",le="+Inf"}} 9.0']
    return "\n".join(lines) + "\n"


def test_server_rows_sum_engines_and_count_preemptions_from_the_window_start(tmp_path):
    (tmp_path / "spec.yaml").write_text(SPEC)
    spec = load_spec(tmp_path / "spec.yaml", ["warmup_s=10"])
    ctl = RunControl(spec=spec, run_id="t", host="h", out_dir=None, request_stop=lambda: None,
                     sender_count=lambda: 1, start_s=1000.0)
    now = [1005.0]
    answers = iter([exposition(4), exposition(10), exposition(30, kv=(0.5, 0.625))])
    fetched = []
    server = ServerMetrics("http://vllm:8000/", fetch=lambda url: fetched.append(url) or next(answers),
                           clock=lambda: now[0])

    def figures() -> dict[str, str]:
        return {r["figure"]: r["value"] for r in rows(ctl, Window(), server) if r["figure"].startswith("server")}

    assert figures()["server preemptions (in window)"] == "-"  # warm-up: no baseline yet
    now[0] = 1010.0
    assert figures() == dict(zip(SERVER_ROWS, ("7", "4", "37.5", "0"), strict=True))  # the baseline: 10
    now[0] += MIN_READ_INTERVAL_S / 2
    assert figures()["server preemptions (in window)"] == "0" and len(fetched) == 2  # no read between polls
    now[0] += MIN_READ_INTERVAL_S
    assert figures() == dict(zip(SERVER_ROWS, ("7", "4", "56.2", "20"), strict=True))
    assert fetched == ["http://vllm:8000/metrics"] * 3


def test_server_rows_say_unreachable_and_when_a_late_baseline_counts_from(tmp_path):
    (tmp_path / "spec.yaml").write_text(SPEC)
    ctl = RunControl(spec=load_spec(tmp_path / "spec.yaml", []), run_id="t", host="h", out_dir=None,
                     request_stop=lambda: None, sender_count=lambda: 1, start_s=time.time() - 60)
    closed = f"http://127.0.0.1:{free_port()}"
    figures = {r["figure"]: r["value"] for r in rows(ctl, Window(), ServerMetrics(closed))}
    assert [figures[figure] for figure in SERVER_ROWS] == ["unreachable"] * 4
    late = ServerMetrics("http://vllm", fetch=lambda url: exposition(6))
    figures = {r["figure"]: r["value"] for r in rows(ctl, Window(), late)}
    since = time.strftime("%H:%M:%S", time.localtime(late.baseline.at_s))
    assert figures[f"server preemptions (since {since})"] == "0"
    assert not any(figure.startswith("Grafana") for figure in figures)
    links = {r["figure"]: r["value"] for r in rows(ctl, Window(), grafana_url=GRAFANA)}
    assert links["Grafana overview"] == "http://grafana.test:3000/d/batchscope-overview"
    assert links["Grafana comparison"] == "http://grafana.test:3000/d/batchscope-comparison"


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
    """The p50 cell of the TTFT row (0 while it shows "-")."""
    cells = next((cells for cells in table if cells and cells[0] == "TTFT (ms)"), None)
    return 0.0 if cells is None or len(cells) < 3 or cells[2] == "-" else float(cells[2])


async def read_llm_tab(devtools_port: int) -> tuple[list[str], list[list[str]]]:
    """Click the LLM tab of the page Chromium opened and wait until it shows a TTFT; return its head and rows."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{devtools_port}/json/list") as answer:
            page = next(t for t in await answer.json() if t["type"] == "page")
        async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            tools = DevTools(ws)
            await tools.poll(CLICK_LLM_TAB, bool, timeout_s=15, what="the LLM tab, selected")
            table = await tools.poll(TABLE_ROWS, lambda table: ttft_p50(table) > 0, timeout_s=20,
                                     what="a TTFT p50 > 0 in the LLM tab")
            return await tools.evaluate(TABLE_HEAD), table


def devtools_port(profile: Path) -> int:
    """Chromium writes the port it picked for --remote-debugging-port=0 into the profile directory."""
    active = profile / "DevToolsActivePort"
    return int(wait_until(lambda: active.exists() and active.read_text().split("\n")[0], timeout_s=15,
                          message="Chromium's DevTools port"))


@contextmanager
def locust_ui(tmp_path: Path, host: str, spec_text: str, *flags: str):
    """A Locust process with its web UI, autostarted against ``host``; yields the UI's URL. Stopped on exit."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text)
    web_port = free_port()
    ui = f"http://127.0.0.1:{web_port}/"
    locust_log = tmp_path / "locust.log"
    with open(locust_log, "w") as log:
        locust = subprocess.Popen(
            [sys.executable, "-m", "locust", "-f", "loadgen/locustfile.py", "--host", host, "--spec", str(spec),
             "--web-host", "127.0.0.1", "--web-port", str(web_port), "--metrics-port", str(free_port()),
             "--autostart", *flags],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: ui_answers(ui) or locust.poll() is not None, timeout_s=20, message="Locust's web UI")
        assert locust.poll() is None, f"Locust exited: {locust_log.read_text()}"
        yield ui
    finally:
        stop(locust)


def llm_rows(ui: str) -> dict[str, dict[str, str]]:
    """The LLM tab's rows from the JSON the UI polls, by figure."""
    stats = requests.get(ui + "stats/requests", timeout=5).json()
    data = next(tab["data"] for tab in stats["extended_stats"] if tab["key"] == "llm")
    return {r["figure"]: r for r in data}


def numeric(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def latency_grid_filled(table: dict[str, dict[str, str]]) -> bool:
    return all(numeric(table.get(figure, {}).get(column, "-")) for figure in LATENCY_ROWS for column in COLUMNS)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_llm_tab_shows_live_ttft(simulator, tmp_path):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Chromium is not installed (scripts/ensure-debian-packages chromium)")
    sim = simulator("--profile", "tiny")
    browser = None
    with locust_ui(tmp_path, sim.url, SPEC, "--grafana-url", GRAFANA) as ui:
        profile = tmp_path / "chromium-profile"
        browser = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", ui],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            head, table = asyncio.run(read_llm_tab(devtools_port(profile)))
        finally:
            stop(browser, group=True)
    assert head == ["Figure", "Mean / value", "p50", "p90", "p99"]
    grid = {cells[0]: cells[1:] for cells in table}
    figures = {figure: cells[0] for figure, cells in grid.items()}
    assert ttft_p50(table) > 0
    assert all(len(grid[figure]) == 4 and all(numeric(cell) for cell in grid[figure]) for figure in LATENCY_ROWS)
    assert float(figures["completion throughput (req/s)"]) > 0
    assert figures["spec mode"] == "concurrency" and figures["spec concurrency (users)"] == "4"
    assert numeric(figures["server running (requests)"])
    # the extended table renders cells as text: the link is its URL, readable and copyable
    assert figures["Grafana overview"] == "http://grafana.test:3000/d/batchscope-overview"


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_llm_tab_shows_the_servers_queue_and_preemptions(simulator, tmp_path):
    # a KV cache of 2,160 tokens (the tiny profile at 25.2% of its 4 GiB) against 32 requests of 64 + 128
    # tokens: the server must preempt
    sim = simulator("--profile", "tiny", "--max-model-len", "512", "--gpu-memory-utilization", "0.252")
    spec = SPEC.replace("output_tokens: 32", "output_tokens: 128").replace("concurrency: 4", "concurrency: 32")
    with locust_ui(tmp_path, sim.url, spec + "warmup_s: 1\n", "--grafana-url", GRAFANA) as ui:
        table = wait_until(lambda: (t := llm_rows(ui)) and latency_grid_filled(t)
                           and numeric(t["server preemptions (in window)"]["value"])
                           and float(t["server preemptions (in window)"]["value"]) > 0 and t,
                           timeout_s=30, interval_s=0.5, message="latencies and preemptions > 0 in the LLM tab")
    assert latency_grid_filled(table)
    figures = {figure: r["value"] for figure, r in table.items()}
    running, waiting = int(figures["server running (requests)"]), int(figures["server waiting (requests)"])
    assert 0 <= running <= 32 and 0 <= waiting <= 32
    assert 0 <= float(figures["server KV cache usage (%)"]) <= 100
    total = next(s.value for f in text_string_to_metric_families(requests.get(sim.url + "/metrics", timeout=5).text)
                 for s in f.samples if s.name == "vllm:num_preemptions_total")
    assert 0 < int(figures["server preemptions (in window)"]) <= total
    assert figures["Grafana overview"] == "http://grafana.test:3000/d/batchscope-overview"
    assert figures["Grafana comparison"] == "http://grafana.test:3000/d/batchscope-comparison"


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_llm_tab_says_unreachable_when_the_host_has_no_metrics(tmp_path):
    host = HttpStub(lambda method, path: Reply(status=404)).start()  # answers, but has no /metrics (nor an API)
    spec = SPEC + "model: m\napi_key: secret-key-123\n"  # a named model: nothing to resolve before the start
    try:
        with locust_ui(tmp_path, host.url, spec) as ui:
            table = wait_until(lambda: (t := llm_rows(ui)) and "server running (requests)" in t
                               and t["server running (requests)"]["value"] != "-" and t,
                               timeout_s=20, interval_s=0.5, message="the server rows in the LLM tab")
            answer = requests.get(ui + "stats/requests", timeout=5).text
    finally:
        host.stop()
    assert [table[figure]["value"] for figure in SERVER_ROWS] == ["unreachable"] * 4
    assert not any(figure.startswith("Grafana") for figure in table)
    sends = [r for r in host.requests if r.method == "POST"]
    assert sends and all(r.headers.get("Authorization") == "Bearer secret-key-123" for r in sends)
    reads = [r for r in host.requests if r.path == "/metrics"]
    assert reads and all("Authorization" not in r.headers for r in reads)  # /metrics needs no key: none is sent
    assert "secret-key-123" not in answer and "secret-key-123" not in (tmp_path / "locust.log").read_text()
