"""The report page's layout in headless Chromium at 1000 and 1400 px, and its plots' geometry (issue 20, item 7).

The browser half renders a what-if plan's report (the example one-knob plan on the simulator's virtual clock, a few
seconds) and measures it: a copy of report.html gets a script that writes layout facts into the DOM, which
`--dump-dom` returns; screenshots at both widths are saved beside it and checked for content. The plot half draws
the report's figures from synthetic runs (one variation 34.7x the baseline's TTFT) and reads their geometry from
matplotlib's renderer: label boxes, axis limits, bar heights.
"""

from __future__ import annotations

import html
import itertools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.text import Annotation
from matplotlib.transforms import Bbox
from PIL import Image, ImageStat

from batchscope.tuner.compare.compute import compare
from batchscope.tuner.compare.model import Comparison
from batchscope.tuner.plan import Slos
from batchscope.tuner.report.plots import deltas_figure, pareto_figure, scheduler_figure, throughput_preemptions_figure
from batchscope.tuner.report.text import percent
from tests.tuner.test_compare import make_run

ROOT = Path(__file__).resolve().parents[2]
WIDTHS = (1000, 1400)
HEIGHT = 1200
FACTS_ID = "layout-facts"
MARK_HEADS = ["significant", "meets SLOs"]  # columns of ✓ / ✗ / n/a marks
# Runs in the copy of the page once it has loaded (images decoded): what the tests assert, as JSON in a <pre>.
MEASURE = """
<script>
window.addEventListener('load', () => {
  const brokenWords = (th) => {  // words of a header's text that span more than one line box
    const node = th.firstChild, text = th.textContent, broken = [];
    let start = 0;
    for (const word of text.split(' ')) {
      const range = document.createRange();
      range.setStart(node, start);
      range.setEnd(node, start + word.length);
      if ([...range.getClientRects()].filter(r => r.width > 0 && r.height > 0).length > 1) broken.push(word);
      start += word.length + 1;
    }
    return broken;
  };
  const marked = [...document.querySelectorAll('table')].flatMap(table => {  // the yes/no/n-a columns' cells
    const columns = [...table.querySelectorAll('th')].map((th, i) => MARK_HEADS.includes(th.textContent) ? i : -1)
      .filter(i => i >= 0);
    return [...table.querySelectorAll('tbody tr')].flatMap(tr => columns.map(i => tr.children[i]));
  });
  const cells = marked.map(td => ({
    text: td.textContent, cls: td.className, color: getComputedStyle(td).color,
    weight: getComputedStyle(td).fontWeight}));
  const facts = {
    innerWidth: window.innerWidth,
    scrollWidth: document.documentElement.scrollWidth,
    headers: [...document.querySelectorAll('th')].map(th => ({text: th.textContent, broken: brokenWords(th)})),
    overflowing: [...document.querySelectorAll('div.wide')].filter(d => d.scrollWidth > d.clientWidth)
      .map(d => d.querySelector('th').textContent),
    marks: cells,
    plots: [...document.querySelectorAll('img.plot')].map(img => ({id: img.id, right: img.getBoundingClientRect().right,
      loaded: img.complete && img.naturalWidth > 0})),
  };
  const out = document.createElement('pre');
  out.id = 'FACTS_ID';
  out.textContent = JSON.stringify(facts);
  document.body.appendChild(out);
});
</script>
""".replace("FACTS_ID", FACTS_ID).replace("MARK_HEADS", json.dumps(MARK_HEADS))


def chromium() -> str:
    browser = shutil.which("chromium")
    if browser is None:
        pytest.skip("Chromium is not installed (scripts/ensure-debian-packages chromium)")
    return browser


def run_chromium(page: Path, profile: Path, width: int, *action: str) -> str:
    """One headless Chromium run on a file page at width x HEIGHT, with a fresh profile; its stdout."""
    done = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={profile}", f"--window-size={width},{HEIGHT}", "--hide-scrollbars",
                           *action, page.resolve().as_uri()],
                          check=True, timeout=120, capture_output=True, text=True)
    return done.stdout


@pytest.fixture(scope="module")
def report_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """report.html of the example one-knob plan run in what-if mode."""
    results = tmp_path_factory.mktemp("layout") / "results"
    subprocess.run([sys.executable, "-m", "batchscope.cli", "tune", str(ROOT / "examples" / "one-knob.yaml"),
                    "--what-if", "--results", str(results)], check=True, timeout=120, capture_output=True)
    return results / "one-knob.what-if" / "report.html"


