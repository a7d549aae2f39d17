"""Sums of a /metrics text's samples and what they gained over a span: the means of vLLM's own histograms over a
calibration phase or a test's run, read from /metrics before and after it."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def sample_sums(text: str) -> dict[str, float]:
    """Every sample's value of a /metrics text summed over its series, by sample name."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def sample_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What each sample gained over a span, from ``sample_sums`` read before and after it."""
    return {name: value - before.get(name, 0.0) for name, value in after.items()}


def histogram_means(delta: dict[str, float], histograms: dict[str, str]) -> dict[str, float | None]:
    """figure -> the mean of its histogram over a span (``delta``: ``sample_delta``), None where nothing was
    observed."""
    return {figure: delta[name + "_sum"] / delta[name + "_count"] if delta.get(name + "_count", 0) > 0 else None
            for figure, name in histograms.items()}
