"""HTTP/1.1 framing without I/O: the URL's parts, the request's bytes, a chunked body decoded as its bytes arrive,
Retry-After; and the bounds on what a peer can make this client buffer (http.py does the socket I/O).

Every buffer a peer can fill is bounded (a peer may be broken or hostile; vLLM's chunks are one SSE event each,
hundreds of bytes): a chunk's size line (MAX_CHUNK_LINE_BYTES), a chunk (MAX_CHUNK_BYTES), the head and the
trailers (MAX_HEADER_BYTES). A size that is not hexadecimal digits, or is over its bound, is a ProtocolError
naming the bound (a negative size would make the decoder append nothing forever).
"""

from __future__ import annotations

import email.utils
import time
from datetime import UTC
from urllib.parse import urlsplit

MAX_HEADER_BYTES = 65536  # the response head, and a chunked body's trailers
MAX_CHUNK_BYTES = 16 << 20  # one chunk's data, 16 MiB
MAX_CHUNK_LINE_BYTES = 4096  # a chunk's size line, extensions included
HEX_DIGITS = b"0123456789abcdefABCDEF"


class ProtocolError(Exception):
    """The peer's answer breaks HTTP/1.1's framing or vLLM's stream format, or goes over one of this client's
    bounds (named in the message): it cannot be read, and the connection is not reused."""


class Endpoint:
    """A parsed URL: where to connect and what to put in the request line."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url: expected http(s)://host[:port]/path, got {url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.host_header = parts.netloc


def encode_request(endpoint: Endpoint, body: bytes, headers: dict[str, str]) -> bytes:
    """A POST request with a JSON body, ready for one sendall."""
    lines = [f"POST {endpoint.path} HTTP/1.1", f"Host: {endpoint.host_header}", f"Content-Length: {len(body)}",
             "Accept: text/event-stream, application/json", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class ChunkedDecoder:
    """Chunked transfer coding decoded from bytes pushed as they arrive: whole chunk payloads out, the end noticed.

    One decoder for both ways of reading a body: a greenlet pulling it (``Connection.body``) and the process's
    stream reader pushing what each socket delivered (``loadgen.stream.reader``). Linear in the bytes whatever their
    framing: a chunk longer than the reads bringing it is gathered in parts and joined once, and many small
    chunks in one read are cut out by position, not by slicing off the rest after each.
    """

    __slots__ = ("buffer", "ended", "_parts", "_missing")

    def __init__(self, buffer: bytes = b"") -> None:
        self.buffer = buffer  # bytes not decoded yet; after the end, whatever followed it
        self.ended = False
        self._parts: list[bytes] = []  # the start of a frame still ``_missing`` bytes short
        self._missing = 0

    def payloads(self, data: bytes) -> list[bytes]:
        """The payloads of the frames ``data`` completes (trailers after the last chunk are skipped).

        ProtocolError for a size line that is not one (see ``chunk_size``), a size line, a chunk or trailers over
        their bound, or a chunk's data not followed by CRLF: whatever buffers here stays under MAX_CHUNK_BYTES
        plus a read.
        """
        if self._missing:
            if len(data) < self._missing:
                self._parts.append(data)
                self._missing -= len(data)
                return []
            buffer, self._parts, self._missing = b"".join((*self._parts, data)), [], 0
        else:
            buffer = self.buffer + data if self.buffer else data
        out: list[bytes] = []
        position = 0
        while True:
            line_end = buffer.find(b"\r\n", position, position + MAX_CHUNK_LINE_BYTES + 2)
            if line_end < 0:
                if len(buffer) - position > MAX_CHUNK_LINE_BYTES:
                    raise ProtocolError(f"chunk size line: no end in {MAX_CHUNK_LINE_BYTES} bytes "
                                        "(MAX_CHUNK_LINE_BYTES)")
                break
            size = chunk_size(buffer[position:line_end])
            if size == 0:
                end = buffer.find(b"\r\n\r\n", line_end)  # the last chunk, trailers if any, a blank line
                if end >= 0:
                    self.ended = True
                    position = end + 4
                elif len(buffer) - line_end > MAX_HEADER_BYTES:
                    raise ProtocolError(f"chunked trailers: over {MAX_HEADER_BYTES} bytes (MAX_HEADER_BYTES)")
                break
            frame_end = line_end + size + 4  # the size line's CRLF, the data, its CRLF
            if len(buffer) < frame_end:
                self._parts, self._missing = [buffer[position:]], frame_end - len(buffer)
                position = len(buffer)
                break
            if not buffer.startswith(b"\r\n", frame_end - 2):
                raise ProtocolError(f"chunk: its {size} bytes of data are not followed by CRLF")
            out.append(buffer[line_end + 2:frame_end - 2])
            position = frame_end
        self.buffer = buffer[position:] if position else buffer
        return out


def chunk_size(line: bytes) -> int:
    """A chunk's size from its size line: hexadecimal digits, then maybe ';' and extensions (which the servers we
    target don't send). ProtocolError for anything else (a sign, '0x', spaces, '_') or a size over
    MAX_CHUNK_BYTES."""
    try:
        size = int(line, 16)
    except ValueError:  # extensions, or no size at all
        size = -1
    # every size line passes here: int() takes signs, spaces, '_' and a '0x' prefix too, which these cheap checks
    # (a tenth of a microsecond; ``in`` would take three) refuse: 120 is "x", and | 32 makes "X" one
    if 0 <= size <= MAX_CHUNK_BYTES and line.isalnum() and (len(line) < 2 or line[1] | 32 != 120):
        return size
    return _strict_chunk_size(line)


def _strict_chunk_size(line: bytes) -> int:
    digits = line.split(b";", 1)[0].rstrip(b" \t")
    if not digits or digits.translate(None, HEX_DIGITS):
        raise ProtocolError(f"chunk size line: {line[:40]!r} is not hexadecimal digits (a size of 0 to "
                            f"{MAX_CHUNK_BYTES >> 20} MiB, MAX_CHUNK_BYTES)")
    size = int(digits, 16)
    if size > MAX_CHUNK_BYTES:
        raise ProtocolError(f"chunk size: {size} bytes is over the {MAX_CHUNK_BYTES >> 20} MiB a chunk may have "
                            "(MAX_CHUNK_BYTES)")
    return size


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """The wait a Retry-After header asks for, seconds (delay-seconds, or an HTTP-date: RFC 9110 §10.2.3; a
    date past is 0); None without one, or when it is neither."""
    value = (value or "").strip()
    if not value:
        return None
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # "-0000" parses naive; an HTTP-date is GMT
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
