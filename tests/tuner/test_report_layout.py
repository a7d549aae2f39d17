"""The report page's layout in headless Chromium at 1000 and 1400 px, and its plots' geometry (issue 20, item 7).

The browser half renders a what-if plan's report (the example one-knob plan, its window shortened, on the simulator's
virtual clock: a few seconds) and measures it: a copy of report.html gets a script that writes layout facts into the
DOM, which `--dump-dom` returns; screenshots at both widths are saved beside it and checked for content. The plot
half draws the report's figures from synthetic runs (one variation 34.7x the baseline's TTFT) and reads their
geometry from matplotlib's renderer: label boxes, axis limits, bar heights.
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

import numpy as np
import pytest
import yaml
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.text import Annotation
from matplotlib.transforms import Bbox
from PIL import Image, ImageStat

from batchscope.tuner.compare.compute import compare
from batchscope.tuner.compare.model import Comparison
from batchscope.tuner.plan import Slos
from batchscope.tuner.report.plots import (
    BAR_METRICS,
    EVIDENCE_COLOURS,
    EVIDENCE_WORDS,
    FAILING_SIDE,
    FRONT,
    MARKER_PX,
    category,
    deltas_figure,
    pareto_figure,
    scheduler_figure,
    signals_figure,
    throughput_preemptions_figure,
)
from batchscope.tuner.report.text import percent
from tests.tuner.support import write_plan
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
    settingsHeader: [...document.querySelectorAll('h2')].find(h => h.textContent === 'Settings')
      .nextElementSibling.nextElementSibling.querySelector('thead').getBoundingClientRect().height,
    overflowing: [...document.querySelectorAll('div.wide')].filter(d => d.scrollWidth > d.clientWidth)
      .map(d => d.querySelector('th').textContent),
    marks: cells,
    plots: [...document.querySelectorAll('img.plot')].map(img => ({id: img.id, right: img.getBoundingClientRect().right,
      top: img.getBoundingClientRect().top + window.scrollY, left: img.getBoundingClientRect().left,
      width: img.getBoundingClientRect().width, height: img.getBoundingClientRect().height,
      loaded: img.complete && img.naturalWidth > 0})),
    pageHeight: document.documentElement.scrollHeight,
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


def run_chromium(page: Path, profile: Path, width: int, *action: str, height: int = HEIGHT) -> str:
    """One headless Chromium run on a file page at width x height, with a fresh profile; its stdout."""
    done = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={profile}", f"--window-size={width},{height}", "--hide-scrollbars",
                           *action, page.resolve().as_uri()],
                          check=True, timeout=120, capture_output=True, text=True)
    return done.stdout


@pytest.fixture(scope="module")
def report_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """report.html of the example one-knob plan run in what-if mode, its window shortened to 10 s: the page's
    layout does not depend on how many requests its figures rest on."""
    folder = tmp_path_factory.mktemp("layout")
    plan = yaml.safe_load((ROOT / "examples" / "one-knob.yaml").read_text())
    plan.update(warmup_s=10, window_s=10)  # the warm-up as written: the baseline meets the SLOs, a ✓ is shown
    plan_path = write_plan(folder, plan)
    subprocess.run([sys.executable, "-m", "batchscope.cli", "tune", str(plan_path), "--what-if", "--results",
                    str(folder / "results")], check=True, timeout=120, capture_output=True)
    return folder / "results" / "one-knob.what-if" / "report.html"


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
    assert facts["settingsHeader"] < 60  # no knob names set vertically (they took ~190 px)
    assert facts["plots"] and all(p["loaded"] and p["right"] <= facts["innerWidth"] for p in facts["plots"])


@pytest.mark.e2e
def test_no_header_wraps_inside_a_word(facts):
    headers = facts["headers"]
    assert any(h["text"] == "KV capacity (tokens)" for h in headers)
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


def colour_count(image: Image.Image, colour: str) -> int:
    """Pixels within 3 of a hex colour on every channel."""
    want = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(np.asarray(image.convert("RGB"), dtype=int) - want) <= 3).all(axis=2).sum())


@pytest.mark.e2e
def test_the_screenshot_shows_the_legends_colours_and_no_other(report_page, facts, tmp_path):
    """The rendered page, shot whole: the change-vs-baseline plot holds the fills its legend lists and none it
    does not; the Pareto plot shows the front in red and the failing side of the TTFT bound shaded."""
    width = facts["innerWidth"]
    shot = tmp_path / "page.png"
    run_chromium(report_page, tmp_path / "profile", width, f"--screenshot={shot}", height=facts["pageHeight"])
    comparison = Comparison.model_validate_json((report_page.parent / "comparison.json").read_text())
    used = {category(v.metric(key)) for v in comparison.variations for key in BAR_METRICS}
    plots = {p["id"]: p for p in facts["plots"]}
    with Image.open(shot) as page:
        def crop(plot_id: str) -> Image.Image:
            p = plots[f"plot-{plot_id}"]
            return page.crop((round(p["left"]) + 2, round(p["top"]) + 2, round(p["left"] + p["width"]) - 2,
                              round(p["top"] + p["height"]) - 2))

        deltas, pareto = crop("deltas"), crop("pareto")
    for kind in ("significant", "indicative", "not significant"):
        found = colour_count(deltas, EVIDENCE_COLOURS[kind])
        assert (found > 200) == (kind in used), (kind, found, used)  # drawn exactly when the legend lists it
    assert colour_count(pareto, FRONT) > 100 and colour_count(pareto, FAILING_SIDE) > 1000


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
    """The point labels of a scatter plot: each starts with its setting's name (a failing one adds why)."""
    return [t for t in figure.axes[0].texts if isinstance(t, Annotation) and t.get_text().split(" (")[0] in names]


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
    # every setting named once, on its own label, however close the points
    assert sorted(label.get_text().split(" (")[0] for label in found) == sorted(names)
    boxes = [label.get_window_extent(renderer) for label in found]
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), (a, b)
    axes_box = figure.axes[0].get_window_extent()
    assert all(axes_box.x0 <= b.x0 and b.x1 <= axes_box.x1 and axes_box.y0 <= b.y0 and b.y1 <= axes_box.y1
               for b in boxes)
    points = [tuple(figure.axes[0].transData.transform(label.xy)) for label in found]
    for label, box, own in zip(found, boxes, points, strict=True):  # nearer its own point than any other
        if any(distance(Bbox.from_extents(*own, *own), other) < 2 * MARKER_PX for other in points if other != own):
            continue  # markers on one spot: the label's leader line says which is its point
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


