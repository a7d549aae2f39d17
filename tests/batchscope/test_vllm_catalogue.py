"""The vLLM metric catalogue against captured vLLM /metrics: same type and HELP for every metric found there."""

from __future__ import annotations

import re
from pathlib import Path

from batchscope.vllm_catalogue import CATALOGUE, VllmMetric

SAMPLE = Path(__file__).parent.parent / "fixtures" / "vllm-metrics-sample.txt"
COMMENT = re.compile(r"^# (HELP|TYPE) (\S+) (.*)$", re.MULTILINE)


def published() -> dict[str, set[tuple[str, str]]]:
    """Every (TYPE, HELP) pair the sample shows for each family name (several vLLM versions, so maybe several)."""
    kinds: dict[str, list[str]] = {}
    helps: dict[str, list[str]] = {}
    for comment, name, rest in COMMENT.findall(SAMPLE.read_text()):
        (kinds if comment == "TYPE" else helps).setdefault(name, []).append(rest)
    return {name: set(zip(kinds[name], helps[name], strict=True)) for name in kinds}


def test_every_catalogue_metric_in_the_sample_has_vllms_type_and_help():
    sample = published()
    found = [metric for metric in CATALOGUE if metric.exposed_name in sample]
    assert len(found) >= 8, "the sample should show most core metrics"
    for metric in found:
        assert sample[metric.exposed_name] == {(metric.kind, metric.help)}, metric.name


def test_names_are_unique_and_counters_are_exposed_with_total():
    assert len({metric.name for metric in CATALOGUE}) == len(CATALOGUE)
    assert VllmMetric("vllm:x", "counter", "X.").exposed_name == "vllm:x_total"
    assert VllmMetric("vllm:iteration_tokens_total", "histogram", "X.").exposed_name == "vllm:iteration_tokens_total"
