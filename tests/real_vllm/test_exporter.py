"""The exporter in front of a real vLLM: every family re-exposed as vLLM serves it, and the configuration in
effect from the command line (given, or read from the `vllm serve` process by /proc) and from what vLLM reports
(cache_config_info, /version, the start-up log)."""

from __future__ import annotations

import re
import shlex

from prometheus_client.parser import text_string_to_metric_families

from batchscope.exporter.config import parse_command
from tests.conftest import samples
from tests.real_vllm.support import SERVED_NAME, tier


def family_names(text: str) -> set[str]:
    return {family.name for family in text_string_to_metric_families(text)}


def test_every_real_vllm_family_is_re_exposed_with_the_configuration_in_effect(vllm, exporters):
    command = shlex.join(tier().serve_argv(vllm.port, *vllm.flags))
    exporter = exporters("--vllm-url", vllm.url, "--vllm-command", command)
    exported_text_samples = exporter.scrape()
    source = vllm.metrics()
    exported_names = {name for name, _ in exported_text_samples}
    vllm_families = {name for name in family_names(source) if name.startswith("vllm:")}
    assert len(vllm_families) > 30  # 0.32 exposes ~50 families
    exported_families = {name for name in exported_names if name.startswith("vllm:")}
    # every sample of every family comes out (prometheus_client re-derives _created, which it may drop)
    source_samples = {name for name, _ in samples(source) if name.startswith("vllm:") and not name.endswith("_created")}
    assert source_samples <= exported_families | exported_names
    # the idle server's counters and gauges come out with vLLM's values, labels included
    idle = {key: value for key, value in samples(source).items()
            if key[0].startswith("vllm:") and not key[0].endswith("_created")}
    assert {key: exported_text_samples.get(key) for key in idle} == idle
    info = next(dict(labels) for (name, labels) in exported_text_samples if name == "batchscope_vllm_config_info")
    assert info["served_model_name"] == SERVED_NAME
    assert (info["max_model_len"], info["max_num_seqs"], info["max_num_batched_tokens"]) == ("1024", "8", "1024")
    assert info["block_size"] == "128"  # not on the command line: what vLLM chose on the CPU, from cache_config_info
    assert info["vllm_version"] == "0.32.0"
    logged = int(re.search(r"CPU KV cache size: ([\d,]+) tokens", vllm.log())[1].replace(",", ""))
    assert exported_text_samples[("batchscope_vllm_kv_cache_capacity_tokens", ())] == logged
    assert exported_text_samples[("batchscope_vllm_kv_cache_max_concurrency", ())] == logged / 1024
    assert exported_text_samples[("batchscope_up", (("target", "vllm"),))] == 1


def test_without_a_command_line_the_exporter_reads_the_real_vllm_serve_argv_from_proc(vllm, exporters):
    """The tier's shared server is a local `vllm serve` (its engine core a child process): an exporter given only
    its URL finds the process listening on its port and reads the knobs from its argv."""
    info = next(dict(labels) for (name, labels) in exporters("--vllm-url", vllm.url).scrape()
                if name == "batchscope_vllm_config_info")
    given = parse_command(tier().serve_argv(vllm.port, *vllm.flags)).labels()
    assert info["command_line_source"] == "process"
    assert (info["max_model_len"], info["max_num_seqs"], info["max_num_batched_tokens"]) == ("1024", "8", "1024")
    assert (info["model"], info["other_flags"]) == (given["model"], given["other_flags"])
