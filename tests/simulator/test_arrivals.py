"""The ground truth's arrival stamps: the first bytes of each request on a connection, kept until it is answered,
over a real loopback connection served by asyncio."""

from __future__ import annotations

import asyncio
import socket
import time

from simulator.arrivals import ArrivalStamps


class Recorder(asyncio.Protocol):
    """Stands in for aiohttp's protocol: keeps what the wrapper hands it."""

    def __init__(self) -> None:
        self.transport: asyncio.BaseTransport | None = None
        self.data = b""
        self.lost = False
        self.received = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data += data
        self.received.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


async def _scenario() -> None:
    stamps = ArrivalStamps()
    inner = Recorder()
    server = await asyncio.get_running_loop().create_server(stamps.protocol_factory(lambda: inner), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    try:
        sent = time.time()
        client.sendall(b"first request, part one")
        await asyncio.wait_for(inner.received.wait(), 5)
        first = stamps.received(inner.transport)
        assert first is not None and sent <= first <= time.time()
        inner.received.clear()
        client.sendall(b", part two")  # the same request's later bytes keep its first stamp
        await asyncio.wait_for(inner.received.wait(), 5)
        assert stamps.received(inner.transport) == first
        assert inner.data == b"first request, part one, part two"  # everything reached the wrapped protocol

        stamps.forget(inner.transport)  # answered: the next bytes are the next request's
        assert stamps.received(inner.transport) is None
        inner.received.clear()
        client.sendall(b"second request")
        await asyncio.wait_for(inner.received.wait(), 5)
        second = stamps.received(inner.transport)
        assert second is not None and second > first
    finally:
        client.close()
        deadline = time.monotonic() + 5
        while not inner.lost and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        server.close()
    assert inner.lost and stamps.received(inner.transport) is None  # a closed connection leaves nothing behind


def test_arrival_is_the_first_byte_of_each_request_until_it_is_answered():
    asyncio.run(_scenario())
