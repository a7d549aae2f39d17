"""The report's plots, drawn with matplotlib's Agg backend and embedded in the HTML page as base64 PNG.

PLOTS lists them in page order: (element id, caption, function of the Comparison returning the figure; `png`
turns it into base64). Readability rules: a bar far beyond the others in its panel is clipped at the axis and
labelled with its value, so the others keep their height; point labels are placed where they overlap no other
label or point (measured with the renderer), joined to their point by a thin line when moved away from it.
"""

from __future__ import annotations

import base64
import io

import matplotlib

matplotlib.use("Agg")  # no display: render to PNG only (must precede pyplot's import)
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.text import Annotation  # noqa: E402
from matplotlib.transforms import Bbox, blended_transform_factory  # noqa: E402

from batchscope.tuner.compare import (  # noqa: E402
    METRIC_BY_KEY,  # noqa: E402
    Comparison,
    MetricDelta,
)
from batchscope.tuner.plan import BASELINE  # noqa: E402
from batchscope.tuner.report.text import display_unit, percent, shown  # noqa: E402

# Metrics drawn as change-vs-baseline bars with their CI (the ones every run has a per-request or count basis for)
BAR_METRICS = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "itl_p50", "itl_p99", "e2e_p50", "e2e_p99",
               "completion_throughput_rps", "output_tokens_per_s")
SIGNAL_METRICS = ("preemptions", "max_waiting", "kv_usage_peak", "errors")
# The scheduler's evidence the explanations cite, per setting: (ServerSignals field, title, display unit, scale)
SCHEDULER_SIGNALS = (("tokens_per_step_mean", "tokens per step (mean)", "tokens", 1.0),
                     ("queue_time_mean_s", "queue time (mean)", "ms", 1000.0))
# A bar more than OUTLIER_RATIO times as tall as the tallest of the rest is clipped at HEADROOM times that one (or
# where the rest's CI whiskers reach, if further), when that saves MIN_GAIN of the axis or more; at most half a
# panel's bars are clipped; the axis spans at least MIN_SPAN_PCT.
OUTLIER_RATIO, HEADROOM, MIN_SPAN_PCT, MIN_GAIN = 5.0, 1.25, 2.0, 0.5
# Where a point's label may go, in points from the point, tried nearest first
# A point's half-size on screen, px; a label farther from its point gets a line; the cost of a label as near
# another point as its own (an overlap of this many px² weighs the same)
MARKER_PX, LEADER_PX, AMBIGUOUS_PX2 = 6.0, 14.0, 100.0
# Behind a label: lines (the front, an SLO bound) pass under it, not through its letters
LABEL_BOX = {"boxstyle": "round,pad=0.1", "facecolor": "white", "alpha": 0.8, "edgecolor": "none"}
LABEL_OFFSETS = tuple((round(r * dx), round(r * dy)) for r in (7, 16, 28, 42)
                      for dx, dy in ((1, 0), (-1, 0), (1, 0.6), (1, -0.9), (-1, 0.6), (-1, -0.9), (0, 1.2), (0, -1.5)))

SIGNIFICANT, NOT_SIGNIFICANT, BASE_COLOUR, FRONT = "#1f77b4", "#b0b0b0", "#555555", "#d62728"


def png(figure: Figure) -> str:
    """The figure as base64 PNG (and closed: Agg figures otherwise accumulate)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def deltas_figure(c: Comparison) -> Figure:
    """One panel per metric: each variation's change vs the baseline, %, with the 95% CI as error bars."""
    figure, axes = plt.subplots(len(BAR_METRICS) // 2, 2, figsize=(11, 2.6 * (len(BAR_METRICS) // 2)),
                                squeeze=False)
    # settings without a finished run have nothing to draw (they are listed under failed runs)
    drawn = [v for v in c.variations if c.setting(v.setting).runs_ok]
    names = [v.setting for v in drawn]
    base_values = c.setting(BASELINE).values if any(s.setting == BASELINE for s in c.settings) else {}
    for ax, key in zip(axes.flat, BAR_METRICS, strict=True):
        metric = METRIC_BY_KEY[key]
        if names:
            delta_bars(ax, names, [v.metric(key) for v in drawn])
        else:
            ax.text(0.5, 0.5, "no variations", ha="center", va="center", transform=ax.transAxes)
        ax.axhline(0, color=BASE_COLOUR, linewidth=0.8)
        ax.set_title(f"{metric.label} (baseline {shown(base_values.get(key), metric.unit)} "
                     f"{display_unit(metric.unit)})", fontsize=10)
        ax.set_ylabel("change vs baseline (%)")
        ax.set_xlabel("setting")
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    figure.suptitle("Change vs baseline with 95% CI (blue: significant, grey: not; hatched: off scale)", fontsize=11)
    figure.tight_layout()
    return figure


