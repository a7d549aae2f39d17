"""When each request's first bytes reached the server process: the arrival stamp of the ground-truth log.

aiohttp runs a request's handler only after the event loop has worked through everything queued before it (a
step's burst of token writes, say), often a millisecond or more after the bytes arrived. The ground-truth log is
what the load generator's timing is checked against, so it stamps arrival where the bytes are first seen: in
the connection protocol's ``data_received``, wrapped around aiohttp's. The engine's own timeline keeps vLLM's
definition (arrival when the handler takes the request), so /metrics are unchanged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class ArrivalStamps:
    """The first-byte time of the request each connection is serving, until it is answered."""

    def __init__(self) -> None:
        self._pending: dict[asyncio.BaseTransport, float] = {}

    def protocol_factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A factory for ``loop.create_server``: aiohttp's protocol, stamped."""
        return lambda: _StampingProtocol(inner(), self._pending)

    def received(self, transport: asyncio.BaseTransport | None) -> float | None:
        """When the first bytes of the request ``transport`` is serving arrived (None: not seen, e.g. closed)."""
        return self._pending.get(transport) if transport is not None else None

    def forget(self, transport: asyncio.BaseTransport | None) -> None:
        """The request is answered: the connection's next bytes start the next request."""
        if transport is not None:
            self._pending.pop(transport, None)


class _StampingProtocol(asyncio.Protocol):
    """Delegates every callback to aiohttp's protocol; notes the time of the first bytes of each request."""

    def __init__(self, inner: asyncio.Protocol, pending: dict[asyncio.BaseTransport, float]) -> None:
        self._inner = inner
        self._pending = pending
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._transport is not None and self._transport not in self._pending:
            self._pending[self._transport] = time.time()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._pending.pop(self._transport, None)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()
