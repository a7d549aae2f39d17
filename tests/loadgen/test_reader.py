"""The process's stream reader (loadgen.stream.reader) over loopback sockets fed canned bytes by server threads: the
same body as a greenlet's own reads, stamps of when bytes arrived, and every way a body can end."""

from __future__ import annotations

import socket
import threading
import time

import gevent
import pytest

from batchscope.loadgen.stream.framing import Endpoint, encode_request
from batchscope.loadgen.stream.http import Connection, StreamBroken, Timeout
from batchscope.loadgen.stream.reader import StreamReader
from tests.loadgen.test_frames import HEAD, chunked, exchange

Piece = tuple[float, bytes]  # (pause before it, bytes)


def paced_server(pieces: list[Piece], close: bool = False) -> tuple[Endpoint, threading.Thread]:
    """One connection: reads a request head, writes each piece after its pause, then waits for the client to
    hang up (or closes at once with ``close``)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with listener, listener.accept()[0] as conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            received = b""
            while b"\r\n\r\n" not in received:
                received += conn.recv(4096)
            for pause, data in pieces:
                time.sleep(pause)  # the server's pacing, not synchronisation: the client never sleeps
                conn.sendall(data)
            if not close:
                conn.settimeout(10)
                conn.recv(1)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return Endpoint(f"http://127.0.0.1:{listener.getsockname()[1]}/v1/completions"), thread


def opened(endpoint: Endpoint, read_timeouts: bool = True, timeout_s: float = 5) -> tuple[Connection, dict]:
    connection = Connection(endpoint, timeout_s=timeout_s, read_timeouts=read_timeouts)
    connection.send(encode_request(endpoint, b"{}", {}))
    status, headers = connection.read_head()
    assert status == 200
    return connection, headers


def follow_all(connection: Connection, headers: dict, reader: StreamReader) -> list[tuple[bytes, float]]:
    received: list[tuple[bytes, float]] = []
    connection.read_body(headers, lambda payload, arrived: received.append((payload, arrived)), reader.follow)
    return received


def test_the_reader_hands_on_the_same_payloads_as_a_greenlets_own_reads():
    frames = [b"a" * 300, b"b" * 7, b"c" * 1000, b"d", b"e" * 70000, b"f" * 40]
    reply = HEAD + chunked(*frames)
    split = len(HEAD) + 150  # the head and part of the first frame in one send, the rest in pieces
    pieces = [(0, reply[:split])] + [(0.002, reply[i:i + 5000]) for i in range(split, len(reply), 5000)]
    endpoint, thread = paced_server(pieces)
    connection, headers = opened(endpoint)
    try:
        received = follow_all(connection, headers, StreamReader())
        assert [payload for payload, _ in received] == frames
        assert connection.reusable  # the last chunk ended the body cleanly
        _, pulled = exchange(reply)
        assert pulled == frames
    finally:
        connection.close()
        thread.join(timeout=5)


def test_payloads_are_stamped_when_they_arrived_and_the_connection_is_reusable_after():
    pause = 0.05
    frames = [b"one", b"two", b"three"]
    endpoint, thread = paced_server([(0, HEAD)] + [(pause, b"%x\r\n%s\r\n" % (len(f), f)) for f in frames]
                                    + [(0, b"0\r\n\r\n")])
    connection, headers = opened(endpoint)
    try:
        received = follow_all(connection, headers, StreamReader())
        stamps = [arrived for _, arrived in received]
        assert [payload for payload, _ in received] == frames
        gaps = [later - earlier for earlier, later in zip(stamps, stamps[1:], strict=False)]
        assert all(pause * 0.8 < gap < pause * 3 for gap in gaps), gaps
        assert connection.reusable and connection.is_open
    finally:
        connection.close()
        thread.join(timeout=5)


def test_streams_of_several_greenlets_share_one_reader():
    reader = StreamReader()
    servers = [paced_server([(0, HEAD)] + [(0.01, b"%x\r\n%s\r\n" % (2, b"%02d" % i)) for i in range(10)]
                            + [(0, b"0\r\n\r\n")]) for _ in range(4)]
    opened_ = [opened(endpoint) for endpoint, _ in servers]
    try:
        jobs = [gevent.spawn(follow_all, connection, headers, reader) for connection, headers in opened_]
        gevent.joinall(jobs, timeout=10, raise_error=True)
        for job in jobs:
            assert [payload for payload, _ in job.value] == [b"%02d" % i for i in range(10)]
    finally:
        for connection, _ in opened_:
            connection.close()
        for _, thread in servers:
            thread.join(timeout=5)


def test_a_body_cut_short_is_a_broken_stream_and_a_bad_payload_is_raised_to_its_owner():
    endpoint, thread = paced_server([(0, HEAD + b"64\r\n" + b"x" * 10)], close=True)
    connection, headers = opened(endpoint)
    with pytest.raises(StreamBroken):
        follow_all(connection, headers, StreamReader())
    connection.close()
    thread.join(timeout=5)

    endpoint, thread = paced_server([(0, HEAD), (0.01, chunked(b"bad"))])
    connection, headers = opened(endpoint)

    def refuse(payload: bytes, arrived: float) -> None:
        raise ValueError(f"unparseable {payload!r}")

    with pytest.raises(ValueError, match="unparseable"):
        connection.read_body(headers, refuse, StreamReader().follow)
    assert not connection.reusable
    connection.close()
    thread.join(timeout=5)


def test_abort_from_another_greenlet_wakes_the_owner():
    endpoint, thread = paced_server([(0, HEAD + b"3\r\none\r\n")])  # then silence
    connection, headers = opened(endpoint, read_timeouts=False)
    reader = StreamReader()
    owner = gevent.spawn(follow_all, connection, headers, reader)
    deadline = time.monotonic() + 5
    while not reader._followed and time.monotonic() < deadline:  # until the owner is parked on the reader
        gevent.sleep(0.001)
    connection.abort()
    owner.join(timeout=5)
    assert isinstance(owner.exception, StreamBroken) and "aborted" in str(owner.exception)
    assert not reader._followed
    thread.join(timeout=5)


def test_a_silent_server_times_out_when_reads_time_out():
    endpoint, thread = paced_server([(0, HEAD)])
    connection, headers = opened(endpoint, timeout_s=0.2)
    started = time.monotonic()
    with pytest.raises(Timeout):
        follow_all(connection, headers, StreamReader())
    assert 0.15 < time.monotonic() - started < 3
    connection.close()
    thread.join(timeout=5)


def test_a_fault_in_the_readers_own_loop_ends_every_body_it_reads_at_once():
    # the first chunk after the head (the body waits in the fresh set), then the server hangs up
    endpoint, thread = paced_server([(0, HEAD), (0.05, b"3\r\none\r\n")], close=True)
    connection, headers = opened(endpoint, read_timeouts=False)
    reader = StreamReader()
    faults = iter([OSError("epoll bookkeeping")])

    def faulty_read_fresh() -> None:
        raise next(faults)

    reader._read_fresh = faulty_read_fresh  # type: ignore[method-assign]  # called when the chunk comes
    with pytest.raises(OSError, match="epoll bookkeeping"):
        follow_all(connection, headers, reader)
    assert not reader._followed
    connection.close()
    thread.join(timeout=5)
