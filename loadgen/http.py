"""A minimal HTTP/1.1 client for streamed responses: one keep-alive connection per in-flight request.

Why not requests: the measurement has to start when the request bytes leave and stop when each chunk arrives.
``requests.Session.post`` spends about a millisecond preparing a request before the first byte is written, a
bias as large as the 2 ms budget for TTFT, and urllib3's chunk decoding dominates the CPU per streamed token.
This client writes the pre-encoded request with one ``sendall`` (``sent_s`` is taken just before it) and hands
out body bytes as they arrive. Sockets come from the standard library, so gevent (under Locust) makes them
cooperative. HTTPS is supported through ``ssl``; proxies and redirects are not.

Every buffer a peer can fill is bounded (a peer may be broken or hostile; vLLM's chunks are one SSE event each,
hundreds of bytes): a chunk's size line (MAX_CHUNK_LINE_BYTES), a chunk (MAX_CHUNK_BYTES), the head and the
trailers (MAX_HEADER_BYTES), and a body read whole (``Connection.read_bounded``). A size that is not hexadecimal
digits, or is over its bound, is a ProtocolError naming the bound: a negative size once made the decoder append
nothing forever.
"""

from __future__ import annotations

import email.utils
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from datetime import UTC
from urllib.parse import urlsplit

from batchscope import receive_stamps
from batchscope.receive_stamps import ANCILLARY_SIZE, TIMESPEC

# Reads take everything there: the kernel merges data waiting in a socket into one block stamped with its last
# arrival, so smaller reads would not time the tokens in it apart, only cost more reads to catch up
RECV_SIZE = 65536
MAX_HEADER_BYTES = 65536  # the response head, and a chunked body's trailers
MAX_CHUNK_BYTES = 16 << 20  # one chunk's data, 16 MiB
MAX_CHUNK_LINE_BYTES = 4096  # a chunk's size line, extensions included
HEX_DIGITS = b"0123456789abcdefABCDEF"
Payload = Callable[[bytes, float], None]  # a piece of a body and the arrival time of the read that completed it


class ConnectFailed(OSError):
    """The server could not be reached (nothing was sent)."""


class Timeout(OSError):
    """No byte arrived within the timeout."""


class StreamBroken(OSError):
    """The connection ended before the response did."""


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


