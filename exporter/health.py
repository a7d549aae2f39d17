"""Saying why a target is down: the cause of a failed fetch, and a rate-limited log line per target.

A target scraped every few seconds that stays down would otherwise log the same failure thousands of times, or
(as before) not at all, leaving only ``batchscope_up 0``. The reporter logs when a target goes down, when the
cause changes, at most once per ``repeat_s`` while it stays the same, and once when the target is back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import requests

from batchscope.secrets import MASK

log = logging.getLogger("batchscope.exporter")
REPEAT_S = 60.0


@dataclass(frozen=True)
class DownCause:
    """Why a fetch failed: ``kind`` is what the rate limit compares, ``text`` what the log line says."""

    kind: str
    text: str


def down_cause(exc: Exception, timeout_s: float) -> DownCause:
    """Classify a failed fetch: refused, timeout, HTTP status, unparseable, or another connection problem."""
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        status = f"HTTP {exc.response.status_code}"
        return DownCause(status, f"{status} {exc.response.reason or ''}".rstrip())
    if isinstance(exc, requests.Timeout):
        return DownCause("timeout", f"timeout after {timeout_s:g} s")
    if isinstance(exc, requests.ConnectionError):
        text = str(exc)
        if "Connection refused" in text:
            return DownCause("refused", "connection refused")
        if "resolve" in text or "Name or service not known" in text:
            return DownCause("unresolvable", "cannot resolve the host name")
        if "Connection aborted" in text or "reset" in text.lower():
            return DownCause("closed", "connection closed by the target")
        return DownCause("connection", f"connection error: {text[:160]}")
    if isinstance(exc, ValueError):  # families.parse: the body is not a text exposition
        return DownCause("unparseable", f"unparseable /metrics: {str(exc)[:160]}")
    return DownCause("error", f"{type(exc).__name__}: {str(exc)[:160]}")


def shown_url(url: str) -> str:
    """``url`` fit for a log line: a password in it (``http://user:pw@host``) is masked."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{MASK}@{host}"))


@dataclass
class _Down:
    cause: DownCause
    since: float
    logged_at: float


class DownReporter:
    """``observe(target, url, cause)`` after every fetch (cause None = up); logs as the module docstring says.

    >>> reporter = DownReporter(clock=lambda: 0.0)
    >>> reporter.observe("vllm", "http://127.0.0.1:8000/metrics", DownCause("refused", "connection refused"))
    """

    def __init__(self, logger: logging.Logger = log, clock: Callable[[], float] = time.monotonic,
                 repeat_s: float = REPEAT_S) -> None:
        self._log = logger
        self._clock = clock
        self._repeat_s = repeat_s
        self._down: dict[str, _Down] = {}
        self._lock = threading.Lock()  # scrapes may run concurrently (one HTTP thread each)

    def observe(self, target: str, url: str, cause: DownCause | None) -> None:
        now = self._clock()
        with self._lock:
            down = self._down.get(target)
            if cause is None:
                if down is not None:
                    del self._down[target]
                    self._log.info("target %s is up again at %s after %.0f s down (last cause: %s)", target,
                                   shown_url(url), now - down.since, down.cause.text)
                return
            if down is None:
                self._down[target] = _Down(cause, now, now)
                self._log.warning("target %s is down at %s: %s", target, shown_url(url), cause.text)
            elif down.cause.kind != cause.kind:
                self._log.warning("target %s is still down at %s, now: %s (was: %s)", target, shown_url(url),
                                  cause.text, down.cause.text)
                down.cause, down.logged_at = cause, now
            elif now - down.logged_at >= self._repeat_s:
                self._log.warning("target %s is still down at %s for %.0f s: %s", target, shown_url(url),
                                  now - down.since, cause.text)
                down.cause, down.logged_at = cause, now
