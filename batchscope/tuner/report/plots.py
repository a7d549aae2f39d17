"""The report's plots, drawn with matplotlib's Agg backend and embedded in the HTML page as base64 PNG.

PLOTS lists them in page order: (element id, caption, function of the Comparison returning the figure, or None when
it would be empty). One colour language (EVIDENCE_COLOURS), with a legend on every figure: dark grey is the
baseline, a variation's fill says what its change vs the baseline shows. Readability rules: a panel whose values are
all zero is left out; a bar far beyond the others in its panel is clipped at the axis and labelled with its value;
scatter axes fit the data (log when it spans a decade), an SLO line is drawn when it lies near the data and its
failing side shaded; each point has its own label, where it overlaps no other label or point and stays on its
point's side of every SLO line (measured with the renderer), joined to it by a thin line when moved away.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Callable

import matplotlib

matplotlib.use("Agg")  # no display: render to PNG only (must precede pyplot's import)
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.text import Annotation  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402
from matplotlib.transforms import Bbox, blended_transform_factory  # noqa: E402

from batchscope.tuner.compare import METRIC_BY_KEY, Comparison, MetricDelta, SettingSummary  # noqa: E402
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
# A point's half-size on screen, px; a label farther from its point gets a line; the cost of a label as near
# another point as its own (an overlap of this many px² weighs the same)
MARKER_PX, LEADER_PX, AMBIGUOUS_PX2 = 7.0, 14.0, 100.0
# Behind a label: lines (the front, an SLO bound) pass under it, not through its letters
LABEL_BOX = {"boxstyle": "round,pad=0.1", "facecolor": "white", "alpha": 0.85, "edgecolor": "none"}
# Where a point's label may go, in points from the point, tried nearest first
LABEL_OFFSETS = tuple((round(r * dx), round(r * dy)) for r in (7, 16, 28, 42, 60)
                      for dx, dy in ((1, 0), (-1, 0), (1, 0.6), (1, -0.9), (-1, 0.6), (-1, -0.9), (0, 1.2), (0, -1.5)))
# A scatter axis is logarithmic when its data span this factor or more; an SLO bound is drawn when showing it keeps
# at least SLO_SHARE of the axis for the data (else the legend says where it lies)
LOG_SPAN, SLO_SHARE = 10.0, 0.5

BASE_COLOUR, FRONT, FAILING_SIDE = "#555555", "#d62728", "#fbe3e1"
# The colour language: a bar's or point's fill by what it is (the baseline) or what its change vs the baseline
# shows (tuner.compare's evidence); "variation" is a value with no interval to judge it by
EVIDENCE_COLOURS = {"baseline": BASE_COLOUR, "significant": "#1f77b4", "indicative": "#9ecae1",
                    "not significant": "#d9d9d9", "variation": "#ffffff"}
EVIDENCE_WORDS = {"baseline": "baseline", "significant": "significant (≥3 runs a side)",
                  "indicative": "indicative (CI excludes 0, <3 runs)", "not significant": "not significant (CI has 0)",
                  "variation": "no interval"}
EDGE = "#333333"  # every bar and point is outlined, so a white fill still shows


def png(figure: Figure) -> str:
    """The figure as base64 PNG (and closed: Agg figures otherwise accumulate)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def category(m: MetricDelta | None) -> str:
    """A variation's colour category for one metric (EVIDENCE_COLOURS): its evidence, 'variation' without one."""
    if m is None or m.evidence == "n/a":
        return "variation"
    return "not significant" if m.evidence == "no spread" else m.evidence


