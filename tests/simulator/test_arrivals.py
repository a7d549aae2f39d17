"""The ground truth's arrival stamps: the first bytes of each request on a connection, kept until it is answered,
stamped when they reached the socket, over real loopback connections served by asyncio's loop and uvloop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable, Coroutine

import pytest
import uvloop

from batchscope.simulator.arrivals import ArrivalStamps
from batchscope.wire import receive_stamps

LOOPS = pytest.mark.parametrize("new_loop", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
BUSY_S = 0.2  # the event loop kept busy this long after a request was sent


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


@contextlib.asynccontextmanager
async def _connected() -> AsyncIterator[tuple[ArrivalStamps, Recorder, socket.socket]]:
    """A client connected to a loopback server stamped as the simulator stamps (its protocol: one Recorder)."""
    stamps = ArrivalStamps()
    inner = Recorder()
    server = await asyncio.get_running_loop().create_server(stamps.protocol_factory(lambda: inner), "127.0.0.1", 0)
    stamps.stamp_listener(server.sockets[0])
    try:
        with socket.create_connection(server.sockets[0].getsockname()[:2]) as client:
            yield stamps, inner, client
    finally:
        server.close()


def _kernel_stamps() -> bool:
    with socket.socket() as probe:
        return receive_stamps.enable(probe)


async def _scenario() -> None:
    async with _connected() as (stamps, inner, client):
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
    deadline = time.monotonic() + 5
    while not inner.lost and time.monotonic() < deadline:  # the client has hung up
        await asyncio.sleep(0.01)
    assert inner.lost and stamps.received(inner.transport) is None  # a closed connection leaves nothing behind


def _run(new_loop: Callable[[], asyncio.AbstractEventLoop], scenario: Coroutine) -> None:
    with asyncio.Runner(loop_factory=new_loop) as runner:
        runner.run(scenario)


@LOOPS
def test_arrival_is_the_first_byte_of_each_request_until_it_is_answered(new_loop):
    _run(new_loop, _scenario())


async def _busy_loop_scenario() -> None:
    async with _connected() as (stamps, inner, client):
        for request in (b"a new connection's first request", b"the next request on it"):
            sent = time.time()
            client.sendall(request)
            time.sleep(BUSY_S)  # the loop is busy (a burst of token writes, say): nothing reads meanwhile
            await asyncio.wait_for(inner.received.wait(), 5)
            arrived = stamps.received(inner.transport)
            assert arrived is not None and sent <= arrived < sent + BUSY_S / 4, (request, arrived - sent)
            assert inner.data == request
            inner.data = b""
            inner.received.clear()
            stamps.forget(inner.transport)


@pytest.mark.skipif(not _kernel_stamps(), reason="the kernel does not stamp received data")
@LOOPS
def test_arrival_is_when_the_bytes_reached_the_socket_not_when_a_busy_loop_read_them(new_loop):
    _run(new_loop, _busy_loop_scenario())


async def _paused_scenario() -> None:
    async with _connected() as (stamps, inner, client):
        client.sendall(b"head")
        await asyncio.wait_for(inner.received.wait(), 5)
        for _ in range(3):  # the take-over happens on the loop's next turn
            await asyncio.sleep(0)
        inner.received.clear()
        inner.transport.pause_reading()  # type: ignore[union-attr]  # aiohttp's flow control
        assert not inner.transport.is_reading()  # type: ignore[union-attr]
        sent = time.time()
        client.sendall(b", body")
        for _ in range(10):  # turns in which a reader would have taken the bytes that are there
            await asyncio.sleep(0)
        assert inner.data == b"head"
        inner.transport.resume_reading()  # type: ignore[union-attr]
        await asyncio.wait_for(inner.received.wait(), 5)
        assert inner.data == b"head, body"
        stamps.forget(inner.transport)
        inner.received.clear()
        client.sendall(b"next")
        await asyncio.wait_for(inner.received.wait(), 5)
        assert sent <= stamps.received(inner.transport) <= time.time()  # type: ignore[operator]


@LOOPS
def test_flow_control_pauses_and_resumes_the_taken_over_reads(new_loop):
    _run(new_loop, _paused_scenario())
