"""Bounded reads of a peer's HTTP body: by a deadline and within a byte cap, whatever the peer sends.

``requests`` bounds each socket operation (``timeout=``), not the exchange, and ``reply.text`` / ``reply.json()``
buffer the whole body: an endless or dripping answer holds the reader for ever and takes its memory. Here a
``stream=True`` reply's body is read one socket read at a time, the deadline checked and the size counted after
each. ``request`` is one exchange so bounded, whatever its method and status; ``fetch`` is a GET whose error
status is raised. The exporter's scrapes (batchscope/exporter/fetch.py), the tuner's /metrics samples, Prometheus
queries and Grafana annotations, the calibration's probes and the load generator's pre-flight
(batchscope/loadgen/stream/target.py, which answers redirects and error statuses itself) read their peers through it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import requests
import urllib3.exceptions

# vLLM's /metrics: ~54 KB per engine in 0.32, 64 data-parallel engines ~2.2 MB (docs/exporter.md): 7x that
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
    # one buffer: over 128 KiB a mapping of its own, returned when freed (batchscope/exporter/fetch.py)
    body = bytearray()
    # read1: one socket read per piece, so a drip cannot hold a read past the deadline as read(n) would
    while piece := reply.raw.read1(PIECE_BYTES, decode_content=True):
        body += piece
        if len(body) > max_bytes:
            raise BodyTooLarge(max_bytes)
        if time.monotonic() >= deadline:
            raise FetchTimeout
    return body


@dataclass(frozen=True)
class Answer:
    """A peer's answer, whatever its status: the reply (closed; its status, headers and URL) and its body."""

    reply: requests.Response
    body: Body


def request(session: requests.Session, method: str, url: str, *, deadline: float, max_bytes: int,
            headers: Mapping[str, str] | None = None, json: object = None, follow_redirects: bool = True) -> Answer:
    """One request: the whole answer by ``deadline`` (time.monotonic), its body within ``max_bytes``, else
    FetchTimeout or BodyTooLarge. An error status's body is read within ERROR_MAX_BYTES, and left empty when
    longer (its status says enough). Anything failing once the deadline has passed (a socket read timed out, a
    connection closed meanwhile) is a FetchTimeout."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:  # queued behind stuck jobs until too late
        raise FetchTimeout
    # each socket operation waits at most what was left at the start: a worker overruns its deadline by at most
    # one read (the caller does not wait for it)
    with _late_is_timeout(deadline), session.request(method, url, headers=headers, json=json, stream=True,
                                                     timeout=(remaining, remaining),
                                                     allow_redirects=follow_redirects) as reply:
        return Answer(reply, Body(_answer_body(reply, deadline, max_bytes), reply.headers.get("Content-Type", "")))


def _answer_body(reply: requests.Response, deadline: float, max_bytes: int) -> bytearray:
    # an error's few words are read all the same: the connection then stays open for the next request
    if reply.ok:
        return read_body(reply, deadline, max_bytes)
    try:
        return read_body(reply, deadline, ERROR_MAX_BYTES)
    except BodyTooLarge:
        return bytearray()


@contextlib.contextmanager
def _late_is_timeout(deadline: float) -> Iterator[None]:
    try:
        yield
    except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
        if time.monotonic() >= deadline:
            raise FetchTimeout from exc
        raise


def fetch(session: requests.Session, url: str, *, deadline: float, max_bytes: int,
          headers: Mapping[str, str] | None = None) -> Body:
    """GET ``url`` (``request``): its body, an HTTP error status raised as requests.HTTPError (a FetchTimeout once
    the deadline has passed)."""
    with _late_is_timeout(deadline):
        answer = request(session, "GET", url, deadline=deadline, max_bytes=max_bytes, headers=headers)
        answer.reply.raise_for_status()
    return answer.body
