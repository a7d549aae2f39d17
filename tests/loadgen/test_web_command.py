"""`batchscope load --web` end to end in headless Chromium (simulator, Locust's web UI), checked on screenshots as
well as the DOM: the start form shows the spec's load without Locust's users, ramp-up and run time; Start runs the
spec; the LLM tab shows the knobs of --vllm-command, and its charts (TTFT, TPOT, ITL, throughput...) have tick
labels and lines drawn in their plot areas, one p99 in a legend and the table; at the stop summary.json is
written while Locust still runs, and its path shown. Chromium helpers: test_webui.py.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from PIL import Image

from tests.conftest import free_port, wait_until
from tests.loadgen.test_webui import CLICK_LLM_TAB, ROOT, DevTools, headless_chromium, stop, ui_answers

SPEC = """\
input_tokens: 64
output_tokens: 32
warmup_s: 1
duration_s: 16
load: {mode: concurrency, concurrency: 4}
"""
VLLM_COMMAND = "vllm serve sim-model --max-num-seqs 8 --max_num_batched_tokens=512 --max-num-queued-reqs 64"
KNOBS = {"max_num_seqs": "8", "max_num_batched_tokens": "512", "max_num_queued_reqs": "64",
         "max_num_queued_tokens": "vLLM default", "long_prefill_token_threshold_adaptive": "vLLM default"}
CHARTS = ("ttft", "tpot", "itl", "throughput", "tokens", "queue", "kv", "preemptions", "rejections")
SIZE = (1400, 2600)  # tall enough that every card is in the screenshot
# the start form as shown: the spec's load block (rows and box), whether Locust's overridden fields show
READ_FORM = """(() => {
  const block = document.querySelector('form .bs-load');
  if (!block || !block.querySelector('tr')) return null;
  const load = {};
  for (const tr of block.querySelectorAll('tr[data-load]'))
    load[tr.getAttribute('data-load')] = tr.cells[1].textContent;
  const r = block.getBoundingClientRect();
  return {load, box: [r.left, r.top, r.right, r.bottom], text: document.body.innerText,
          host_read_only: document.querySelector('input[name=host]').readOnly};
})()"""
START = "(() => { document.querySelector('form button[type=submit]').click(); return true; })()"
# every chart's svg box, plot area (its viewBox is 320 wide: 50 left, 10 right, 10 top, 34 bottom), tick labels
# and points per line; the knob card's value cells; the latency table's p99 beside each legend's (one render)
READ_TAB = """(() => {
  const root = document.getElementById('batchscope-llm');
  if (!root || !root.querySelector('[data-chart]')) return null;
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const charts = {};
  for (const chart of root.querySelectorAll('[data-chart]')) {
    const svg = chart.querySelector('svg'), r = svg.getBoundingClientRect(), k = r.width / 320;
    charts[chart.getAttribute('data-chart')] = {
      plot: [r.left + 51 * k, r.top + 10 * k, r.right - 10 * k, r.bottom - 32 * k],  // with a line on the axis
      y_labels: [r.left, r.top, r.left + 48 * k, r.bottom - 34 * k],
      y_ticks: [...svg.querySelectorAll('.bs-tick-y')].map(t => t.textContent),
      x_ticks: [...svg.querySelectorAll('.bs-tick-x')].map(t => t.textContent),
      points: Object.fromEntries([...svg.querySelectorAll('polyline')].map(
        p => [p.getAttribute('data-series'), p.points.numberOfItems])),
      last: Object.fromEntries([...chart.querySelectorAll('.bs-legend [data-series]')].map(
        s => [s.getAttribute('data-series'), s.getAttribute('data-last')])),
    };
  }
  const figures = {}, cells = {};
  for (const tr of root.querySelectorAll('tr[data-figure]')) {
    const tds = [...tr.querySelectorAll('td[data-value]')];
    figures[tr.getAttribute('data-figure')] = tds.map(td => td.textContent);
    if (tr.closest('[data-card=knobs]')) cells[tr.getAttribute('data-figure')] = box(tds[0]);
  }
  return {state: root.querySelector('.bs-status').getAttribute('data-state'), charts, figures, knob_cells: cells};
})()"""


def ready(tab: dict | None) -> bool:
    return (tab is not None and tab["state"] == "running" and set(CHARTS) <= set(tab["charts"])
            and all(n >= 3 for chart in tab["charts"].values() for n in chart["points"].values()))


async def drive(port: int, shots: Path) -> tuple[dict, dict, dict]:
    """The start form, then Start, the LLM tab running, and stopped; a screenshot of each."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/json/list") as answer:
            page = next(t for t in await answer.json() if t["type"] == "page")
        async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            tools = DevTools(ws)
            form = await tools.poll(READ_FORM, bool, timeout_s=20, what="the start form with the spec's load")
            await tools.screenshot(shots / "start-form.png")
            await tools.evaluate(START)
            await tools.poll(CLICK_LLM_TAB, bool, timeout_s=15, what="the LLM tab, selected")
            running = await tools.poll(READ_TAB, ready, timeout_s=40, what="every chart with 3 points a line")
            await tools.screenshot(shots / "llm-running.png")
            stopped = await tools.poll(READ_TAB, lambda tab: tab is not None and tab["state"] == "stopped"
                                       and tab["figures"]["summary.json"][0].endswith("summary.json"),
                                       timeout_s=60, what="the tab stopped, the summary's path shown")
            await tools.screenshot(shots / "llm-stopped.png")
            return form, running, stopped


