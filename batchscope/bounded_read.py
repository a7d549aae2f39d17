"""Bounded reads of a peer's HTTP body: by a deadline and within a byte cap, whatever the peer sends.

``requests`` bounds each socket operation (``timeout=``), not the exchange, and ``reply.text`` / ``reply.json()``
buffer the whole body: an endless or dripping answer holds the reader for ever and takes its memory. Here a
``stream=True`` reply's body is read one socket read at a time, the deadline checked and the size counted after
each. The exporter's scrapes (exporter/fetch.py), the tuner's /metrics samples, Prometheus queries and Grafana
annotations, and the load generator's pre-flight (loadgen/target.py) read their peers through it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass

import requests
import urllib3.exceptions

# vLLM's /metrics: ~54 KB per engine in 0.32, 64 data-parallel engines ~2.2 MB (exporter/fetch.py): 7x that
METRICS_MAX_BYTES = 16 << 20
JSON_MAX_BYTES = 1 << 20  # vLLM's /v1/models, /version, /tokenize and a one-token completion: a few KB at most
ERROR_MAX_BYTES = 64 << 10  # what is read of an error status's body
PIECE_BYTES = 64 << 10  # at most this much per socket read


class FetchTimeout(Exception):
    """The deadline passed before the answer was complete."""


class BodyTooLarge(Exception):
    """The body (declared or read so far) is over its cap."""

    def __init__(self, cap_bytes: int, declared: int | None = None) -> None:
        said = f" (Content-Length {declared})" if declared is not None else ""
        super().__init__(f"larger than the {cap_bytes / (1 << 20):g} MiB cap{said}")


@dataclass(frozen=True)
class Body:
    """A complete answer's body and its Content-Type."""

    data: bytes | bytearray
    content_type: str

    def text(self) -> str:
        """The body decoded in its declared charset, else UTF-8 (the text exposition format's and JSON's);
        ValueError when the bytes are not in that charset or the charset is unknown."""
        charset = charset_of(self.content_type) or "utf-8"
        try:
            return self.data.decode(charset)
        except LookupError:
            raise ValueError(f"unknown charset {charset!r}") from None


def charset_of(content_type: str) -> str | None:
    """The charset parameter of a Content-Type header value, if any."""
    for parameter in content_type.split(";")[1:]:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"'):
            return value.strip().strip('"')
    return None


def read_body(reply: requests.Response, deadline: float, max_bytes: int) -> bytearray:
    """The body of a ``stream=True`` reply, by ``deadline`` (time.monotonic) and at most ``max_bytes``, else
    FetchTimeout or BodyTooLarge; a declared Content-Length over the cap is refused before any body is read."""
    declared = reply.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge(max_bytes, int(declared))
    body = bytearray()  # one buffer: over 128 KiB a mapping of its own, returned when freed (exporter/fetch.py)
    # read1: one socket read per piece, so a drip cannot hold a read past the deadline as read(n) would
    while piece := reply.raw.read1(PIECE_BYTES, decode_content=True):
        body += piece
        if len(body) > max_bytes:
            raise BodyTooLarge(max_bytes)
        if time.monotonic() >= deadline:
            raise FetchTimeout
    return body


def fetch(session: requests.Session, url: str, *, deadline: float, max_bytes: int,
          headers: Mapping[str, str] | None = None) -> Body:
    """GET ``url``: the whole body by ``deadline`` (time.monotonic) and at most ``max_bytes``, else FetchTimeout
    or BodyTooLarge; an HTTP error status is requests.HTTPError. Anything failing once the deadline has passed
    (a socket read timed out, a connection closed meanwhile) is a FetchTimeout."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:  # queued behind stuck jobs until too late
        raise FetchTimeout
    try:
        # each socket operation waits at most what was left at the start: a worker overruns its deadline by at
        # most one read (the caller does not wait for it)
        with session.get(url, headers=headers, stream=True, timeout=(remaining, remaining)) as reply:
            if not reply.ok:
                # its few words are read, so the connection stays open for the next scrape
                with contextlib.suppress(BodyTooLarge):
                    read_body(reply, deadline, ERROR_MAX_BYTES)
                reply.raise_for_status()
            return Body(read_body(reply, deadline, max_bytes), reply.headers.get("Content-Type", ""))
    except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
        if time.monotonic() >= deadline:
            raise FetchTimeout from exc
        raise
