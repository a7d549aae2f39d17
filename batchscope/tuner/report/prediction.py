"""The report's prediction section: a plan's what-if results against its real-time ones, setting by setting.

`batchscope tune` keeps what-if results in results/<plan>.what-if/ beside the real-time results/<plan>/. When both
folders hold an ok run of the same setting, the report of either shows, per setting, the preview's figure and
the measured one (each the mean over the setting's ok repeats) and the preview's error: mean TTFT, mean TPOT and
output throughput as predicted / measured - 1, preemptions (counts, often 0) as predicted - measured. For each
variation it also says whether the preview moved the figure the same way from the baseline as the real runs did:
how far to trust the next preview of this server is what these rows show.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from batchscope.tuner.plan import BASELINE
from batchscope.tuner.report.blocks import Block, Heading, Paragraph, Table
from batchscope.tuner.results import RunResult, load_results

WHAT_IF_SUFFIX = ".what-if"  # what-if results sit beside the real-time ones, never mixed with them


@dataclass(frozen=True)
class Figure:
    """A compared figure: its name, how it is read from a run, how it is shown, and whether its error is a ratio."""

    name: str
    read: Callable[[RunResult], float | None]
    show: Callable[[float], str]
    relative: bool


FIGURES = (
    Figure("TTFT mean", lambda r: r.client.ttft.mean if r.client else None, lambda v: f"{v * 1e3:.1f} ms", True),
    Figure("TPOT mean", lambda r: r.client.tpot.mean if r.client else None, lambda v: f"{v * 1e3:.2f} ms", True),
    Figure("output tokens/s", lambda r: r.client.output_tokens_per_s if r.client else None, lambda v: f"{v:.1f}",
           True),
    Figure("preemptions", lambda r: r.server.preemptions if r.server else None, lambda v: f"{v:.0f}", False),
)


@dataclass(frozen=True)
class PredictionRow:
    """One setting's figure: predicted, measured, the error and (variations) whether the direction agreed."""

    setting: str
    figure: str
    predicted: float
    measured: float
    error: float  # predicted / measured - 1 for ratios, predicted - measured for counts
    same_direction: bool | None  # None: the baseline, or a figure neither moved


def counterpart(plan_dir: Path) -> tuple[Path, Path]:
    """(what-if folder, real-time folder) of the plan whose results are in ``plan_dir``."""
    name = plan_dir.name
    if name.endswith(WHAT_IF_SUFFIX):
        return plan_dir, plan_dir.with_name(name.removesuffix(WHAT_IF_SUFFIX))
    return plan_dir.with_name(name + WHAT_IF_SUFFIX), plan_dir


def _means(plan_dir: Path) -> dict[str, dict[str, float]]:
    """setting -> figure -> mean over the setting's ok runs."""
    if not plan_dir.is_dir():
        return {}
    values: dict[str, dict[str, list[float]]] = {}
    for run in load_results(plan_dir):
        if run.status != "ok":
            continue
        for figure in FIGURES:
            value = figure.read(run)
            if value is not None:
                values.setdefault(run.setting, {}).setdefault(figure.name, []).append(value)
    return {setting: {name: sum(v) / len(v) for name, v in figures.items()} for setting, figures in values.items()}


def prediction_rows(plan_dir: Path) -> list[PredictionRow]:
    """Every figure of every setting both folders measured (baseline first)."""
    what_if_dir, real_dir = counterpart(Path(plan_dir))
    predicted, measured = _means(what_if_dir), _means(real_dir)
    settings = sorted(set(predicted) & set(measured), key=lambda s: (s != BASELINE, s))
    rows = []
    for setting in settings:
        for figure in FIGURES:
            guess, truth = predicted[setting].get(figure.name), measured[setting].get(figure.name)
            if guess is None or truth is None or (figure.relative and truth == 0):
                continue
            error = guess / truth - 1 if figure.relative else guess - truth
            rows.append(PredictionRow(setting, figure.name, guess, truth, error,
                                      _same_direction(setting, figure.name, predicted, measured)))
    return rows


def _same_direction(setting: str, figure: str, predicted: dict, measured: dict) -> bool | None:
    if setting == BASELINE or BASELINE not in predicted or BASELINE not in measured:
        return None
    moves = [values[setting][figure] - values[BASELINE].get(figure, values[setting][figure])
             for values in (predicted, measured)]
    if moves[0] == 0 and moves[1] == 0:
        return None
    return (moves[0] > 0) == (moves[1] > 0) and (moves[0] != 0) == (moves[1] != 0)


def prediction_blocks(plan_dir: Path) -> list[Block]:
    """The report section (nothing when the plan has no setting with both a what-if and a real-time run)."""
    rows = prediction_rows(plan_dir)
    if not rows:
        return []
    show = {figure.name: figure for figure in FIGURES}
    table = [[r.setting, r.figure, show[r.figure].show(r.predicted), show[r.figure].show(r.measured),
              f"{r.error:+.0%}" if show[r.figure].relative else f"{r.error:+.0f}",
              "n/a" if r.same_direction is None else "✓" if r.same_direction else "✗"] for r in rows]
    worst: dict[str, float] = {}
    for r in rows:
        if show[r.figure].relative:
            worst[r.figure] = max(worst.get(r.figure, 0.0), abs(r.error))
    summary = ", ".join(f"{name} {value:.0%}" for name, value in worst.items())
    return [Heading(2, "Prediction error: what-if against real time"),
            Paragraph(f"Each setting's what-if preview (the simulator's profile) against its real-time runs, both the "
                      f"mean over their ok repeats; error = predicted / measured - 1 (preemptions: predicted - "
                      f"measured); direction: whether the preview moved the figure from the baseline the way the real "
                      f"runs did. Largest error: {summary}. A preview of this server is as trustworthy as these rows."),
            Table(["setting", "figure", "predicted", "measured", "error", "direction"], table)]
