"""The exporter given no command line, in front of a real `batchscope sim serve` on loopback restarted with another
--max-num-seqs: it reads the server's argv from /proc and counts one change whose diff is the knob's; with the
/proc source off, the same restart is "configuration not visible", never "unchanged" (issue 32)."""

from __future__ import annotations

import pytest
import requests

from tests.conftest import free_port, wait_until
from tests.stubs import HttpStub, json_reply

pytestmark = pytest.mark.e2e
KEY = "sk-proc-argv-7f3e1c"  # on the server's command line: masked in the labels, never in a log or the exposition


def config_info(scraped: dict) -> dict[str, str]:
    [labels] = [dict(labels) for name, labels in scraped if name == "batchscope_vllm_config_info"]
    return labels


def counts(scraped: dict) -> tuple[float, float]:
    """(changes, of them not visible)."""
    return (scraped[("batchscope_config_changes_total", ())],
            scraped[("batchscope_config_changes_not_visible_total", ())])


def annotations(grafana: HttpStub) -> list[str]:
    return [request.json()["text"] for request in grafana.requests if request.method == "POST"]


def test_a_restart_with_another_max_num_seqs_is_read_from_the_process_or_said_not_visible(simulator, exporters):
    port = str(free_port())
    first = simulator("--profile", "tiny", "--port", port, "--api-key", KEY, "--max-num-seqs", "128")
    stubs = [HttpStub(lambda _method, _path: json_reply({"message": "Annotation added", "id": 1})).start()
             for _ in range(2)]
    reading, off = (exporters("--vllm-url", first.url, "--vllm-api-key", KEY, "--grafana-url", grafana.url, *flags)
                    for grafana, flags in zip(stubs, ((), ("--vllm-process", "off")), strict=True))
    before = reading.scrape()
    assert (config_info(before)["max_num_seqs"], config_info(before)["command_line_source"]) == ("128", "process")
    assert (config_info(off.scrape())["max_num_seqs"], config_info(off.scrape())["command_line_source"]) == ("", "none")
    first.stop()
    assert reading.scrape()[("batchscope_up", (("target", "vllm"),))] == 0
    assert off.scrape()[("batchscope_up", (("target", "vllm"),))] == 0
    simulator("--profile", "tiny", "--port", port, "--api-key", KEY, "--max-num-seqs", "32")

    after = reading.scrape()
    assert counts(after) == (1, 0)
    assert (config_info(after)["max_num_seqs"], config_info(after)["command_line_source"]) == ("32", "process")
    assert "api_key=***" in config_info(after)["other_flags"]
    assert wait_until(lambda: annotations(stubs[0]), message="the annotation") == ["max_num_seqs: 128 → 32"]
    assert "configuration change: max_num_seqs: 128 → 32" in reading.log.read_text()

    unseen = off.scrape()
    assert counts(unseen) == (1, 1)
    assert config_info(unseen)["max_num_seqs"] == ""
    [text] = wait_until(lambda: annotations(stubs[1]), message="the annotation")
    assert text.startswith("vLLM restarted, configuration not visible (no command line: reading vLLM's process is "
                           "off, --vllm-process off; pass --vllm-command or --vllm-command-file)")
    assert "unchanged" not in off.log.read_text()
    for exporter in (reading, off):
        assert KEY not in requests.get(exporter.url, timeout=10).text + exporter.log.read_text()
    for grafana in stubs:
        grafana.stop()
