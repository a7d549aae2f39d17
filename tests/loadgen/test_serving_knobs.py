"""The knobs the LLM tab shows (batchscope/loadgen/adapter/serving_knobs.py): from a vLLM command line in either
spelling, from the exporter's batchscope_vllm_config_info (a value, vLLM's default, or not visible), read bounded
from a hostile exporter; a bad command line or file is one line naming the flag."""

from __future__ import annotations

import pytest

from batchscope.loadgen.adapter.serving_knobs import (
    NOT_VISIBLE,
    ExporterKnobs,
    KnobView,
    command_knobs,
    command_line,
)
from batchscope.loadgen.checks import BadInput
from batchscope.testkit.hostile import HostileServer
from batchscope.vllm import knobs

DEFAULT = knobs.DEFAULT_TEXT


def test_a_command_line_sets_its_knobs_in_either_spelling_and_leaves_the_rest_at_vllms_default():
    found = command_knobs("vllm serve m --max-num-seqs 32 --max_num_batched_tokens=8192 --api-key s3cret "
                          "--no-long-prefill-token-threshold-adaptive --max-num-queued-reqs=64")
    assert found["max_num_seqs"] == "32" and found["max_num_batched_tokens"] == "8192"
    assert found["max_num_queued_reqs"] == "64" and found["long_prefill_token_threshold_adaptive"] == "off"
    assert found["max_num_queued_tokens"] == DEFAULT and set(found) == set(knobs.KNOB_NAMES)
    assert "s3cret" not in found.values()
    assert command_knobs("vllm serve m --long-prefill-token-threshold-adaptive")[
        "long_prefill_token_threshold_adaptive"] == "on"


INFO = ('batchscope_vllm_config_info{command_line_source="%s",max_num_seqs="%s",max_num_batched_tokens="",'
        'block_size="16",long_prefill_token_threshold_adaptive="true"} 1.0\n')


def test_the_exporters_info_gives_a_value_vllms_default_or_not_visible():
    view = KnobView(exporter=ExporterKnobs("http://exp:9100/", fetch=lambda url: "# junk\n" + INFO % ("file", "32")))
    view.read()
    source, values = view.values()
    assert source == "http://exp:9100/metrics (command line: file)"
    assert values["max_num_seqs"] == "32" and values["max_num_batched_tokens"] == DEFAULT
    assert values["block_size"] == "16" and values["long_prefill_token_threshold_adaptive"] == "on"
    blind = KnobView(exporter=ExporterKnobs("http://exp:9100/metrics", fetch=lambda url: INFO % ("none", "")))
    blind.read()
    assert blind.values()[1]["max_num_seqs"] == NOT_VISIBLE and blind.values()[1]["block_size"] == "16"
    assert KnobView().values() == ("none (give --exporter-url or --vllm-command)",
                                   dict.fromkeys(knobs.KNOB_NAMES, NOT_VISIBLE))


@pytest.mark.parametrize("mode", ["metrics-endless", "metrics-hang"])
def test_a_hostile_exporter_reads_as_unreachable_and_no_knob_visible(mode):
    with HostileServer(mode) as server:
        view = KnobView(exporter=ExporterKnobs(server.url))
        view.read()
    source, values = view.values()
    assert source.endswith("exporter unreachable") and set(values.values()) == {NOT_VISIBLE}


def test_a_bad_command_line_or_file_is_one_line_naming_the_flag(tmp_path):
    with pytest.raises(BadInput, match=r"^--vllm-command: not a command line"):
        command_line("vllm serve 'm", "")
    with pytest.raises(BadInput, match=r"^--vllm-command-file: cannot read .*missing"):
        command_line("", str(tmp_path / "missing"))
    (tmp_path / "cmd").write_text("vllm serve m --max-num-seqs 4\n")
    assert command_line("", str(tmp_path / "cmd")) == "vllm serve m --max-num-seqs 4"
    assert command_line("", "") is None
