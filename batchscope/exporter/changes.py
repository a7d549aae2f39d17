"""Marking configuration changes: counters and a timestamp for Prometheus, and Grafana annotations.

A change is a new serving configuration or a new server start time, seen between two scrapes. Without a command
line on both sides, the knobs vLLM does not expose are unknown, so a restart is "configuration not visible", never
"unchanged": the text names what could be compared and why the rest could not. The Grafana annotation is posted by
batchscope.runs.annotations (a background thread with backoff), so an unreachable Grafana never blocks a scrape.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from batchscope.exporter.config import ServingConfig
from batchscope.runs.annotations import GrafanaAnnotator
from batchscope.vllm import knobs as vllm_knobs

log = logging.getLogger("batchscope.exporter")
RESTART_TOLERANCE_S = 1.0
HINT = "pass --vllm-command or --vllm-command-file"


class ChangeTracker:
    """Compares each scrape's configuration and start time with the previous one."""

    def __init__(self, annotator: GrafanaAnnotator | None = None, clock: Callable[[], float] = time.time) -> None:
        self._annotator = annotator
        self._clock = clock
        self._last: tuple[ServingConfig, float | None] | None = None
        self.changes = 0
        self.not_visible = 0  # of the changes, those judged without a command line on both sides
        self.last_change_s = 0.0

    def observe(self, config: ServingConfig, started_at: float | None, why_not_visible: str = "") -> None:
        """Compare with the last scrape; ``why_not_visible`` says why no command line was read, if none was."""
        if self._last is None:
            self._last = (config, started_at)
            return
        before, started_before = self._last
        self._last = (config, started_at)
        lines = config.diff(before)
        restarted = (started_at is not None and started_before is not None
                     and abs(started_at - started_before) > RESTART_TOLERANCE_S)
        if not lines and not restarted:
            return
        self.changes += 1
        self.last_change_s = self._clock()
        if config.defaulted is not None and before.defaulted is not None:
            text = "; ".join(lines) if lines else "vLLM restarted, configuration unchanged"
        else:
            self.not_visible += 1
            text = not_visible_text(lines, before, config, why_not_visible or "none was given or found")
        log.info("configuration change: %s", text)
        if self._annotator is not None:
            self._annotator.post(text, self.last_change_s, ["batchscope", "config-change"])


def not_visible_text(lines: list[str], before: ServingConfig, after: ServingConfig, why: str) -> str:
    """A change seen without a command line on both sides: the known changes, else the restart; the rest said to be
    not visible, with why and what to do (and the knobs compared and found as before)."""
    reason = f"(no command line: {why}; {HINT})"
    old, new = before.labels(), after.labels()
    compared = [name for name in vllm_knobs.KNOB_NAMES if old[name] and new[name]]
    if lines:
        return f"{'; '.join(lines)}; the other knobs not visible {reason}"
    same = f"; as before: {', '.join(compared)}" if compared else ""
    return f"vLLM restarted, configuration not visible {reason}{same}"