def inked(image: Image.Image, box: list[float], colourful: bool = False) -> int:
    """Pixels in ``box`` (CSS px = screenshot px at scale 1) unlike the box's background (its commonest colour):
    any ink, or only coloured ink (a chart's lines, not its grey grid and black text)."""
    left, top, right, bottom = (round(v) for v in box)
    data = image.crop((left, top, right, bottom)).convert("RGB").tobytes()
    pixels = [tuple(data[i:i + 3]) for i in range(0, len(data), 3)]
    background = max(set(pixels), key=pixels.count)
    if colourful:
        return sum(1 for p in pixels if max(p) - min(p) > 80)
    return sum(1 for p in pixels if sum(abs(a - b) for a, b in zip(p, background, strict=True)) > 120)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_batchscope_load_web_shows_the_specs_load_the_knobs_and_readable_charts(simulator, tmp_path):
    sim = simulator("--profile", "tiny", "--max-num-seqs", "8", "--max-num-batched-tokens", "512")
    (tmp_path / "spec.yaml").write_text(SPEC)
    out, port = tmp_path / "out", free_port()
    ui = f"http://127.0.0.1:{port}/"
    log = tmp_path / "load.log"
    with open(log, "w") as sink:
        load = subprocess.Popen([sys.executable, "-m", "batchscope.cli", "load", "--web", "--web-port", str(port),
                                 "--spec", str(tmp_path / "spec.yaml"), "--host", sim.url, "--out", str(out),
                                 "--metrics-port", str(free_port()), "--vllm-command", VLLM_COMMAND],
                                cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: ui_answers(ui) or load.poll() is not None, timeout_s=30, message="the web UI")
        assert load.poll() is None, log.read_text()
        assert not (out / "summary.json").exists()
        with headless_chromium(tmp_path, ui, SIZE) as devtools:
            form, running, stopped = asyncio.run(drive(devtools, tmp_path))
        summary_written_while_up = (out / "summary.json").exists() and load.poll() is None
    finally:
        stop(load)
    # the start form: the spec's load, not Locust's ignored fields (hidden, so not in the page's visible text)
    assert form["load"]["mode"] == "concurrency" and form["load"]["concurrency (users)"] == "4"
    assert form["load"]["duration (s)"] == "16" and form["host_read_only"]
    assert "Number of users" not in form["text"] and "Ramp up" not in form["text"] and "Run time" not in form["text"]
    start_shot = Image.open(tmp_path / "start-form.png")
    assert inked(start_shot, form["box"]) > 400  # the load block's text is drawn
    # the knobs of --vllm-command, each value drawn in its cell
    shot = Image.open(tmp_path / "llm-running.png")
    assert {knob: running["figures"][knob] for knob in KNOBS} == {knob: [v] for knob, v in KNOBS.items()}
    assert running["figures"]["source"] == ["--vllm-command"]
    for knob in KNOBS:
        assert inked(shot, running["knob_cells"][knob]) > 15, knob
    # every chart: round ticks with labels drawn left of the plot, lines drawn in it
    for name in CHARTS:
        chart = running["charts"][name]
        assert len(chart["y_ticks"]) >= 3 and chart["y_ticks"][0] == "0" and len(chart["x_ticks"]) >= 2, name
        assert inked(shot, chart["y_labels"]) > 30, name
        assert inked(shot, chart["plot"], colourful=True) > 100, name
        top = float(chart["y_ticks"][-1])  # the axis spans every value: no line leaves the plot
        assert all(float(v) <= top for v in chart["last"].values() if v != "-"), name
    # one p99: each latency legend's is the table's, as drawn in one render
    for name in ("ttft", "tpot", "itl"):
        assert running["charts"][name]["last"][f"{name}_p99"] == running["figures"][f"{name.upper()} (ms)"][3]
    # at the stop: the summary written while the UI is still up, its path in the tab; the generator line whole
    assert summary_written_while_up
    assert stopped["figures"]["summary.json"] == [str(out / "summary.json")]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["started"] == sum(summary["outcomes"].values()) > 0
    generator = stopped["figures"]["load generator"][0]
    assert "-)" not in generator and "median -" not in generator, generator


@pytest.mark.parametrize(("flags", "named"), [
    (["--exporter-url", "http://127.0.0.1:9"], "--exporter-url: for the web UI's LLM tab, only with --web"),
    (["--web", "--web-port", "70000"], "--web-port: 70000 is not a port number"),
    (["--web", "--web-host", "no-such-host.invalid"], "--web-host: cannot resolve"),
    (["--web", "--vllm-command", "vllm serve 'm"], "--vllm-command: not a command line"),
    (["--web", "--vllm-command-file", "/nonexistent/cmd"], "--vllm-command-file: cannot read"),
])
def test_the_web_flags_refuse_bad_input_in_one_line(tmp_path, flags, named):
    (tmp_path / "spec.yaml").write_text(SPEC)
    done = subprocess.run([sys.executable, "-m", "batchscope.cli", "load", "--spec", str(tmp_path / "spec.yaml"),
                           "--host", "http://127.0.0.1:9", "--out", str(tmp_path / "out"), *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"batchscope load: error: {named}") and done.stderr.count("\n") == 1, done.stderr
