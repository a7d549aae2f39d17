"""The serving knobs in effect (batchscope/vllm/knobs.py's), as the LLM tab shows them: from the batchscope
exporter's batchscope_vllm_config_info, else from vLLM's command line handed to the load generator, else "not
visible". No Locust import: `batchscope load` checks a command line with it before it becomes Locust.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from pathlib import Path

import requests

from batchscope.inputs.validation import read_input_text
from batchscope.loadgen.checks import BadInput
from batchscope.vllm import knobs, scrape
from batchscope.vllm.command_line import flag_values
from batchscope.wire.bounded_read import METRICS_MAX_BYTES

NOT_VISIBLE = "not visible"
EXPORTER_INFO = "batchscope_vllm_config_info"
NO_COMMAND_LINE = "none"  # the exporter's command_line_source when it read no command line
READ_TIMEOUT_S = 1.0
MIN_READ_INTERVAL_S = 1.5  # as the server's reads: one per poll of the tab, however many browsers


def command_line(command: str, command_file: str) -> str | None:
    """vLLM's command line from --vllm-command or --vllm-command-file (read within 4 MiB); None when neither is
    given. BadInput naming the flag when the file cannot be read or the line cannot be split."""
    flag, text = "--vllm-command", command
    if command_file:
        flag = "--vllm-command-file"
        try:
            text = read_input_text(Path(command_file)).strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise BadInput(f"--vllm-command-file: cannot read {command_file}: "
                           f"{getattr(exc, 'strerror', None) or 'not UTF-8 text'}") from None
    if not text:
        return None
    try:
        shlex.split(text)
    except ValueError as exc:
        raise BadInput(f"{flag}: not a command line ({exc})") from None
    return text


def command_knobs(command: str) -> dict[str, str]:
    """Every knob as the command line sets it (batchscope.vllm.command_line), "vLLM default" where it is left out;
    a switch reads on or off."""
    values = flag_values(command)
    return {knob.name: knobs.DEFAULT_TEXT if knob.name not in values
            else knobs.shown(values[knob.name] == "true") if knob.switch else values[knob.name]
            for knob in knobs.KNOBS}


def exporter_knobs(labels: dict[str, str]) -> dict[str, str]:
    """Every knob as the exporter's info labels tell it: a value, "vLLM default" when its command line left the
    knob out, "not visible" when it read no command line and vLLM does not expose the knob."""
    read_command = labels.get("command_line_source", NO_COMMAND_LINE) != NO_COMMAND_LINE
    shown = {}
    for knob in knobs.KNOBS:
        value = labels.get(knob.name, "")
        if value and knob.switch:
            value = knobs.shown(value == "true")
        shown[knob.name] = value or (knobs.DEFAULT_TEXT if read_command else NOT_VISIBLE)
    return shown


class ExporterKnobs:
    """The exporter's /metrics at ``url``, read at most every MIN_READ_INTERVAL_S, bounded in time and bytes;
    only the info line is parsed (an exporter's /metrics carries thousands of histogram lines)."""

    def __init__(self, url: str, fetch: Callable[[str], str] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        base = url.rstrip("/")
        self.url = base if base.endswith("/metrics") else base + "/metrics"
        self.session = requests.Session()
        self.fetch = fetch or (lambda url: scrape.read_text(self.session, url, READ_TIMEOUT_S, METRICS_MAX_BYTES))
        self.clock = clock
        self.labels: dict[str, str] | None = None
        self.why = "not read yet"
        self.last_read_s = -float("inf")

    def read(self) -> None:
        now = self.clock()
        if now - self.last_read_s < MIN_READ_INTERVAL_S:
            return
        self.last_read_s = now
        try:
            samples = scrape.picked_samples(self.fetch(self.url), (EXPORTER_INFO + "{",))
        except Exception:  # refused, timed out, too large, not an exposition: the exporter is unreachable
            self.labels, self.why = None, "exporter unreachable"
            return
        self.labels = dict(samples[0].labels) if samples else None
        self.why = "" if samples else f"exporter has no {EXPORTER_INFO}"


class KnobView:
    """The tab's knob rows: the exporter's (when a URL is given), else the command line's, else not visible."""

    def __init__(self, exporter: ExporterKnobs | None = None, command: str | None = None,
                 command_from: str = "--vllm-command") -> None:
        self.exporter = exporter
        self.command = command
        self.command_from = command_from

    def read(self) -> None:
        if self.exporter is not None:
            self.exporter.read()

    def values(self) -> tuple[str, dict[str, str]]:
        """(where the values come from, every knob's value)."""
        if self.exporter is not None:
            labels = self.exporter.labels
            if labels is None:
                return f"{self.exporter.url}: {self.exporter.why}", dict.fromkeys(knobs.KNOB_NAMES, NOT_VISIBLE)
            source = labels.get("command_line_source", NO_COMMAND_LINE)
            return f"{self.exporter.url} (command line: {source})", exporter_knobs(labels)
        if self.command is not None:
            return self.command_from, command_knobs(self.command)
        return "none (give --exporter-url or --vllm-command)", dict.fromkeys(knobs.KNOB_NAMES, NOT_VISIBLE)
