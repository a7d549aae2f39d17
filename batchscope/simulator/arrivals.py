"""When each request reached the server: the arrival stamp of the ground-truth log.

On Linux the connection's reads are taken over from the event loop's transport, so each request is stamped with
the kernel's receive time; elsewhere with when its bytes reach the protocol. Why, and what stays vLLM's
definition: docs/simulator.md, "Arrival stamps of the ground-truth log".
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable

from batchscope.wire import receive_stamps

READ_SIZE = 65536  # a usual request in one read; a larger one takes several (the first stamp is its arrival)


class ArrivalStamps:
    """The arrival time of the request each connection is serving, until it is answered."""

    def __init__(self) -> None:
        self._pending: dict[object, float] = {}  # the transport aiohttp sees -> its request's arrival

    def stamp_listener(self, listener: socket.socket) -> None:
        """Stamp what the listening socket's connections receive from their first byte (they inherit the option;
        data that came before a socket asked for stamps has none)."""
        receive_stamps.enable(listener)

    def protocol_factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A factory for ``loop.create_server``: aiohttp's protocol, stamped."""
        return lambda: _StampingProtocol(inner(), self._pending)

    def received(self, transport: object | None) -> float | None:
        """When the request ``transport`` is serving arrived (None: not seen, e.g. closed)."""
        return self._pending.get(transport) if transport is not None else None

    def forget(self, transport: object | None) -> None:
        """The request is answered: the connection's next bytes start the next request."""
        if transport is not None:
            self._pending.pop(transport, None)


class _StampingProtocol(asyncio.Protocol):
    """Delegates every callback to aiohttp's protocol; notes when the first bytes of each request arrived."""

    def __init__(self, inner: asyncio.Protocol, pending: dict[object, float]) -> None:
        self._inner = inner
        self._pending = pending
        self._seen: object | None = None  # the transport the inner protocol was given: its requests' key
        self._reads: _StampedReads | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = _stamped_duplicate(transport)
        if sock is None:
            self._seen = transport
            self._inner.connection_made(transport)
            return
        self._reads = _StampedReads(transport, sock, self)
        self._seen = self._reads
        self._inner.connection_made(self._reads)  # type: ignore[arg-type]  # a transport in all but name
        self._reads.take_over()

    def data_received(self, data: bytes) -> None:
        # the event loop's transport read these: no kernel stamp, or bytes it took before the take-over
        self.received(data, time.time())

    def received(self, data: bytes, arrived: float) -> None:
        if self._seen is not None and self._seen not in self._pending:
            self._pending[self._seen] = arrived
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._reads is not None:
            self._reads.release()
        if self._seen is not None:
            self._pending.pop(self._seen, None)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


def _stamped_duplicate(transport: asyncio.BaseTransport) -> socket.socket | None:
    """A second descriptor of the transport's plain TCP socket, stamping received data; None where it cannot."""
    raw = transport.get_extra_info("socket")
    if raw is None or transport.get_extra_info("sslcontext") is not None:
        return None  # TLS bytes must go through the transport's own decryption
    try:
        sock = socket.socket(fileno=os.dup(raw.fileno()))
    except OSError:
        return None
    if not receive_stamps.enable(sock):
        sock.close()
        return None
    sock.setblocking(False)
    return sock


class _StampedReads:
    """The connection's transport as aiohttp sees it: reads taken here, stamped; everything else is the loop's.

    The event loop's transport starts reading after ``connection_made`` returns, so the take-over reads what is
    already there (a new connection's first request usually is) and stops the transport's reads on the loop's
    next turn. aiohttp's flow control (``pause_reading``/``resume_reading``) lands here and governs these reads.
    """

    def __init__(self, transport: asyncio.BaseTransport, sock: socket.socket, protocol: _StampingProtocol) -> None:
        self._transport = transport
        self._sock: socket.socket | None = sock
        self._protocol = protocol
        self._loop = asyncio.get_running_loop()
        self._taken = False  # the transport's own reads are stopped
        self._paused = False  # by aiohttp
        self._reading = False  # ours are on
        # aiohttp calls these for every token written: bound here, not looked up through __getattr__ each time
        self.write = transport.write  # type: ignore[attr-defined]  # a WriteTransport
        self.writelines = transport.writelines  # type: ignore[attr-defined]
        self.is_closing = transport.is_closing

    def __getattr__(self, name: str) -> object:  # get_extra_info, set_write_buffer_limits, ...
        return getattr(self._transport, name)

    def take_over(self) -> None:
        self._read_ready()
        self._loop.call_soon(self._stop_transport_reads)

    def _stop_transport_reads(self) -> None:
        if self._sock is None or self._transport.is_closing():
            return
        self._transport.pause_reading()  # type: ignore[attr-defined]  # a ReadTransport
        self._taken = True
        self._follow_pause()

    def pause_reading(self) -> None:
        self._paused = True
        self._follow_pause()

    def resume_reading(self) -> None:
        self._paused = False
        self._follow_pause()

    def is_reading(self) -> bool:
        return not self._paused and not self._transport.is_closing()

    def _follow_pause(self) -> None:
        if not self._taken:
            transport = self._transport
            transport.pause_reading() if self._paused else transport.resume_reading()  # type: ignore[attr-defined]
        elif self._paused or self._sock is None:
            self._stop_reading()
        elif not self._reading:
            self._loop.add_reader(self._sock.fileno(), self._read_ready)
            self._reading = True

    def _stop_reading(self) -> None:
        if self._reading and self._sock is not None:
            self._loop.remove_reader(self._sock.fileno())
        self._reading = False

    def _read_ready(self) -> None:
        assert self._sock is not None, "reads stop before the socket is released"
        try:
            data, ancillary, _flags, _address = self._sock.recvmsg(READ_SIZE, receive_stamps.ANCILLARY_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset by the client: the connection ends as the transport would end it
            self._stop_reading()
            self._transport.abort()  # type: ignore[attr-defined]
            return
        if not data:  # the client closed its side
            self._stop_reading()
            if not self._protocol.eof_received():
                self._transport.close()
            return
        self._protocol.received(data, receive_stamps.arrival(ancillary) or time.time())

    def close(self) -> None:
        self._stop_reading()  # a closing transport reads no more
        self._transport.close()

    def abort(self) -> None:
        self._stop_reading()
        self._transport.abort()  # type: ignore[attr-defined]

    def release(self) -> None:
        """The connection is gone: stop reading and close the duplicate descriptor."""
        self._stop_reading()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
