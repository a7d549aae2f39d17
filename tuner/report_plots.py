"""The report's plots, drawn with matplotlib's Agg backend and embedded in the HTML page as base64 PNG.

PLOTS lists them in page order: (element id, caption, function of the Comparison returning the PNG as base64).
"""

from __future__ import annotations

import base64
import io

import matplotlib

matplotlib.use("Agg")  # no display: render to PNG only (must precede pyplot's import)
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from tuner.comparison import Comparison  # noqa: E402
from tuner.metric_defs import METRIC_BY_KEY  # noqa: E402
from tuner.plan import BASELINE  # noqa: E402
from tuner.report_text import display_unit, shown  # noqa: E402

# Metrics drawn as change-vs-baseline bars with their CI (the ones every run has a per-request or count basis for)
BAR_METRICS = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "itl_p50", "itl_p99", "e2e_p50", "e2e_p99",
               "completion_throughput_rps", "output_tokens_per_s")
SIGNAL_METRICS = ("preemptions", "max_waiting", "kv_usage_peak", "errors")

SIGNIFICANT, NOT_SIGNIFICANT, BASE_COLOUR, FRONT = "#1f77b4", "#b0b0b0", "#555555", "#d62728"


def png(figure: Figure) -> str:
    """The figure as base64 PNG (and closed: Agg figures otherwise accumulate)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def plot_deltas(c: Comparison) -> str:
    """One panel per metric: each variation's change vs the baseline, %, with the 95% CI as error bars."""
    figure, axes = plt.subplots(len(BAR_METRICS) // 2, 2, figsize=(11, 2.6 * (len(BAR_METRICS) // 2)),
                                squeeze=False)
    # settings without a finished run have nothing to draw (they are listed under failed runs)
    drawn = [v for v in c.variations if c.setting(v.setting).runs_ok]
    names = [v.setting for v in drawn]
    base_values = c.setting(BASELINE).values if any(s.setting == BASELINE for s in c.settings) else {}
    for ax, key in zip(axes.flat, BAR_METRICS, strict=True):
        deltas = [v.metric(key) for v in drawn]
        base = base_values.get(key)
        metric = METRIC_BY_KEY[key]
        heights, low, high, colours = [], [], [], []
        for m in deltas:
            rel = (m.relative or 0.0) * 100
            heights.append(rel)
            if m.ci_low is not None and m.ci_high is not None and m.baseline:
                low.append(max(rel - m.ci_low / m.baseline * 100, 0))
                high.append(max(m.ci_high / m.baseline * 100 - rel, 0))
            else:
                low.append(0)
                high.append(0)
            colours.append(SIGNIFICANT if m.significant else NOT_SIGNIFICANT)
        if names:
            ax.bar(names, heights, yerr=[low, high], color=colours, capsize=4, ecolor="black")
        else:
            ax.text(0.5, 0.5, "no variations", ha="center", va="center", transform=ax.transAxes)
        ax.axhline(0, color=BASE_COLOUR, linewidth=0.8)
        ax.set_title(f"{metric.label} (baseline {shown(base, metric.unit)} {display_unit(metric.unit)})",
                     fontsize=10)
        ax.set_ylabel("change vs baseline (%)")
        ax.set_xlabel("setting")
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    figure.suptitle("Change vs baseline with 95% CI (blue: significant, grey: not)", fontsize=11)
    figure.tight_layout()
    return png(figure)


def plot_signals(c: Comparison) -> str:
    """Server-side signals per setting (values, not deltas): preemptions, max waiting, KV peak, errors."""
    figure, axes = plt.subplots(1, len(SIGNAL_METRICS), figsize=(13, 3.4), squeeze=False)
    settings = [s for s in c.settings if s.runs_ok]
    names = [s.setting for s in settings]
    for ax, key in zip(axes.flat, SIGNAL_METRICS, strict=True):
        metric = METRIC_BY_KEY[key]
        scale = 100 if metric.unit == "ratio" else 1
        values = [(s.values.get(key) or 0.0) * scale for s in settings]
        colours = [BASE_COLOUR if n == BASELINE else SIGNIFICANT for n in names]
        ax.bar(names, values, color=colours)
        ax.set_ylim(bottom=0, top=max([*values, 1]) * 1.1)  # all-zero bars: an axis from 0, not ±0.04
        ax.set_title(metric.label, fontsize=10)
        ax.set_ylabel(f"{metric.label} ({display_unit(metric.unit)})")
        ax.set_xlabel("setting")
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    figure.tight_layout()
    return png(figure)


def plot_pareto(c: Comparison) -> str:
    """TTFT p99 against TPOT p99 per setting, the Pareto front joined and highlighted, SLO bounds dashed."""
    figure, ax = plt.subplots(figsize=(7, 5))
    points = {s.setting: (ttft * 1000, tpot * 1000) for s in c.settings
              if (ttft := s.values.get("ttft_p99")) is not None and (tpot := s.values.get("tpot_p99")) is not None}
    front = [n for n in c.verdicts.pareto_ttft_tpot if n in points]
    for name, (x, y) in points.items():
        on_front = name in front
        ax.scatter(x, y, s=80 if on_front else 40, color=FRONT if on_front else NOT_SIGNIFICANT,
                   edgecolor="black", zorder=3)
    label_points(ax, points)
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
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    return png(figure)


def plot_throughput_preemptions(c: Comparison) -> str:
    """Completion throughput against preemptions per setting: does throughput fall where preemption rises?"""
    figure, ax = plt.subplots(figsize=(7, 5))
    points = {}
    for s in c.settings:
        x, y = s.values.get("preemptions"), s.values.get("completion_throughput_rps")
        if x is None or y is None:
            continue
        points[s.setting] = (x, y)
        ax.scatter(x, y, s=60, color=BASE_COLOUR if s.setting == BASELINE else SIGNIFICANT, edgecolor="black")
    label_points(ax, points)
    if not points:
        ax.text(0.5, 0.5, "no finished runs", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("preemptions in the window (count)")
    ax.set_ylabel("completion throughput (req/s)")
    ax.set_title("Throughput vs preemptions")
    ax.grid(alpha=0.3)
    return png(figure)


def label_points(ax: Axes, points: dict[str, tuple[float, float]]) -> None:
    """Name each point; settings that landed on the same spot share one label instead of overprinting."""
    spots: dict[tuple[float, float], list[str]] = {}
    for name, (x, y) in points.items():
        spots.setdefault((round(x, 6), round(y, 6)), []).append(name)
    for (x, y), names in spots.items():
        ax.annotate(", ".join(names), (x, y), textcoords="offset points", xytext=(6, 4), fontsize=9)


PLOTS = (
    ("deltas", "Change vs baseline per metric, with 95% CI", plot_deltas),
    ("signals", "Server signals per setting", plot_signals),
    ("pareto", "TTFT p99 vs TPOT p99 with the Pareto front", plot_pareto),
    ("throughput-preemptions", "Completion throughput vs preemptions", plot_throughput_preemptions),
)
