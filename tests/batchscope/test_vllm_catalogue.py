"""The vLLM metric catalogue against captured vLLM /metrics: same type and HELP for every metric found there."""

from __future__ import annotations

import re
from pathlib import Path

from batchscope.vllm.catalogue import CATALOGUE, VllmMetric

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


def test_renamed_samples_map_both_ways_with_their_suffixes():
    from batchscope.vllm.catalogue import RENAMES, current_sample_name, sample_aliases

    assert current_sample_name("vllm:gpu_prefix_cache_hits_total") == "vllm:prefix_cache_hits_total"
    assert current_sample_name("vllm:time_per_output_token_seconds_bucket") == "vllm:inter_token_latency_seconds_bucket"
    assert current_sample_name("vllm:gpu_cache_usage_perc_extra") == "vllm:gpu_cache_usage_perc_extra"  # not a suffix
    assert sample_aliases("vllm:kv_cache_usage_perc") == ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert sample_aliases("vllm:num_requests_running") == ("vllm:num_requests_running",)
    assert all(current_sample_name(old) == new for old, new in RENAMES.items())
