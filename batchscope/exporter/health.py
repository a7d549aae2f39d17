"""Saying why a target is down: the cause of a failed fetch (a kind and a line for the log, a bounded reason for
``batchscope_scrape_error_info``), and a rate-limited log line per target.

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
import urllib3.exceptions

from batchscope.inputs.secrets import MASK
from batchscope.vllm.scrape import Unreadable
from batchscope.wire.bounded_read import BodyTooLarge, FetchTimeout

log = logging.getLogger("batchscope.exporter")
REPEAT_S = 60.0
# batchscope_scrape_error_info's reason label: a bounded set, whatever the upstream sends
REASONS = ("connect", "timeout", "too_large", "http_status", "unparseable", "protocol")


@dataclass(frozen=True)
class DownCause:
    """Why a fetch failed: ``kind`` is what the rate limit compares, ``text`` what the log line says, ``reason``
    the metric's label (one of REASONS)."""

    kind: str
    text: str
    reason: str


def down_cause(exc: BaseException, timeout_s: float) -> DownCause:
    """Classify a failed fetch: refused, timeout, too large, HTTP status, unparseable, or another connection or
    protocol problem (a /metrics read's ``scrape.Unreadable`` by the failure it wraps)."""
    if isinstance(exc, Unreadable) and exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        status = f"HTTP {exc.response.status_code}"
        return DownCause(status, f"{status} {exc.response.reason or ''}".rstrip(), "http_status")
    if isinstance(exc, requests.Timeout | FetchTimeout | urllib3.exceptions.TimeoutError):
        return DownCause("timeout", f"timeout after {timeout_s:g} s", "timeout")
    if isinstance(exc, BodyTooLarge):
        return DownCause("too_large", str(exc), "too_large")
    if isinstance(exc, requests.ConnectionError | urllib3.exceptions.ProtocolError):
        return _connection_cause(str(exc))
    if isinstance(exc, ValueError):  # the body is not a text exposition, JSON, or text in its charset
        return DownCause("unparseable", f"unparseable: {str(exc)[:160]}", "unparseable")
    return DownCause("protocol", f"{type(exc).__name__}: {str(exc)[:160]}", "protocol")


def _connection_cause(text: str) -> DownCause:
    if "Connection refused" in text:
        return DownCause("refused", "connection refused", "connect")
    if "resolve" in text or "Name or service not known" in text:
        return DownCause("unresolvable", "cannot resolve the host name", "connect")
    if "Connection aborted" in text or "reset" in text.lower() or "Connection broken" in text:
        return DownCause("closed", "connection closed by the target", "connect")
    return DownCause("connection", f"connection error: {text[:160]}", "connect")


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