def evidence_legend(figure: Figure, used: set[str], extra: tuple[Patch, ...] = ()) -> None:
    """The figure's legend of the colour categories it uses (in EVIDENCE_COLOURS' order) across its top, and the
    panels laid out below it."""
    handles = [Patch(facecolor=EVIDENCE_COLOURS[k], edgecolor=EDGE, label=EVIDENCE_WORDS[k], gid=f"legend-{k}")
               for k in EVIDENCE_COLOURS if k in used]
    handles += list(extra)
    if not handles:
        figure.tight_layout()
        return
    columns = min(len(handles), max(2, int(figure.get_figwidth() // 2.6)))
    figure.legend(handles=handles, loc="upper center", ncol=columns, fontsize=8, frameon=False,
                  bbox_to_anchor=(0.5, 1.0))
    rows = -(-len(handles) // columns)
    figure.tight_layout(rect=(0, 0, 1, 1 - (0.1 + 0.2 * rows) / figure.get_figheight()))


def finished(c: Comparison) -> list[SettingSummary]:
    return [s for s in c.settings if s.runs_ok]


def deltas_figure(c: Comparison) -> Figure:
    """One panel per metric: each variation's change vs the baseline, %, with the 95% CI as error bars, filled by
    what the change shows."""
    rows = len(BAR_METRICS) // 2
    figure, axes = plt.subplots(rows, 2, figsize=(11, 2.5 * rows), squeeze=False)
    # settings without a finished run have nothing to draw (they are listed under failed runs)
    drawn = [v for v in c.variations if c.setting(v.setting).runs_ok]
    names = [v.setting for v in drawn]
    base_values = c.setting(BASELINE).values if any(s.setting == BASELINE for s in c.settings) else {}
    used: set[str] = set()
    clipped = False
    for ax, key in zip(axes.flat, BAR_METRICS, strict=True):
        metric = METRIC_BY_KEY[key]
        if names:
            deltas = [v.metric(key) for v in drawn]
            used.update(category(m) for m in deltas)
            clipped |= delta_bars(ax, names, deltas)
        else:
            ax.text(0.5, 0.5, "no variations", ha="center", va="center", transform=ax.transAxes)
        ax.axhline(0, color=BASE_COLOUR, linewidth=0.8)
        ax.set_title(f"{metric.label} (baseline {shown(base_values.get(key), metric.unit)} "
                     f"{display_unit(metric.unit)})", fontsize=10)
        ax.set_ylabel("change vs baseline (%)", fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
    hatch = (Patch(facecolor="white", edgecolor=EDGE, hatch="//", label="off scale: value printed"),) if clipped \
        else ()
    evidence_legend(figure, used, hatch)
    return figure


def delta_bars(ax: Axes, names: list[str], deltas: list[MetricDelta]) -> bool:
    """One panel's bars: relative change in %, CI whiskers; bars far beyond the rest clipped and labelled (True
    when any was)."""
    heights = [(m.relative or 0.0) * 100 for m in deltas]
    spans = [ci_span(m) or (h, h) for m, h in zip(deltas, heights, strict=True)]
    low = [h - lo for h, (lo, _) in zip(heights, spans, strict=True)]
    high = [hi - h for h, (_, hi) in zip(heights, spans, strict=True)]
    colours = [EVIDENCE_COLOURS[category(m)] for m in deltas]
    rects = ax.bar(names, heights, yerr=[low, high], color=colours, edgecolor=EDGE, linewidth=0.6, capsize=4,
                   ecolor="black")
    axis = clipped_axis(heights, spans)
    if axis is None:
        return False
    ax.set_ylim(*axis)
    clipped = [i for i, h in enumerate(heights) if not axis[0] <= h <= axis[1]]
    edge = blended_transform_factory(ax.transData, ax.transAxes)  # x at the bar, y at the axis' edge
    for i in clipped:
        rects[i].set_hatch("//")
        up = heights[i] > 0
        ax.text(i, 0.96 if up else 0.04, f"{percent(deltas[i].relative)} {'↑' if up else '↓'}", transform=edge,
                ha="center", va="top" if up else "bottom", fontsize=8, fontweight="bold",
                bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": BASE_COLOUR})
    return bool(clipped)


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


def setting_category(c: Comparison, setting: str, key: str | None) -> str:
    """A per-setting value's colour category: the baseline, else the evidence of the metric's delta (None: a
    signal with no delta, 'variation')."""
    if setting == BASELINE:
        return "baseline"
    return category(c.variation(setting).metric(key) if key else None)


def setting_bars(ax: Axes, names: list[str], values: list[float | None], categories: list[str], title: str,
                 unit: str) -> None:
    """One panel of a value per finished setting; a setting without the value is marked n/a, not drawn as 0."""
    heights = [0.0 if v is None else v for v in values]
    ax.bar(names, heights, color=[EVIDENCE_COLOURS[k] for k in categories], edgecolor=EDGE, linewidth=0.6)
    ax.set_ylim(bottom=0, top=max([*heights, 1]) * 1.1)
    for i, value in enumerate(values):
        if value is None:
            ax.text(i, 0, "n/a", ha="center", va="bottom", fontsize=8, color=BASE_COLOUR)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(unit)  # the title names the quantity
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)


# One panel of per-setting values: (title, display unit, the values, the metric key whose delta colours them)
Panel = tuple[str, str, list[float | None], str | None]


def panels_figure(c: Comparison, panels: list[Panel], width_per_panel: float) -> Figure | None:
    """Per-setting bar panels, the all-zero (or all-missing) ones left out; None when none is left."""
    kept = [p for p in panels if any(v for v in p[2])]
    if not kept:
        return None
    names = [s.setting for s in finished(c)]
    figure, axes = plt.subplots(1, len(kept), figsize=(max(4.5, width_per_panel * len(kept)), 3.4), squeeze=False)
    used: set[str] = set()
    for ax, (title, unit, values, key) in zip(axes.flat, kept, strict=True):
        categories = [setting_category(c, n, key) for n in names]
        used.update(categories)
        setting_bars(ax, names, values, categories, title, unit)
    evidence_legend(figure, used)
    return figure


def signals_figure(c: Comparison) -> Figure | None:
    """Server-side signals per setting (values, not deltas): preemptions, max waiting, KV peak, errors."""
    panels: list[Panel] = []
    for key in SIGNAL_METRICS:
        metric = METRIC_BY_KEY[key]
        scale = 100 if metric.unit == "ratio" else 1
        values = [None if (v := s.values.get(key)) is None else v * scale for s in finished(c)]
        panels.append((metric.label, display_unit(metric.unit), values, key))
    return panels_figure(c, panels, 3.3)


def scheduler_figure(c: Comparison) -> Figure | None:
    """The scheduler's side per setting: mean tokens per engine step and mean time requests waited in the queue
    (vLLM's iteration_tokens_total and request_queue_time_seconds), the signals the explanations cite."""
    panels: list[Panel] = [(title, unit, [None if (v := s.signals.get(key)) is None else v * scale
                                          for s in finished(c)], None)
                           for key, title, unit, scale in SCHEDULER_SIGNALS]
    return panels_figure(c, panels, 4.5)


def fit_axis(ax: Axes, axis: str, values: list[float], bound: float | None) -> bool:
    """Fit one scatter axis to the data (log when it spans LOG_SPAN, a margin for labels either side), stretched to
    an SLO bound only when the data keep SLO_SHARE of it; True when the bound is on the axis."""
    lo, hi = min(values), max(values)
    log = lo > 0 and hi / lo >= LOG_SPAN
    scale: Callable[[float], float] = math.log10 if log else (lambda v: v)
    if log:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
        ticks = ax.xaxis if axis == "x" else ax.yaxis
        ticks.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))  # 100, 200, 500, 1,000: read without powers
        ticks.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
        ticks.set_minor_formatter(NullFormatter())
    shown_bound = bound is not None and (not log or bound > 0) and (
        hi == lo or (scale(hi) - scale(lo)) / (scale(max(hi, bound)) - scale(min(lo, bound))) >= SLO_SHARE)
    if shown_bound and bound is not None:
        lo, hi = min(lo, bound), max(hi, bound)
    low, high = scale(lo), scale(hi)
    pad = (high - low) * 0.15 or (0.3 if log else max(abs(low) * 0.2, 1.0))
    limits = (low - pad, high + pad)
    if log:
        limits = (10 ** limits[0], 10 ** limits[1])
    elif lo >= 0:
        limits = (max(limits[0], -pad * 0.5), limits[1])  # a count or latency axis barely dips below 0
    (ax.set_xlim if axis == "x" else ax.set_ylim)(*limits)
    return shown_bound


def slo_failures(c: Comparison, ttft: float, tpot: float) -> list[str]:
    """The SLO bounds a point is past ('TTFT', 'TPOT')."""
    return [name for name, value, bound in (("TTFT", ttft, c.slos.ttft_p99_s), ("TPOT", tpot, c.slos.tpot_p99_s))
            if bound is not None and value > bound]


def slo_line(ax: Axes, axis: str, bound_ms: float, on_axis: bool, lows: bool) -> Line2D:
    """An SLO bound: a dashed line with its failing side shaded when on the axis, else a legend entry saying where
    it lies (lows: every point is below it)."""
    name = "TTFT" if axis == "x" else "TPOT"
    if on_axis:
        line = ax.axvline if axis == "x" else ax.axhline
        span = ax.axvspan if axis == "x" else ax.axhspan
        far = ax.get_xlim()[1] if axis == "x" else ax.get_ylim()[1]
        span(bound_ms, far, color=FAILING_SIDE, zorder=0)
        line(bound_ms, color=BASE_COLOUR, linestyle="--", linewidth=1)
        return Line2D([], [], color=BASE_COLOUR, linestyle="--",
                      label=f"{name} p99 SLO {bound_ms:,.0f} ms (shaded: fails)")
    where = ("right of" if axis == "x" else "above") if lows else ("left of" if axis == "x" else "below")
    verdict = "every point meets it" if lows else "every point fails it"
    return Line2D([], [], color="none", label=f"{name} p99 SLO {bound_ms:,.0f} ms: {where} the plot, {verdict}")


def pareto_figure(c: Comparison) -> Figure:
    """TTFT p99 against TPOT p99 per setting: the Pareto front (no other setting lower on both) filled red and
    joined as a staircase, the rest hollow; a setting past an SLO drawn as ✕ and labelled so."""
    figure, ax = plt.subplots(figsize=(8, 5.2))
    points = {s.setting: (ttft * 1000, tpot * 1000) for s in c.settings
              if (ttft := s.values.get("ttft_p99")) is not None and (tpot := s.values.get("tpot_p99")) is not None}
    if not points:
        ax.text(0.5, 0.5, "no finished runs", ha="center", va="center", transform=ax.transAxes)
        return figure
    front = [n for n in c.verdicts.pareto_ttft_tpot if n in points]
    failing = {n: slo_failures(c, x / 1000, y / 1000) for n, (x, y) in points.items()}
    handles: list[Line2D] = []
    walls: list[tuple[str, float]] = []
    for axis, bound_s, index in (("x", c.slos.ttft_p99_s, 0), ("y", c.slos.tpot_p99_s, 1)):
        values = [p[index] for p in points.values()]
        bound = None if bound_s is None else bound_s * 1000
        on_axis = fit_axis(ax, axis, values, bound)
        if bound is not None:
            handles.append(slo_line(ax, axis, bound, on_axis, max(values) <= bound))
            if on_axis:
                walls.append((axis, bound))
    for name, (x, y) in points.items():
        ax.scatter(x, y, s=90 if failing[name] else 70, marker="X" if failing[name] else "o",
                   facecolor=FRONT if name in front else "white", edgecolor=EDGE, linewidth=1, zorder=3)
    if len(front) > 1:
        xs, ys = zip(*sorted(points[n] for n in front), strict=True)
        ax.step(xs, ys, where="post", color=FRONT, linewidth=1, alpha=0.7, zorder=2)
    handles = [*scatter_handles(bool(front), len(front) < len(points), any(failing.values())), *handles]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=8, frameon=False)
    ax.set_xlabel(f"TTFT p99 (ms{', log scale' if ax.get_xscale() == 'log' else ''})")
    ax.set_ylabel(f"TPOT p99 (ms{', log scale' if ax.get_yscale() == 'log' else ''})")
    ax.set_title("TTFT p99 vs TPOT p99 (lower-left is better)", fontsize=11)
    ax.grid(alpha=0.3)
    figure.tight_layout()
    names = {n: n + (f" (fails {' & '.join(failing[n])})" if failing[n] else "") for n in points}
    label_points(ax, {names[n]: p for n, p in points.items()}, walls)
    return figure


def scatter_handles(front: bool, dominated: bool, failing: bool) -> list[Line2D]:
    """The Pareto plot's marker legend, the kinds it shows only."""
    out = []
    if front:
        out.append(Line2D([], [], marker="o", color=FRONT, markerfacecolor=FRONT, markeredgecolor=EDGE,
                          label="Pareto front: no setting lower on both"))
    if dominated:
        out.append(Line2D([], [], marker="o", linestyle="none", markerfacecolor="white", markeredgecolor=EDGE,
                          label="dominated: another is lower on both"))
    if failing:
        out.append(Line2D([], [], marker="X", linestyle="none", markerfacecolor="white", markeredgecolor=EDGE,
                          label="fails an SLO (its label says which)"))
    return out


def throughput_preemptions_figure(c: Comparison) -> Figure | None:
    """Completion throughput against preemptions per setting: does throughput fall where preemption rises? None
    when no setting preempted (every point on one vertical line says nothing)."""
    points = {s.setting: (x, y) for s in c.settings if (x := s.values.get("preemptions")) is not None
              and (y := s.values.get("completion_throughput_rps")) is not None}
    if not any(x for x, _ in points.values()):
        return None
    figure, ax = plt.subplots(figsize=(7.5, 4.4))
    used = set()
    for name, (x, y) in points.items():
        kind = setting_category(c, name, "completion_throughput_rps")
        used.add(kind)
        ax.scatter(x, y, s=70, color=EVIDENCE_COLOURS[kind], edgecolor=EDGE, zorder=3)
    fit_axis(ax, "x", [x for x, _ in points.values()], None)
    fit_axis(ax, "y", [y for _, y in points.values()], None)
    ax.set_xlabel(f"preemptions in the window (count{', log scale' if ax.get_xscale() == 'log' else ''})")
    ax.set_ylabel("completion throughput (req/s)")
    ax.set_title("Throughput vs preemptions (fill: the throughput change's evidence)", fontsize=11)
    ax.grid(alpha=0.3)
    handles = [Patch(facecolor=EVIDENCE_COLOURS[k], edgecolor=EDGE, label=EVIDENCE_WORDS[k], gid=f"legend-{k}")
               for k in EVIDENCE_COLOURS if k in used]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3, fontsize=8, frameon=False)
    figure.tight_layout()
    label_points(ax, points, [])
    return figure


def label_points(ax: Axes, points: dict[str, tuple[float, float]], walls: list[tuple[str, float]]) -> None:
    """Name each point at the nearest spot in LABEL_OFFSETS where its label overlaps no other label or point,
    stays inside the axes and on its point's side of every wall (an SLO line: ('x' or 'y', data value)), and is
    nearer its own point than any other (else the spot that breaks these least). Call last: it fixes the axes'
    limits the placement was measured against."""
    ax.set_xlim(ax.get_xlim())
    ax.set_ylim(ax.get_ylim())
    renderer = ax.figure.canvas.get_renderer()  # type: ignore[attr-defined]
    frame = ax.get_window_extent(renderer)
    centres = {name: tuple(ax.transData.transform(point)) for name, point in points.items()}
    screen_walls = [(axis, ax.transData.transform((value, value))[0 if axis == "x" else 1]) for axis, value in walls]
    taken = [marker_box(centre) for centre in centres.values()]
    for name, point in points.items():
        centre = centres[name]
        others = [c for n, c in centres.items() if n != name]
        placed: list[tuple[float, Annotation]] = []
        for dx, dy in LABEL_OFFSETS:
            label = ax.annotate(name, point, textcoords="offset points", xytext=(dx, dy), fontsize=9,
                                ha="left" if dx > 0 else "right" if dx < 0 else "center",
                                va="bottom" if dy > 0 else "top" if dy < 0 else "center", bbox=LABEL_BOX, zorder=4)
            box = label.get_window_extent(renderer)
            cost = label_cost(box, centre, others, taken, frame) \
                + frame.width * frame.height * crosses(box, centre, screen_walls)
            placed.append((cost, label))
            if cost == 0:
                break
        chosen = min(placed, key=lambda entry: entry[0])[1]
        for _, label in placed:
            if label is not chosen:
                label.remove()
        box = chosen.get_window_extent(renderer)
        taken.append(box)
        leader_to(ax, point, box)


def crosses(box: Bbox, centre: tuple[float, float], walls: list[tuple[str, float]]) -> bool:
    """Whether a label box reaches across a wall (screen x or y) from its point's side."""
    for axis, at in walls:
        low, high, own = (box.x0, box.x1, centre[0]) if axis == "x" else (box.y0, box.y1, centre[1])
        if (own <= at < high) or (low < at <= own):
            return True
    return False


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


PLOTS: tuple[tuple[str, str, Callable[[Comparison], Figure | None]], ...] = (
    ("deltas", "Change vs baseline per metric, with 95% CI (a bar far beyond the rest is clipped, its value "
     "printed at the edge)", deltas_figure),
    ("signals", "Server signals per setting (a signal at zero in every setting is left out)", signals_figure),
    ("scheduler", "Tokens per engine step and queue time per setting", scheduler_figure),
    ("pareto", "TTFT p99 vs TPOT p99 with the Pareto front and the SLOs", pareto_figure),
    ("throughput-preemptions", "Completion throughput vs preemptions", throughput_preemptions_figure),
)