class ChunkedDecoder:
    """Chunked transfer coding decoded from bytes pushed as they arrive: whole chunk payloads out, the end noticed.

    One decoder for both ways of reading a body: a greenlet pulling it (``Connection.body``) and the process's
    stream reader pushing what each socket delivered (``loadgen.reader``). Linear in the bytes whatever their
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


class Connection:
    """One keep-alive connection; ``post`` returns after the response headers arrive."""

    def __init__(self, endpoint: Endpoint, timeout_s: float, read_timeouts: bool = True) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        # a socket timeout costs gevent a timer per read; a caller that bounds the whole exchange itself
        # (LoadRun, with one gevent.Timeout per request) turns them off
        self.read_timeouts = read_timeouts
        self._sock: socket.socket | None = None
        self._buffer = b""
        self.reusable = False
        self.deadline: float | None = None  # absolute time after which any wait is a Timeout
        self.aborted = False
        self.arrived_s = 0.0  # when the data read last arrived (the kernel's stamp where it gives one)
        self.on_abort: Callable[[], None] | None = None  # wakes a greenlet parked on this connection's body
        self._stamped = False
        self._read_lags = 0.0  # seconds data waited in the socket, summed over the reads of the exchange
        self._reads = 0

    @property
    def is_open(self) -> bool:
        return self._sock is not None

    def abort(self) -> None:
        """End the exchange from another greenlet: its pending wait fails and nothing more is sent."""
        self.aborted = True
        self.close()
        if self.on_abort is not None:
            self.on_abort()

    def read_lag_s(self) -> float | None:
        """How long the data of this exchange waited in the socket before it was read: mean over its reads."""
        return self._read_lags / self._reads if self._reads else None

    def fileno(self) -> int:
        if self._sock is None:
            raise StreamBroken("aborted" if self.aborted else "connection closed")
        return self._sock.fileno()

    def set_blocking(self, blocking: bool) -> None:
        """Non-blocking while the process's stream reader reads it (a read with nothing there raises
        BlockingIOError); back to the connection's timeouts after."""
        if self._sock is not None:
            self._sock.settimeout((self.timeout_s if self.read_timeouts else None) if blocking else 0.0)

    def take_buffer(self) -> bytes:
        """Bytes read past the response head, for a reader that decodes the body elsewhere."""
        buffer, self._buffer = self._buffer, b""
        return buffer

    def put_back(self, leftover: bytes) -> None:
        self._buffer = leftover

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self.reusable = False

    def _connect(self) -> socket.socket:
        endpoint = self.endpoint
        try:
            sock = socket.create_connection((endpoint.host, endpoint.port), timeout=min(self.timeout_s, 10.0))
        except TimeoutError as exc:
            raise Timeout(f"connect timed out: {exc}") from None
        except Timeout:
            raise  # the caller's whole-exchange timer (see Connection.read_timeouts)
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {endpoint.host}:{endpoint.port}: {exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if endpoint.tls:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=endpoint.host)
        else:
            self._stamped = receive_stamps.enable(sock)  # not Linux: the time of the read
        sock.settimeout(self.timeout_s if self.read_timeouts else None)
        self._sock = sock
        self._buffer = b""
        return sock

    def open(self) -> None:
        """Connect now, before the request that will use it is timed; the connection is then reusable."""
        if self._sock is None:
            self._connect()
        self.reusable = True

    def send(self, request: bytes) -> float:
        """Write a whole request; returns the time just before the bytes were handed to the kernel."""
        if self.aborted:
            raise StreamBroken("aborted")
        sock = self._sock if self._sock is not None else self._connect()
        self._read_lags, self._reads = 0.0, 0
        sent = time.time()
        try:
            sock.sendall(request)
        except Timeout:
            raise
        except OSError as exc:
            raise StreamBroken(f"send failed: {exc}") from None
        return sent

    def read_head(self) -> tuple[int, dict[str, str]]:
        while b"\r\n\r\n" not in self._buffer:
            if len(self._buffer) > MAX_HEADER_BYTES:
                raise ProtocolError(f"response head: over {MAX_HEADER_BYTES} bytes (MAX_HEADER_BYTES)")
            self._fill()
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        try:
            status = int(status_line.split(" ", 2)[1])
        except (IndexError, ValueError):
            raise ProtocolError(f"status line: {status_line[:80]!r} is not HTTP's") from None
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return status, headers

    def read_body(self, headers: dict[str, str], on_payload: Payload, follow: Follow | None = None) -> None:
        """Hand the body to ``on_payload`` piece by piece with the arrival time of each; a chunked body on a
        socket with receive stamps goes through ``follow`` (the process's stream reader) when one is given."""
        if follow is not None and self._stamped and _chunked_body(headers):
            self.reusable = False
            follow(self, on_payload)
            self.reusable = _keep_alive(headers)
            return
        for piece in self.body(headers):
            on_payload(piece, self.arrived_s)

    def read_bounded(self, headers: dict[str, str], limit: int) -> tuple[bytes, bool]:
        """The whole body and True, or its first ``limit`` bytes and False when it is longer: the rest is left
        unread and the connection closed (a body that never ends costs ``limit`` bytes, not the host's memory)."""
        body = bytearray()
        for piece in self.body(headers):
            body += piece
            if len(body) > limit:
                self.close()
                return bytes(body[:limit]), False
        return bytes(body), True

    def body(self, headers: dict[str, str]) -> Iterator[bytes]:
        """The response body as it arrives; leaves the connection reusable when it ends cleanly.

        Returns the decoding generator itself rather than wrapping it: every token passes through here.
        """
        self.reusable = False
        keep_alive = _keep_alive(headers)
        if _chunked_body(headers):
            return self._chunked(keep_alive)
        if "content-length" in headers:
            return self._sized(int(headers["content-length"]), keep_alive)
        return self._until_close()

    def _fill(self, want: int = RECV_SIZE) -> None:
        """Read at most ``want`` (> 0) bytes, at least one, into the buffer (``arrived_s``: see ``read``)."""
        self._buffer += self.read(want)

    def read(self, want: int = RECV_SIZE) -> bytes:
        """At most ``want`` (> 0) bytes, at least one; ``arrived_s`` becomes the kernel's receive time of the
        data, not the time this greenlet got to read it. Raises BlockingIOError on a non-blocking socket with
        nothing to read.

        A busy client reads late: timing chunks by the read would add its own scheduling delay to every TTFT
        and ITL. For TCP the kernel stamps a read with the arrival of the last segment it returns, and segments
        left waiting merge under the later one's stamp: the stamps are exact only for data read before more
        arrives on the same socket (hence loadgen.reader). One method for the read and its stamp: every token
        passes through here, and a call less per read counts.
        """
        sock = self._sock
        if sock is None:
            raise StreamBroken("aborted" if self.aborted else "connection closed")
        # the socket's own timeout (timeout_s) catches a silent server; the deadline, checked after each read
        # (setting a fresh socket timeout per read costs a timer per token), a trickling one
        try:
            if self._stamped:
                data, ancillary, _flags, _address = sock.recvmsg(
                    want if want < RECV_SIZE else RECV_SIZE, ANCILLARY_SIZE)
                # SO_TIMESTAMPNS is the only ancillary data asked for: parsed here, not by receive_stamps.arrival,
                # a call less per token
                if ancillary and len(ancillary[0][2]) >= TIMESPEC.size:
                    seconds, nanoseconds = TIMESPEC.unpack_from(ancillary[0][2])
                    arrived = seconds + nanoseconds * 1e-9
                else:
                    arrived = time.time()
            else:
                data = sock.recv(want if want < RECV_SIZE else RECV_SIZE)
                arrived = time.time()
        except (TimeoutError, BlockingIOError):
            if sock.gettimeout() == 0.0:
                raise BlockingIOError from None
            raise Timeout(f"no response within {self.timeout_s} s") from None
        except Timeout:
            raise
        except OSError as exc:
            raise StreamBroken(f"connection error: {exc}") from None
        if not data:
            raise StreamBroken("connection closed by the server")
        self.arrived_s = arrived
        self._read_lags += time.time() - arrived
        self._reads += 1
        if self.deadline is not None and arrived > self.deadline:
            raise Timeout(f"no complete response within {self.timeout_s} s")
        return data

    def _sized(self, remaining: int, keep_alive: bool) -> Iterator[bytes]:
        """A body of ``remaining`` bytes, in pieces as they arrive."""
        while remaining > 0:
            if not self._buffer:
                self._fill(remaining)
            piece, self._buffer = self._buffer[:remaining], self._buffer[remaining:]
            remaining -= len(piece)
            yield piece
        self.reusable = keep_alive

    def _chunked(self, keep_alive: bool) -> Iterator[bytes]:
        decoder = ChunkedDecoder(self._buffer)
        self._buffer = b""
        data = b""
        while True:
            yield from decoder.payloads(data)
            if decoder.ended:
                self._buffer = decoder.buffer
                self.reusable = keep_alive
                return
            data = self.read()

    def _until_close(self) -> Iterator[bytes]:
        if self._buffer:
            yield self._buffer
            self._buffer = b""
        while True:
            try:
                self._fill()
            except StreamBroken:
                return
            yield self._buffer
            self._buffer = b""