@pytest.fixture(scope="module")
def tradeoff() -> Comparison:
    """Two settings on the front, one dominated by the baseline, one past the TTFT bound (1 s)."""
    runs = [make_run(ttft=0.5, tpot=0.020),
            make_run("worse", ttft=0.6, tpot=0.025, params={"max_num_seqs": 64}),
            make_run("fast-ttft", ttft=0.4, tpot=0.030, params={"max_num_batched_tokens": 8192}),
            make_run("slow", ttft=2.0, tpot=0.010, params={"max_num_seqs": 8})]
    return compare(runs, Slos(ttft_p99_s=1.0, tpot_p99_s=0.1), resamples=300)


def test_only_non_dominated_points_are_the_front_and_a_failing_one_is_labelled_on_its_side(tradeoff):
    assert tradeoff.verdicts.pareto_ttft_tpot == ["baseline", "fast-ttft", "slow"]
    figure = pareto_figure(tradeoff)
    figure.canvas.draw()
    ax = figure.axes[0]
    fills = {s.setting: tuple(col.get_facecolor()[0]) for s, col in zip(tradeoff.settings, ax.collections[:4],
                                                                        strict=True)}
    red = fills["baseline"]
    assert fills["fast-ttft"] == fills["slow"] == red and fills["worse"] != red  # dominated: hollow
    found = {label.get_text(): label for label in labels(figure, {s.setting for s in tradeoff.settings})}
    assert set(found) == {"baseline", "worse", "fast-ttft", "slow (fails TTFT)"}
    slo_x = ax.transData.transform((1000, 0))[0]
    assert found["slow (fails TTFT)"].get_window_extent().x0 > slo_x  # on the failing side of the dashed line
    assert all(found[n].get_window_extent().x1 < slo_x for n in ("baseline", "worse", "fast-ttft"))
    # the TPOT axis fits the data (10-30 ms); the 100 ms bound is named in the legend, not drawn
    assert ax.get_ylim()[1] < 100
    assert any("above the plot, every point meets it" in t.get_text() for t in ax.get_legend().get_texts())


def test_a_signal_at_zero_in_every_setting_is_left_out(close):
    titles = [ax.get_title() for ax in signals_figure(close).axes]
    assert "errors" not in titles and "preemptions" in titles  # close: no errors anywhere, gmu-0.25 preempts


def pixel(image: Image.Image, figure: Figure, x: float, y: float) -> tuple[int, ...]:
    """The PNG's colour at a display point of the figure (saved at its own dpi, not cropped)."""
    return image.getpixel((round(x), round(image.height - y)))[:3]


def test_each_legend_swatch_has_the_colour_of_the_bars_it_describes(crowded, tmp_path):
    figure = deltas_figure(crowded)
    figure.savefig(tmp_path / "deltas.png", dpi=figure.dpi)
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    legend = figure.legends[0]
    kinds = {words: f"legend-{kind}" for kind, words in EVIDENCE_WORDS.items()}
    swatches = {kinds[text.get_text()]: patch for text, patch in zip(legend.get_texts(), legend.legend_handles,
                                                                     strict=True) if text.get_text() in kinds}
    bars_by_kind: dict[str, list[Rectangle]] = {}
    for ax, key in zip(figure.axes, BAR_METRICS, strict=True):
        for rect, v in zip(bars(ax), crowded.variations, strict=True):
            bars_by_kind.setdefault(f"legend-{category(v.metric(key))}", []).append(rect)
    assert set(bars_by_kind) == set(swatches)  # every kind drawn is in the legend, and nothing else
    with Image.open(tmp_path / "deltas.png") as image:
        for gid, patch in swatches.items():
            box = patch.get_window_extent(renderer)
            swatch = pixel(image, figure, (box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2)
            for rect in bars_by_kind[gid]:
                box = rect.get_window_extent(renderer)
                clipped = box.intersection(box, rect.axes.get_window_extent(renderer))
                if clipped is None or clipped.height < 6 or rect.get_hatch():
                    continue  # too thin (or hatched) to sample its fill
                # a quarter across: clear of the CI whisker at the centre
                inside = pixel(image, figure, clipped.x0 + clipped.width / 4, (clipped.y0 + clipped.y1) / 2)
                assert inside == swatch, (gid, inside, swatch)
