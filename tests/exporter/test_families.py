"""Golden tests: real vLLM /metrics of several versions are re-exposed intact, old names mapped to today's.

The fixtures are tests/fixtures/vllm-metrics-sample.txt and vllm-0.32-cpu-metrics.txt (a whole real vLLM
0.32 /metrics under load, `_created` series and all), copied into tests/fixtures. Run with UPDATE_GOLDEN=1 to
rewrite tests/fixtures/golden/ after a deliberate change.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import requests
from prometheus_client import CollectorRegistry, generate_latest

from batchscope.exporter import families
from batchscope.vllm.catalogue import CATALOGUE, EXPOSITION_CONTENT_TYPE
from tests.conftest import only, samples
from tests.stubs import HttpStub, Reply

FIXTURES = Path(__file__).parent.parent / "fixtures"
VLLM_032 = (FIXTURES / "vllm-0.32-cpu-metrics.txt").read_text()
GOLDEN = FIXTURES / "golden"
SECTION = re.compile(r"^# \[([A-Z])\]", re.MULTILINE)


def sections() -> dict[str, str]:
    """Each lettered excerpt of the sample file, keeping only exposition lines (the file elides with '...')."""
    text = (FIXTURES / "vllm-metrics-sample.txt").read_text()
    parts = SECTION.split(text)[1:]
    result = {}
    for letter, body in zip(parts[::2], parts[1::2], strict=True):
        lines = [line for line in body.splitlines()
                 if (line.startswith(("# HELP", "# TYPE")) or re.match(r"^[a-z_:]+[{ ]", line)) and "..." not in line]
        result[letter] = "\n".join(lines) + "\n"
    return result


class Static:
    def __init__(self, metrics):
        self.metrics = metrics

    def collect(self):
        return iter(self.metrics)


def reexposed(text: str) -> tuple[str, dict[str, str]]:
    vllm = [f for f in families.parse(text) if f.name.startswith("vllm:")]
    mapped, applied = families.map_renamed(vllm)
    registry = CollectorRegistry()
    registry.register(Static(mapped))
    return generate_latest(registry).decode(), applied


@pytest.mark.parametrize("letter", sorted(sections()))
def test_reexposition_matches_golden(letter):
    output, _ = reexposed(sections()[letter])
    golden = GOLDEN / f"section-{letter}.prom"
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(output)
    assert output == golden.read_text()


def test_every_vllm_sample_survives_with_its_labels_and_value():
    for letter, text in sections().items():
        source = [f for f in families.parse(text) if f.name.startswith("vllm:")]
        present = {f.name for f in source}
        expected = {}
        for family in source:
            name = _todays_name(family.name)
            if name != family.name and name in present:
                continue  # deprecation window: the server's own new-name series are kept instead
            for sample in family.samples:
                expected[(_todays_name(sample.name), tuple(sorted(sample.labels.items())))] = sample.value
        output, _ = reexposed(text)
        exposed = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in families.parse(output) for s in f.samples}
        assert exposed == expected, letter


def test_vllms_families_keep_vllms_type_and_help():
    """Every catalogue family a sample carries under today's name is re-exposed with vLLM's TYPE and HELP."""
    kept = 0
    for text in sections().values():
        output, _ = reexposed(text)
        for metric in CATALOGUE:
            type_line = f"# TYPE {metric.exposed_name} {metric.kind}\n"
            if type_line in text:
                assert type_line in output and f"# HELP {metric.exposed_name} {metric.help}\n" in output
                kept += 1
    assert kept >= 8


def _todays_name(name: str) -> str:
    for old, new in families.RENAMES.items():
        if name.startswith(old):
            return new + name[len(old):]
    return name


def test_old_names_are_mapped_and_reported():
    early = sections()["F"]  # vLLM 0.8: gpu_cache_usage_perc
    output, applied = reexposed(early)
    assert applied == {"vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc"}
    assert "vllm:kv_cache_usage_perc{" in output and "gpu_cache_usage_perc{" not in output
    both = sections()["C"]  # vLLM 0.10: deprecated gpu_prefix_cache_* beside prefix_cache_*
    output, applied = reexposed(both)
    assert "gpu_prefix_cache" not in output.replace("exposed from vllm:gpu_prefix_cache", "")
    assert "vllm:prefix_cache_queries_total" in output


def test_old_itl_histogram_is_exposed_under_todays_name():
    text = ("# HELP vllm:time_per_output_token_seconds Histogram of time per output token in seconds.\n"
            "# TYPE vllm:time_per_output_token_seconds histogram\n"
            'vllm:time_per_output_token_seconds_bucket{le="0.01",model_name="m"} 3.0\n'
            'vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 5.0\n'
            'vllm:time_per_output_token_seconds_count{model_name="m"} 5.0\n'
            'vllm:time_per_output_token_seconds_sum{model_name="m"} 0.2\n')
    output, applied = reexposed(text)
    assert applied == {"vllm:time_per_output_token_seconds": "vllm:inter_token_latency_seconds"}
    assert 'vllm:inter_token_latency_seconds_bucket{le="0.01",model_name="m"} 3.0' in output
    assert "# TYPE vllm:inter_token_latency_seconds histogram" in output


def test_malformed_text_raises_value_error():
    with pytest.raises(ValueError):
        families.parse("vllm:x{model_name=\"m\" 1\n")


def test_incremental_parser_reads_new_values_and_reparses_a_new_shape():
    text = sections()["E"]
    parser = families.IncrementalParser()
    first = parser.parse(text)
    moved = text.replace("} 5.0", "} 6.0").replace("} 1000.0", "} 1001.0")
    second = parser.parse(moved)
    assert _values(second) == _values(families.parse(moved)) != _values(first)
    grown = moved + 'vllm:prompt_tokens_total{engine="1",model_name="Qwen/Qwen3-4B-Instruct-2507"} 7.0\n'
    assert _values(parser.parse(grown)) == _values(families.parse(grown))
    assert _values(parser.parse(grown.replace("} 7.0", "} NaN")))[-1][-1] != _values(families.parse(grown))[-1][-1]


def _values(parsed) -> list[tuple]:
    return [(s.name, tuple(sorted(s.labels.items())), s.value) for f in parsed for s in f.samples]


def test_a_whole_vllm_032_exposition_is_reexposed_sample_for_sample():
    output, applied = reexposed(VLLM_032)
    assert applied == {}
    assert only("vllm:", samples(output)) == only("vllm:", samples(VLLM_032))
    for family in families.parse(VLLM_032):
        if family.name.startswith("vllm:"):
            exposed = family.name + ("_total" if family.type == "counter" else "")
            assert f"# TYPE {exposed} {family.type}\n" in output and f"# HELP {exposed} {family.documentation}\n" \
                in output, family.name


@pytest.mark.e2e
def test_the_exporter_reexposes_every_family_a_real_vllm_032_serves(exporters):
    """vLLM 0.32 labels its classic text 'version=1.0.0' whatever the Accept header; the exporter reads it and
    serves every vllm: family on, in 0.0.4 (the Exporter fixture checks that header) whatever Prometheus asks."""
    vllm = HttpStub(lambda _method, path: Reply(body=VLLM_032.encode(), content_type=EXPOSITION_CONTENT_TYPE)
                    if path == "/metrics" else Reply(status=404, body=b'{"detail":"Not Found"}')).start()
    try:
        exporter = exporters("--vllm-url", vllm.url)
        exported = exporter.scrape()  # Prometheus 2.x's OpenMetrics-first Accept header
        text = requests.get(exporter.url, timeout=10).text
    finally:
        vllm.stop()
    assert exported[("batchscope_up", (("target", "vllm"),))] == 1
    assert only("vllm:", exported) == only("vllm:", samples(VLLM_032))
    real = {f.name for f in families.parse(VLLM_032) if f.name.startswith("vllm:")}
    assert real == {f.name for f in families.parse(text) if f.name.startswith("vllm:")}
    assert len(real) == 72  # 39 families and the _created twins of its 33 counters and histograms
    # the API server's HTTP requests and CPU time (the dashboards' error-ratio and CPU panels), renamed
    api_server = ("http_requests_total", "process_cpu_seconds_total")
    real_api = {("batchscope_vllm_" + name, labels): value for (name, labels), value in samples(VLLM_032).items()
                if name in api_server}
    assert len(real_api) == 3
    assert {key: value for key, value in exported.items() if key[0].removeprefix("batchscope_vllm_") in api_server} \
        == real_api