def delta_bars(ax: Axes, names: list[str], deltas: list[MetricDelta]) -> None:
    """One panel's bars: relative change in %, CI whiskers; bars far beyond the rest clipped and labelled."""
    heights = [(m.relative or 0.0) * 100 for m in deltas]
    spans = [ci_span(m) or (h, h) for m, h in zip(deltas, heights, strict=True)]
    low = [h - lo for h, (lo, _) in zip(heights, spans, strict=True)]
    high = [hi - h for h, (_, hi) in zip(heights, spans, strict=True)]
    colours = [SIGNIFICANT if m.significant else NOT_SIGNIFICANT for m in deltas]
    rects = ax.bar(names, heights, yerr=[low, high], color=colours, capsize=4, ecolor="black")
    axis = clipped_axis(heights, spans)
    if axis is None:
        return
    ax.set_ylim(*axis)
    clipped = [i for i, h in enumerate(heights) if not axis[0] <= h <= axis[1]]
    edge = blended_transform_factory(ax.transData, ax.transAxes)  # x at the bar, y at the axis' edge
    for i in clipped:
        rects[i].set_hatch("//")
        up = heights[i] > 0
        ax.text(i, 0.96 if up else 0.04, f"{percent(deltas[i].relative)} {'↑' if up else '↓'}", transform=edge,
                ha="center", va="top" if up else "bottom", fontsize=8, fontweight="bold",
                bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": BASE_COLOUR})


def ci_span(m: MetricDelta) -> tuple[float, float] | None:
    """The CI of the delta as % of the baseline (the bar's whiskers), or None without one."""
    if m.ci_low is None or m.ci_high is None or not m.baseline:
        return None
    rel = (m.relative or 0.0) * 100
    return min(m.ci_low / m.baseline * 100, rel), max(m.ci_high / m.baseline * 100, rel)


def clipped_axis(heights: list[float], spans: list[tuple[float, float]]) -> tuple[float, float] | None:
    """A panel's y range with its outlier bars clipped (see OUTLIER_RATIO), or None when none stands out so far,
    or clipping would not save at least MIN_GAIN of the axis (the rest's whiskers reach almost as far)."""
    limit = clip_limit([abs(h) for h in heights])
    if limit is None:
        return None
    outliers = [i for i, h in enumerate(heights) if abs(h) > limit]
    kept = [bound for i, span in enumerate(spans) if i not in outliers for bound in span]
    bottom = min(0.0, *kept, *(-limit for i in outliers if heights[i] < 0))
    top = max(0.0, *kept, *(limit for i in outliers if heights[i] > 0))
    full = max(0.0, *(hi for _, hi in spans)) - min(0.0, *(lo for lo, _ in spans))
    if top - bottom > (1 - MIN_GAIN) * full:
        return None
    pad = (top - bottom) * 0.08
    return bottom - pad, top + pad


def clip_limit(heights: list[float]) -> float | None:
    """The bar size past which a panel's bars are outliers, or None when none stands out (see OUTLIER_RATIO).

    ``heights`` are the bars' sizes (absolute). The cut is taken at the widest gap of more than OUTLIER_RATIO
    between neighbours in size, keeping at least half the bars on scale."""
    ordered = sorted(heights)
    best: tuple[float, float] | None = None  # (gap ratio, limit)
    for kept in range((len(ordered) + 1) // 2, len(ordered)):
        reach = max(ordered[kept - 1], MIN_SPAN_PCT / HEADROOM)
        ratio = ordered[kept] / reach
        if ratio > OUTLIER_RATIO and (best is None or ratio > best[0]):
            best = (ratio, reach * HEADROOM)
    return None if best is None else best[1]


def setting_bars(ax: Axes, c: Comparison, values: list[float | None], title: str, unit: str) -> None:
    """One panel of a value per finished setting; a setting without the value is marked n/a, not drawn as 0."""
    names = [s.setting for s in c.settings if s.runs_ok]
    heights = [0.0 if v is None else v for v in values]
    ax.bar(names, heights, color=[BASE_COLOUR if n == BASELINE else SIGNIFICANT for n in names])
    ax.set_ylim(bottom=0, top=max([*heights, 1]) * 1.1)  # all-zero bars: an axis from 0, not ±0.04
    for i, value in enumerate(values):
        if value is None:
            ax.text(i, 0, "n/a", ha="center", va="bottom", fontsize=8, color=BASE_COLOUR)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(unit)  # the title names the quantity
    ax.set_xlabel("setting")
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)


def signals_figure(c: Comparison) -> Figure:
    """Server-side signals per setting (values, not deltas): preemptions, max waiting, KV peak, errors."""
    figure, axes = plt.subplots(1, len(SIGNAL_METRICS), figsize=(13, 3.4), squeeze=False)
    settings = [s for s in c.settings if s.runs_ok]
    for ax, key in zip(axes.flat, SIGNAL_METRICS, strict=True):
        metric = METRIC_BY_KEY[key]
        scale = 100 if metric.unit == "ratio" else 1
        values = [None if (v := s.values.get(key)) is None else v * scale for s in settings]
        setting_bars(ax, c, values, metric.label, display_unit(metric.unit))
    figure.tight_layout()
    return figure


def scheduler_figure(c: Comparison) -> Figure:
    """The scheduler's side per setting: mean tokens per engine step and mean time requests waited in the queue
    (vLLM's iteration_tokens_total and request_queue_time_seconds), the signals the explanations cite."""
    figure, axes = plt.subplots(1, len(SCHEDULER_SIGNALS), figsize=(9, 3.4), squeeze=False)
    settings = [s for s in c.settings if s.runs_ok]
    for ax, (key, title, unit, scale) in zip(axes.flat, SCHEDULER_SIGNALS, strict=True):
        values = [None if (v := s.signals.get(key)) is None else v * scale for s in settings]
        setting_bars(ax, c, values, title, unit)
    figure.tight_layout()
    return figure


def pareto_figure(c: Comparison) -> Figure:
    """TTFT p99 against TPOT p99 per setting, the Pareto front joined and highlighted, SLO bounds dashed."""
    figure, ax = plt.subplots(figsize=(7, 5))
    points = {s.setting: (ttft * 1000, tpot * 1000) for s in c.settings
              if (ttft := s.values.get("ttft_p99")) is not None and (tpot := s.values.get("tpot_p99")) is not None}
    front = [n for n in c.verdicts.pareto_ttft_tpot if n in points]
    for name, (x, y) in points.items():
        on_front = name in front
        ax.scatter(x, y, s=80 if on_front else 40, color=FRONT if on_front else NOT_SIGNIFICANT,
                   edgecolor="black", zorder=3)
    if front:
        xs, ys = zip(*sorted(points[n] for n in front), strict=True)
        ax.plot(xs, ys, color=FRONT, linewidth=1.5, label="Pareto front", zorder=2)
    if c.slos.ttft_p99_s:
        ax.axvline(c.slos.ttft_p99_s * 1000, color=BASE_COLOUR, linestyle="--", label="SLO TTFT p99")
    if c.slos.tpot_p99_s:
        ax.axhline(c.slos.tpot_p99_s * 1000, color=BASE_COLOUR, linestyle=":", label="SLO TPOT p99")
    if not points:
        ax.text(0.5, 0.5, "no finished runs", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("TTFT p99 (ms)")
    ax.set_ylabel("TPOT p99 (ms)")
    ax.set_title("TTFT p99 vs TPOT p99 (lower-left is better)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)  # beside the axes: clear of the labels
    ax.grid(alpha=0.3)
    label_points(ax, points)
    return figure


def throughput_preemptions_figure(c: Comparison) -> Figure:
    """Completion throughput against preemptions per setting: does throughput fall where preemption rises?"""
    figure, ax = plt.subplots(figsize=(7, 5))
    points = {}
    for s in c.settings:
        x, y = s.values.get("preemptions"), s.values.get("completion_throughput_rps")
        if x is None or y is None:
            continue
        points[s.setting] = (x, y)
        ax.scatter(x, y, s=60, color=BASE_COLOUR if s.setting == BASELINE else SIGNIFICANT, edgecolor="black")
    if not points:
        ax.text(0.5, 0.5, "no finished runs", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("preemptions in the window (count)")
    ax.set_ylabel("completion throughput (req/s)")
    ax.set_title("Throughput vs preemptions")
    ax.grid(alpha=0.3)
    label_points(ax, points)
    return figure


def label_points(ax: Axes, points: dict[str, tuple[float, float]]) -> None:
    """Name each point at the nearest spot in LABEL_OFFSETS where its label overlaps no other label or point,
    stays inside the axes and is nearer its own point than any other (else the spot that breaks these least);
    settings whose markers overlap on screen share one label. Call last: it fixes the axes' limits the placement
    was measured against."""
    ax.margins(0.15)  # room for labels beside the outermost points
    ax.set_xlim(ax.get_xlim())
    ax.set_ylim(ax.get_ylim())
    renderer = ax.figure.canvas.get_renderer()  # type: ignore[attr-defined]
    frame = ax.get_window_extent(renderer)
    spots: dict[tuple[float, float], list[str]] = {}  # markers that overlap on screen share one label
    for name, point in points.items():
        screen = ax.transData.transform(point)
        near = next((s for s in spots if abs(ax.transData.transform(s) - screen).max() < 2 * MARKER_PX), point)
        spots.setdefault(near, []).append(name)
    centres = [tuple(ax.transData.transform(spot)) for spot in spots]
    taken = [marker_box(centre) for centre in centres]
    for (x, y), names, centre in zip(spots, spots.values(), centres, strict=True):
        others = [c for c in centres if c != centre]
        placed: list[tuple[float, Annotation]] = []
        for dx, dy in LABEL_OFFSETS:
            label = ax.annotate(", ".join(names), (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=9,
                                ha="left" if dx > 0 else "right" if dx < 0 else "center",
                                va="bottom" if dy > 0 else "top" if dy < 0 else "center", bbox=LABEL_BOX)
            placed.append((label_cost(label.get_window_extent(renderer), centre, others, taken, frame), label))
            if placed[-1][0] == 0:
                break
        chosen = min(placed, key=lambda entry: entry[0])[1]
        for _, label in placed:
            if label is not chosen:
                label.remove()
        box = chosen.get_window_extent(renderer)
        taken.append(box)
        leader_to(ax, (x, y), box)


def label_cost(box: Bbox, centre: tuple[float, float], others: list[tuple[float, float]], taken: list[Bbox],
               frame: Bbox) -> float:
    """How badly a label box sits, px²: its overlap with what is taken, the whole frame's area if it leaves the
    axes, AMBIGUOUS_PX2 if another point is as near to it as its own."""
    outside = not (frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1)
    ambiguous = any(gap(box, other) <= gap(box, centre) for other in others)
    return (sum(overlap(box, other) for other in taken) + frame.width * frame.height * outside
            + AMBIGUOUS_PX2 * ambiguous)


def gap(box: Bbox, point: tuple[float, float]) -> float:
    """Screen distance from a point to a box (0 inside it)."""
    dx = max(box.x0 - point[0], 0.0, point[0] - box.x1)
    dy = max(box.y0 - point[1], 0.0, point[1] - box.y1)
    return float((dx * dx + dy * dy) ** 0.5)


def leader_to(ax: Axes, point: tuple[float, float], box: Bbox) -> None:
    """A thin line from a point to its label's nearest edge, when the label sits farther than LEADER_PX away."""
    px, py = ax.transData.transform(point)
    near = (min(max(px, box.x0), box.x1), min(max(py, box.y0), box.y1))
    if ((near[0] - px) ** 2 + (near[1] - py) ** 2) ** 0.5 > LEADER_PX:
        end = ax.transData.inverted().transform(near)
        ax.plot([point[0], end[0]], [point[1], end[1]], color=BASE_COLOUR, linewidth=0.6, zorder=1)


def marker_box(centre: tuple[float, float]) -> Bbox:
    """The screen box a point's marker covers (about), from its centre on screen."""
    return Bbox.from_extents(centre[0] - MARKER_PX, centre[1] - MARKER_PX, centre[0] + MARKER_PX,
                             centre[1] + MARKER_PX)


def overlap(a: Bbox, b: Bbox) -> float:
    """Area two display boxes share, px²."""
    return max(0.0, min(a.x1, b.x1) - max(a.x0, b.x0)) * max(0.0, min(a.y1, b.y1) - max(a.y0, b.y0))


PLOTS = (
    ("deltas", "Change vs baseline per metric, with 95% CI (a bar far beyond the rest is clipped, its value "
     "printed at the edge)", deltas_figure),
    ("signals", "Server signals per setting", signals_figure),
    ("scheduler", "Tokens per engine step and queue time per setting", scheduler_figure),
    ("pareto", "TTFT p99 vs TPOT p99 with the Pareto front", pareto_figure),
    ("throughput-preemptions", "Completion throughput vs preemptions", throughput_preemptions_figure),
)
