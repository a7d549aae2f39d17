"""The LLM tab of Locust's web UI: its figures against the end-of-run summary, the server rows and serving
configuration from vLLM's /metrics, the charts' history, and end to end (simulator, Locust with its UI and the
tab's /llm/state JSON, headless Chromium drawing the tab's cards and charts while the run goes and after it
stopped).

Chromium is driven over the DevTools protocol with aiohttp's websocket client (a declared dependency).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from batchscope.loadgen.adapter.llm_tab import (
    MAX_POINTS,
    MIN_READ_INTERVAL_S,
    History,
    LlmTab,
    ServerMetrics,
    Window,
    rows,
)
from batchscope.loadgen.run.control import RunControl
from batchscope.loadgen.spec import load_spec
from batchscope.loadgen.stream.request import RequestRecord
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
# the tab as drawn: its state line, its cards, each figure's cells, each chart's points per line and last values,
# and how many columns the grid has
READ_TAB = """(() => {
  const root = document.getElementById('batchscope-llm');
  if (!root || root.style.display === 'none' || !root.querySelector('.bs-status')) return null;
  const figures = {}, charts = {}, last = {};
  for (const tr of root.querySelectorAll('tr[data-figure]'))
    figures[tr.getAttribute('data-figure')] = [...tr.querySelectorAll('td[data-value]')].map(td => td.textContent);
  for (const chart of root.querySelectorAll('[data-chart]')) {
    const lines = {};
    for (const line of chart.querySelectorAll('polyline'))
      lines[line.getAttribute('data-series')] = line.points.numberOfItems;
    charts[chart.getAttribute('data-chart')] = lines;
  }
  for (const item of root.querySelectorAll('.bs-legend [data-series]'))
    last[item.getAttribute('data-series')] = item.getAttribute('data-last');
  return {state: root.querySelector('.bs-status').getAttribute('data-state'),
          cards: [...root.querySelectorAll('[data-card]')].map(card => card.getAttribute('data-card')),
          figures, charts, last,
          columns: getComputedStyle(root.querySelector('.bs-grid')).gridTemplateColumns.split(' ').length};
})()"""
HEADER_RPS = """(() => {
  const label = [...document.querySelectorAll('header p')].find(p => p.textContent.trim() === 'RPS');
  return label ? label.nextElementSibling.textContent.trim() : null;
})()"""
COLUMNS = ("value", "p50", "p90", "p99")  # after "figure"; a latency row's "value" is its mean
LATENCY_ROWS = ("TTFT (ms)", "TPOT (ms)", "ITL (ms)", "E2E (ms)")
SERVER_ROWS = ("server running (requests)", "server waiting (requests)", "server KV cache usage (%)",
               "server preemptions (in window)")
GRAFANA = "http://grafana.test:3000/"
POLL_S = 2.0  # the tab's poll of /llm/state (static/llm_tab.js)


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
    assert rows(None, window) == [{"card": "run", "figure": "run", "value": "not started"}]
    for batch in (range(0, 30), range(30, 31), range(31, 80)):  # warm-up records first, then the window
        for i in batch:
            ctl.accept(record(i, ctl.start_s, outcome="timeout" if i % 9 == 0 else "ok"))
        window.update(ctl)  # as the tab's chart point does
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


def tab_rows(ctl: RunControl, server: ServerMetrics) -> list[dict[str, str]]:
    """The rows the tab's /llm/state answers after a chart point (a server read first, when due)."""
    tab = LlmTab(lambda: ctl, lambda: False, servers={ctl.host: server})
    tab.sample(ctl)
    return tab.state()["rows"]


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
        return {r["figure"]: r["value"] for r in tab_rows(ctl, server) if r["figure"].startswith("server")}

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
    figures = {r["figure"]: r["value"] for r in tab_rows(ctl, ServerMetrics(closed))}
    assert [figures[figure] for figure in SERVER_ROWS] == ["unreachable"] * 4
    late = ServerMetrics("http://vllm", fetch=lambda url: exposition(6))
    figures = {r["figure"]: r["value"] for r in tab_rows(ctl, late)}
    since = time.strftime("%H:%M:%S", time.localtime(late.baseline.at_s))
    assert figures[f"server preemptions (since {since})"] == "0"
    assert not any(figure.startswith("Grafana") for figure in figures)
    links = {r["figure"]: r["value"] for r in rows(ctl, Window(), grafana_url=GRAFANA)}
    assert links["Grafana overview"] == "http://grafana.test:3000/d/batchscope-overview"
    assert links["Grafana comparison"] == "http://grafana.test:3000/d/batchscope-comparison"


