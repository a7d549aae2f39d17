"""A minimal HTTP/1.1 client for streamed responses: one keep-alive connection per in-flight request.

It writes the pre-encoded request with one ``sendall`` (``sent_s`` is taken just before it) and hands out body
bytes as they arrive, each read stamped with the kernel's receive time; ``requests`` spends about a millisecond
before the first byte and too much CPU per token (docs/loadgen.md, "The HTTP client"). Standard-library
sockets, so gevent makes them cooperative; HTTPS through ``ssl``; no proxies or redirects. What it reads is
bounded by framing.py, and a body read whole by ``Connection.read_bounded``'s limit.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable, Iterator

from batchscope.loadgen.stream.framing import MAX_HEADER_BYTES, ChunkedDecoder, Endpoint, ProtocolError
from batchscope.wire import receive_stamps
from batchscope.wire.receive_stamps import ANCILLARY_SIZE, TIMESPEC

# Reads take everything there: the kernel merges data waiting in a socket into one block stamped with its last
# arrival, so smaller reads would not time the tokens in it apart, only cost more reads to catch up
RECV_SIZE = 65536
Payload = Callable[[bytes, float], None]  # a piece of a body and the arrival time of the read that completed it


class ConnectFailed(OSError):
    """The server could not be reached (nothing was sent)."""


class Timeout(OSError):
    """No byte arrived within the timeout."""


class StreamBroken(OSError):
    """The connection ended before the response did."""


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
        # reusable again only once this exchange's body has ended cleanly: a connection put back while its
        # response is still due would hand that late response to the next request as its own
        self.reusable = False
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
        arrives on the same socket (hence loadgen.stream.reader). One method for the read and its stamp: every token
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


Follow = Callable[[Connection, Payload], None]  # loadgen.stream.reader.StreamReader.follow: reads a body elsewhere


def _keep_alive(headers: dict[str, str]) -> bool:
    return headers.get("connection", "").lower() != "close"


def _chunked_body(headers: dict[str, str]) -> bool:
    return headers.get("transfer-encoding", "").lower() == "chunked"


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