@pytest.fixture(scope="module", params=WIDTHS, ids=[f"{w}px" for w in WIDTHS])
def facts(request: pytest.FixtureRequest, report_page: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The layout facts of the page at one width."""
    folder = tmp_path_factory.mktemp(f"facts-{request.param}")
    measured = folder / "measured.html"
    measured.write_text(report_page.read_text().replace("</body>", MEASURE + "</body>"))
    dom = run_chromium(measured, folder / "profile", request.param, "--dump-dom")
    found = re.search(f"<pre id=\"{FACTS_ID}\">(.*?)</pre>", dom, re.S)
    assert found, "the measuring script did not write its facts"
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.e2e
def test_the_page_does_not_scroll_sideways(facts):
    assert facts["innerWidth"] in WIDTHS
    assert facts["scrollWidth"] <= facts["innerWidth"]
    assert facts["plots"] and all(p["loaded"] and p["right"] <= facts["innerWidth"] for p in facts["plots"])


@pytest.mark.e2e
def test_no_header_wraps_inside_a_word(facts):
    headers = facts["headers"]
    assert any(h["text"] == "max_num_batched_tokens" for h in headers)
    assert [h["text"] for h in headers if h["broken"]] == []


@pytest.mark.e2e
def test_every_table_fits_the_page(facts):
    assert facts["overflowing"] == []  # the settings table included: no table needs its own scroll bar


@pytest.mark.e2e
def test_n_a_is_not_styled_like_a_check(facts):
    marks = facts["marks"]
    checks = [m for m in marks if m["text"] == "✓"]
    missing = [m for m in marks if m["text"] == "n/a"]
    assert checks and missing
    assert {m["cls"] for m in checks}.isdisjoint(m["cls"] for m in missing)
    assert {m["color"] for m in checks}.isdisjoint(m["color"] for m in missing)
    assert all(int(m["weight"]) < 600 for m in missing)


@pytest.mark.e2e
@pytest.mark.parametrize("width", WIDTHS)
def test_screenshots_show_the_page(report_page, tmp_path, width):
    shot = tmp_path / f"report-{width}.png"
    run_chromium(report_page, tmp_path / "profile", width, f"--screenshot={shot}")
    with Image.open(shot) as image:
        assert image.size == (width, HEIGHT)
        grey = image.convert("L")
        assert ImageStat.Stat(grey).stddev[0] > 10  # text and tables, not one colour
        dark = sum(count for level, count in enumerate(grey.histogram()) if level < 128)
        assert dark > width * HEIGHT * 0.005


# --- plots ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def crowded() -> Comparison:
    """A baseline and four variations: three close to the baseline's spot in both scatter plots, one with TTFT
    +3370% (and fewer completions, more preemptions)."""
    runs = [make_run(ttft=0.5, tpot=0.020),
            make_run("mnbt-1024", ttft=0.52, tpot=0.0201, completed=398, params={"max_num_batched_tokens": 1024},
                     server={"tokens_per_step_mean": 900.0, "queue_time_mean_s": 0.05}),
            make_run("mnbt-8192", ttft=0.51, tpot=0.0202, completed=402, params={"max_num_batched_tokens": 8192},
                     server={"tokens_per_step_mean": 7400.0, "queue_time_mean_s": None, "preemptions": 1}),
            make_run("mns-32", ttft=0.6, tpot=0.0199, completed=396, params={"max_num_seqs": 32},
                     server={"queue_time_mean_s": 0.9}),
            make_run("gmu-0.25", ttft=0.5 * 34.7, tpot=0.019, completed=300, params={"gpu_memory_utilization": 0.25},
                     server={"preemptions": 40})]
    return compare(runs, Slos(ttft_p99_s=1.0, tpot_p99_s=0.1), resamples=300)


@pytest.fixture(scope="module")
def close() -> Comparison:
    """Points as close as the example one-knob plan's what-if run puts them: four settings within a few label
    widths of each other in both scatter plots, one far off."""
    runs = [make_run(ttft=0.5, tpot=0.0366),
            make_run("mnbt-1024", ttft=0.59, tpot=0.0305, completed=416, params={"max_num_batched_tokens": 1024}),
            make_run("mnbt-8192", ttft=0.467, tpot=0.0388, completed=376, params={"max_num_batched_tokens": 8192}),
            make_run("mns-32", ttft=0.735, tpot=0.0264, completed=363, params={"max_num_seqs": 32}),
            make_run("gmu-0.25", ttft=2.1, tpot=0.0113, completed=212, params={"gpu_memory_utilization": 0.25},
                     server={"preemptions": 10})]
    return compare(runs, Slos(ttft_p99_s=1.0, tpot_p99_s=0.1), resamples=300)


def panel(figure: Figure, title: str) -> Axes:
    return next(ax for ax in figure.axes if ax.get_title().startswith(title))


def labels(figure: Figure, names: set[str]) -> list[Annotation]:
    """The point labels of a scatter plot (a label may name several settings on one spot)."""
    return [t for t in figure.axes[0].texts if isinstance(t, Annotation) and set(t.get_text().split(", ")) <= names]


def distance(box: Bbox, point) -> float:
    dx = max(box.x0 - point[0], 0, point[0] - box.x1)
    dy = max(box.y0 - point[1], 0, point[1] - box.y1)
    return float((dx * dx + dy * dy) ** 0.5)


@pytest.mark.parametrize("draw", [pareto_figure, throughput_preemptions_figure], ids=["pareto", "throughput"])
@pytest.mark.parametrize("case", ["close", "crowded"])
def test_point_labels_do_not_overlap_and_sit_by_their_point(request, case, draw):
    comparison = request.getfixturevalue(case)
    figure = draw(comparison)
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    names = [s.setting for s in comparison.settings]
    found = labels(figure, set(names))
    # every setting named once; crowded's outlier squeezes the rest onto one spot, where they share a label
    assert sorted(n for label in found for n in label.get_text().split(", ")) == sorted(names)
    assert case == "crowded" or len(found) == len(names)
    boxes = [label.get_window_extent(renderer) for label in found]
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), (a, b)
    axes_box = figure.axes[0].get_window_extent()
    assert all(axes_box.x0 <= b.x0 and b.x1 <= axes_box.x1 and axes_box.y0 <= b.y0 and b.y1 <= axes_box.y1
               for b in boxes)
    points = [tuple(figure.axes[0].transData.transform(label.xy)) for label in found]
    for label, box, own in zip(found, boxes, points, strict=True):  # nearer its own point than any other
        assert all(distance(box, own) < distance(box, other) for other in points if other != own), label.get_text()


def bars(ax: Axes) -> list[Rectangle]:
    return [p for p in ax.patches if isinstance(p, Rectangle)]


def test_an_outlier_bar_is_clipped_and_annotated_so_the_others_stay_readable(crowded):
    ax = panel(deltas_figure(crowded), "TTFT p99")
    low, high = ax.get_ylim()
    heights = [r.get_height() for r in bars(ax)]
    assert max(heights) > 3000  # the +3370% bar, drawn at its value and clipped by the axis
    assert high < 1000
    others = sorted(abs(h) for h in heights)[:-1]
    assert others[-1] >= 0.2 * (high - low)  # the largest of the rest fills a fifth of the axis or more
    notes = [t.get_text() for t in ax.texts]
    outlier = crowded.variation("gmu-0.25").metric("ttft_p99").relative
    assert outlier is not None and outlier > 30
    assert any(percent(outlier) in n for n in notes), notes


def test_panels_without_an_outlier_are_not_clipped(crowded):
    ax = panel(deltas_figure(crowded), "completion throughput")  # every setting completed as many
    low, high = ax.get_ylim()
    assert all(low <= r.get_y() + r.get_height() <= high for r in bars(ax))
    assert not ax.texts


def test_tokens_per_step_and_queue_time_are_plotted_per_setting(crowded):
    figure = scheduler_figure(crowded)
    steps, queue = panel(figure, "tokens per step"), panel(figure, "queue time")
    names = [s.setting for s in crowded.settings]
    for ax in (steps, queue):
        assert [t.get_text() for t in ax.get_xticklabels()] == names
    by_name = dict(zip(names, (r.get_height() for r in bars(steps)), strict=True))
    assert by_name["mnbt-8192"] == pytest.approx(7400) and by_name["mnbt-1024"] == pytest.approx(900)
    queue_ms = dict(zip(names, (r.get_height() for r in bars(queue)), strict=True))
    assert queue_ms["mns-32"] == pytest.approx(900)  # ms
    # a setting whose server did not report the signal is marked, not drawn as zero
    assert any(t.get_text() == "n/a" for t in queue.texts)