def test_serving_config_comes_from_cache_config_info_and_a_reading_after_the_stop_is_dropped(tmp_path):
    (tmp_path / "spec.yaml").write_text(SPEC)
    ctl = RunControl(spec=load_spec(tmp_path / "spec.yaml", ["model=m"]), run_id="t", host="h", out_dir=None,
                     request_stop=lambda: None, sender_count=lambda: 1, start_s=time.time() - 60)
    info = 'vllm:cache_config_info{block_size="128",engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="42"} 1.0'
    server = ServerMetrics("http://vllm", fetch=lambda url: exposition(6) + info + "\n")
    config = {r["figure"]: r["value"] for r in tab_rows(ctl, server) if r["card"] == "config"}
    assert config == {"model": "m", "block_size": "128", "gpu_memory_utilization": "0.9", "num_gpu_blocks": "42"}
    bare = ServerMetrics("http://vllm", fetch=lambda url: exposition(6))
    assert {r["figure"]: r["value"] for r in tab_rows(ctl, bare) if r["card"] == "config"} == {
        "model": "m", "cache_config_info": "not exposed"}
    # the run stopped while the read was on its way: the idle server's answer does not replace the last one
    answers = iter([exposition(6), exposition(6, kv=(0.0, 0.0))])
    frozen = ServerMetrics("http://vllm", fetch=lambda url: next(answers))
    frozen.read(0.0)
    frozen.read(0.0, force=True, keep=lambda: False)
    assert frozen.latest is not None and frozen.latest.kv == 0.375


def test_history_keeps_its_whole_span_in_bounded_points():
    history = History()
    for i in range(5 * MAX_POINTS):
        history.add({"t": float(i)})
    history.add({"t": -1.0}, last=True)
    times = history.series()["t"]
    assert len(times) <= MAX_POINTS + 1
    assert times[0] == 0.0 and times[-2] >= 4 * MAX_POINTS and times[-1] == -1.0
    assert times[:-1] == sorted(times[:-1])


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

    async def call(self, method: str, **params):
        self.last_id += 1
        await self.ws.send_json({"id": self.last_id, "method": method, "params": params})
        reply = json.loads((await self.ws.receive(timeout=20)).data)
        assert reply["id"] == self.last_id and "error" not in reply, reply
        return reply["result"]

    async def evaluate(self, expression: str):
        return (await self.call("Runtime.evaluate", expression=expression, returnByValue=True))["result"].get("value")

    async def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode((await self.call("Page.captureScreenshot", format="png"))["data"]))

    async def poll(self, expression: str, accept, timeout_s: float, what: str):
        """Evaluate until ``accept(value)`` holds (bounded); return the last value."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = await self.evaluate(expression)
            if accept(value):
                return value
            await asyncio.sleep(0.1)  # polling interval of a bounded wait
        raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last value: {value!r}")


def charted(tab: dict | None) -> bool:
    """The tab is drawn, running, its config shown and each chart's every line has at least 3 points."""
    return (tab is not None and tab["state"] == "running" and "block_size" in tab["figures"]
            and len(tab["charts"]) == 9 and all(n >= 3 for lines in tab["charts"].values() for n in lines.values()))


async def watch_llm_tab(devtools_port: int, shots: Path) -> tuple[dict, str, dict, dict]:
    """Select the LLM tab, wait for its charts, screenshot it; wait for the run's stop, screenshot it again, and
    read it once more two polls later. Returns the running tab, the header's RPS, the stopped tab and the later
    one."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{devtools_port}/json/list") as answer:
            page = next(t for t in await answer.json() if t["type"] == "page")
        async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            tools = DevTools(ws)
            await tools.poll(CLICK_LLM_TAB, bool, timeout_s=15, what="the LLM tab, selected")
            running = await tools.poll(READ_TAB, charted, timeout_s=30, what="the LLM tab's charts, 3 points each")
            header_rps = await tools.evaluate(HEADER_RPS)
            await tools.screenshot(shots / "llm-running.png")
            stopped = await tools.poll(READ_TAB, lambda tab: tab is not None and tab["state"] == "stopped",
                                       timeout_s=60, what="the LLM tab after the run stopped")
            await tools.screenshot(shots / "llm-stopped.png")
            later = time.monotonic() + 2.5 * POLL_S  # two more of the tab's polls
            await tools.poll("1", lambda _: time.monotonic() > later, timeout_s=10, what="two polls")
            return running, header_rps, stopped, await tools.evaluate(READ_TAB)


@contextmanager
def headless_chromium(tmp_path: Path, url: str, size: tuple[int, int]) -> Iterator[int]:
    """Headless Chromium showing ``url`` with a fresh profile (the test is skipped without Chromium); yields its
    DevTools port. Stopped with its whole process group on exit."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Chromium is not installed (scripts/ensure-debian-packages chromium)")
    profile = tmp_path / "chromium-profile"
    browser = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                f"--window-size={size[0]},{size[1]}", url],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield devtools_port(profile)
    finally:
        stop(browser, group=True)


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
            [sys.executable, "-m", "locust", "-f", "batchscope/loadgen/adapter/locustfile.py", "--host", host,
             "--spec", str(spec),
             "--web-port", str(web_port), "--metrics-port", str(free_port()),
             "--autostart", *flags],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: ui_answers(ui) or locust.poll() is not None, timeout_s=20, message="Locust's web UI")
        assert locust.poll() is None, f"Locust exited: {locust_log.read_text()}"
        yield ui
    finally:
        stop(locust)


