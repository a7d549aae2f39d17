"""What /metrics samples gained over a span: the means of vLLM's own histograms over a calibration phase or a
test's run, from ``batchscope.vllm.scrape.sample_sums`` read before and after it."""

from __future__ import annotations


def sample_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What each sample gained over a span, from ``scrape.sample_sums`` read before and after it."""
    return {name: value - before.get(name, 0.0) for name, value in after.items()}


def histogram_means(delta: dict[str, float], histograms: dict[str, str]) -> dict[str, float | None]:
    """figure -> the mean of its histogram over a span (``delta``: ``sample_delta``), None where nothing was
    observed."""
    return {figure: delta[name + "_sum"] / delta[name + "_count"] if delta.get(name + "_count", 0) > 0 else None
            for figure, name in histograms.items()}