Follow = Callable[[Connection, Payload], None]  # loadgen.reader.StreamReader.follow: reads a body elsewhere


def _keep_alive(headers: dict[str, str]) -> bool:
    return headers.get("connection", "").lower() != "close"


def _chunked_body(headers: dict[str, str]) -> bool:
    return headers.get("transfer-encoding", "").lower() == "chunked"


def encode_request(endpoint: Endpoint, body: bytes, headers: dict[str, str]) -> bytes:
    """A POST request with a JSON body, ready for one sendall."""
    lines = [f"POST {endpoint.path} HTTP/1.1", f"Host: {endpoint.host_header}", f"Content-Length: {len(body)}",
             "Accept: text/event-stream, application/json", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class ConnectionPool:
    """Idle keep-alive connections to one endpoint, handed out one per request."""

    def __init__(self, endpoint: Endpoint, timeout_s: float, read_timeouts: bool = True) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.read_timeouts = read_timeouts
        self._idle: list[Connection] = []

    def acquire(self) -> Connection:
        return self._idle.pop() if self._idle else Connection(self.endpoint, self.timeout_s, self.read_timeouts)

    def prepare(self) -> None:
        """Open one idle connection ahead of the first request; a failure is left for that request to meet (and
        count as its outcome), so nothing is raised here."""
        connection = Connection(self.endpoint, self.timeout_s, self.read_timeouts)
        try:
            connection.open()
        except OSError:  # ConnectFailed, Timeout (both OSErrors) or a failed TLS handshake
            connection.close()
            return
        self._idle.append(connection)

    def release(self, connection: Connection) -> None:
        if connection.reusable:
            self._idle.append(connection)
        else:
            connection.close()