def llm_rows(ui: str) -> dict[str, dict[str, str]]:
    """The LLM tab's rows from the JSON its script polls, by figure."""
    return {r["figure"]: r for r in requests.get(ui + "llm/state", timeout=5).json()["rows"]}


def numeric(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def latency_grid_filled(table: dict[str, dict[str, str]]) -> bool:
    return all(numeric(table.get(figure, {}).get(column, "-")) for figure in LATENCY_ROWS for column in COLUMNS)


def server_queue(url: str) -> float:
    """Requests running plus waiting, as the server's /metrics says now."""
    families = text_string_to_metric_families(requests.get(url + "/metrics", timeout=5).text)
    return sum(s.value for f in families for s in f.samples
               if s.name in ("vllm:num_requests_running", "vllm:num_requests_waiting"))


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_llm_tab_draws_cards_and_charts_and_freezes_them_at_the_stop(simulator, tmp_path):
    sim = simulator("--profile", "tiny")
    spec = SPEC.replace("duration_s: 60", "duration_s: 14") + "warmup_s: 1\n"  # the run ends by itself
    with locust_ui(tmp_path, sim.url, spec, "--grafana-url", GRAFANA) as ui:
        with headless_chromium(tmp_path, ui + "?tab=llm", (1400, 1000)) as devtools:
            running, header_rps, stopped, later = asyncio.run(watch_llm_tab(devtools, tmp_path))
        idle = wait_until(lambda: server_queue(sim.url) == 0 or None, timeout_s=10, message="the server idle")
    # a grid of cards for a screen, not a list: several columns at 1400 px
    assert running["columns"] >= 2
    charts = ("ttft", "tpot", "itl", "throughput", "tokens", "queue", "kv", "preemptions", "rejections")
    assert {"latency", "server", "config", "throughput", "requests", "spec", "links", "knobs",
            *(f"chart-{chart}" for chart in charts)} <= set(running["cards"])
    assert set(running["charts"]["ttft"]) == {"ttft_p50", "ttft_p90", "ttft_p99"}
    assert set(running["charts"]["queue"]) == {"running", "waiting"}
    assert set(running["charts"]["rejections"]) == {"rejected_max_num_queued_reqs", "rejected_max_num_queued_tokens"}
    assert running["last"]["rejected_max_num_queued_reqs"] == "0"  # no limit on this server: a line on the axis
    # the serving configuration the simulator exposes in vllm:cache_config_info, and the model asked for
    assert running["figures"]["block_size"] == ["16"] and running["figures"]["model"] == ["sim-model"]
    assert numeric(running["figures"]["num_gpu_blocks"][0])
    assert all(numeric(cell) for figure in LATENCY_ROWS for cell in running["figures"][figure])
    assert running["figures"]["mode"] == ["concurrency"] and running["figures"]["concurrency (users)"] == ["4"]
    assert running["figures"]["Grafana overview"] == ["http://grafana.test:3000/d/batchscope-overview"]
    assert numeric(header_rps)
    # after the stop: the last reading taken while the run went on, the charts ending on it, not the idle
    # server's zeros (which /metrics says now)
    figures = stopped["figures"]
    frozen = {key: figures[f"server {key} (requests)"][0] for key in ("running", "waiting")}
    assert frozen == {key: stopped["last"][key] for key in ("running", "waiting")}
    assert int(frozen["running"]) + int(frozen["waiting"]) > 0 and idle
    # the card rounds to one decimal (0.15000000000000002 shows 0.2), the chart to two: half a last digit apart
    assert float(figures["server KV cache usage (%)"][0]) == pytest.approx(float(stopped["last"]["kv"]),
                                                                          abs=0.05 + 1e-9)
    assert all(numeric(cell) for figure in LATENCY_ROWS for cell in figures[figure])
    assert all(stopped["charts"][chart][line] >= count for chart, lines in running["charts"].items()
               for line, count in lines.items())
    server_figures = [*SERVER_ROWS, "block_size"]
    assert later["state"] == "stopped"
    assert [later["figures"][f] for f in server_figures] == [stopped["figures"][f] for f in server_figures]
    assert later["last"] == stopped["last"]
    for shot in ("llm-running.png", "llm-stopped.png"):
        assert (tmp_path / shot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
            answer = requests.get(ui + "llm/state", timeout=5).text
    finally:
        host.stop()
    assert [table[figure]["value"] for figure in SERVER_ROWS] == ["unreachable"] * 4
    assert not any(figure.startswith("Grafana") for figure in table)
    sends = [r for r in host.requests if r.method == "POST"]
    assert sends and all(r.headers.get("Authorization") == "Bearer secret-key-123" for r in sends)
    reads = [r for r in host.requests if r.path == "/metrics"]
    assert reads and all("Authorization" not in r.headers for r in reads)  # /metrics needs no key: none is sent
    assert "secret-key-123" not in answer and "secret-key-123" not in (tmp_path / "locust.log").read_text()


def fresh_stats(ui: str) -> tuple[float, dict]:
    """/stats/requests computed now (Locust memoizes it for 2 s: a read over 2 s after the last one misses the
    cache) and the moment it was computed."""
    requests.get(ui + "stats/requests", timeout=5)
    after = time.time() + 2.1
    wait_until(lambda: time.time() > after, timeout_s=5, message="Locust's 2 s answer cache to expire")
    asked = time.time()
    stats = requests.get(ui + "stats/requests", timeout=5).json()
    return (asked + time.time()) / 2, stats


def ended_per_second(records: Path, first_s: int, last_s: int) -> float:
    """Requests that ended (not cut by the run's end) per second over the whole seconds [first_s, last_s)."""
    ends = [r["end_s"] for r in map(json.loads, records.read_text().splitlines()) if r["outcome"] != "aborted"]
    return sum(1 for end in ends if first_s <= int(end) < last_s) / (last_s - first_s)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_locusts_header_rps_is_the_request_rate(simulator, tmp_path):
    sim = simulator("--profile", "tiny")
    records = tmp_path / "out" / "records.jsonl"
    with locust_ui(tmp_path, sim.url, SPEC + "warmup_s: 1\n", "--out", str(tmp_path / "out")) as ui:
        wait_until(lambda: requests.get(ui + "stats/requests", timeout=5).json()["state"] == "running",
                   timeout_s=20, interval_s=0.5, message="the run to start")
        begun = time.time()
        wait_until(lambda: time.time() - begun > 14, timeout_s=20, interval_s=0.5, message="14 s of load")
        at, stats = fresh_stats(ui)
        # Locust's current_rps (the header's RPS) averages its per-second counts over [now - 12, now - 2) s;
        # the same seconds of records.jsonl, once the controller has written them
        first, last = int(at) - 12, int(at) - 2
        wait_until(lambda: records.exists() and ended_per_second(records, last, last + 1) > 0
                   and max(json.loads(line)["end_s"] for line in records.read_text().splitlines()) > last + 1,
                   timeout_s=10, interval_s=0.5, message="the records of the measured seconds")
        rate = ended_per_second(records, first, last)
    rows = {(entry["method"], entry["name"]): entry for entry in stats["stats"]}
    assert rate > 5
    assert stats["current_rps"] == pytest.approx(rate, rel=0.05)
    assert rows[("REQUEST", "default")]["current_rps"] == pytest.approx(stats["current_rps"])
    assert stats["fail_ratio"] == 0
    assert ("ITL", "default") not in rows  # a gap between tokens is not a request


def listening_addresses(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp* spells them) with a socket listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_web_ui_listens_on_loopback_unless_told_otherwise(simulator, tmp_path):
    sim = simulator("--profile", "tiny")
    with locust_ui(tmp_path, sim.url, SPEC) as ui:
        assert listening_addresses(int(ui.rstrip("/").rpartition(":")[2])) == {"0100007F"}  # 127.0.0.1 only
