"""Marking configuration changes: a counter and timestamp for Prometheus, and Grafana annotations.

A change is a new serving configuration or a new server start time, seen between two scrapes. The Grafana
annotation is posted by batchscope.runs.annotations (a background thread with exponential backoff), so an
unreachable Grafana is logged and retried but never blocks a scrape or stops the exporter.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from batchscope.exporter.config import ServingConfig
from batchscope.runs.annotations import GrafanaAnnotator

log = logging.getLogger("batchscope.exporter")
RESTART_TOLERANCE_S = 1.0


class ChangeTracker:
    """Compares each scrape's configuration and start time with the previous one."""

    def __init__(self, annotator: GrafanaAnnotator | None = None, clock: Callable[[], float] = time.time) -> None:
        self._annotator = annotator
        self._clock = clock
        self._last: tuple[ServingConfig, float | None] | None = None
        self.changes = 0
        self.last_change_s = 0.0

    def observe(self, config: ServingConfig, started_at: float | None) -> None:
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
        text = "; ".join(lines) if lines else "vLLM restarted, configuration unchanged"
        log.info("configuration change: %s", text)
        if self._annotator is not None:
            self._annotator.post(text, self.last_change_s, ["batchscope", "config-change"])
