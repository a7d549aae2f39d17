"""One greenlet reads every streamed body of a load-sending process, over one epoll set of their sockets.

A greenlet blocked in each socket read costs two switches through gevent's hub per token, and a late read
merges a stream's first token with its second under the second's receive stamp (docs/loadgen.md, "How tokens
are timed"). Here the request's greenlet sends and reads the response head, then ``follow`` parks it while this
reader, woken once per batch of ready sockets, reads each one once and hands the payloads on. Chunked bodies on
plain TCP sockets with receive stamps only; anything else is read by its own greenlet (``Connection.body``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import gevent
import gevent.event
from gevent import monkey

from batchscope.loadgen.stream.framing import ChunkedDecoder
from batchscope.loadgen.stream.http import Connection, Payload, StreamBroken, Timeout

if TYPE_CHECKING:
    import select  # only its epoll type: gevent's monkey-patching removes epoll from the module at run time

# gevent's monkey-patching hides epoll from the select module: the original is what is wanted here (its file
# descriptor is what the hub watches)
_epoll = monkey.get_original("select", "epoll")
EPOLLIN: int = monkey.get_original("select", "EPOLLIN")
FRESH_EVERY = 16  # reads of a batch between two looks at the bodies waiting for their first token


class _Followed:
    """A body being read by the reader for the greenlet parked in ``StreamReader.follow``."""

    __slots__ = ("connection", "decoder", "on_payload", "finished", "error", "fresh")

    def __init__(self, connection: Connection, on_payload: Payload) -> None:
        self.connection = connection
        self.decoder = ChunkedDecoder(connection.take_buffer())
        self.on_payload = on_payload
        self.finished = gevent.event.Event()
        self.error: BaseException | None = None
        self.fresh = True  # nothing of the body handed on yet: its first token is still to come

    def readable(self) -> None:
        """One read of what arrived, its payloads handed on; any error ends the body (for its owner to raise)."""
        try:
            data = self.connection.read()
        except BlockingIOError:
            return
        except Exception as exc:  # noqa: BLE001 -- delivered to the owner, which raises it
            self.end(exc)
            return
        self.decode(data)

    def decode(self, data: bytes) -> None:
        """Hand on the payloads ``data`` completes (stamped with the last read's arrival)."""
        try:
            on_payload, arrived = self.on_payload, self.connection.arrived_s
            for payload in self.decoder.payloads(data):
                on_payload(payload, arrived)
                self.fresh = False
        except Exception as exc:  # noqa: BLE001 -- a bad event or chunk: the owner's outcome
            self.end(exc)
            return
        if self.decoder.ended:
            self.end(None)

    def end(self, error: BaseException | None) -> None:
        self.error = error
        self.finished.set()


class StreamReader:
    """The process's reader: ``follow`` blocks the calling greenlet until its body has been read.

    Bodies still waiting for their first token sit in a set of their own, looked at between every few reads
    of a large batch too: a first token that arrives while the reader works through a step's worth of tokens
    (milliseconds at hundreds of streams) is read at once, not after the batch, so it is not merged with the
    stream's second token (see the module's docstring).
    """

    def __init__(self) -> None:
        self._epoll = _epoll()  # bodies past their first token, and the fresh set's own descriptor
        self._fresh = _epoll()
        self._epoll.register(self._fresh.fileno(), EPOLLIN)
        self._followed: dict[int, _Followed] = {}
        self._greenlet: gevent.Greenlet | None = None

    def follow(self, connection: Connection, on_payload: Payload) -> None:
        """Read ``connection``'s chunked body here, handing each payload to ``on_payload``; returns when it
        ended cleanly, raises what ended it otherwise (StreamBroken, Timeout, or the callback's own error).

        A connection that times reads out (``read_timeouts``) fails with Timeout after ``timeout_s`` without
        a byte, as its own reads would; the caller's gevent.Timeout or ``connection.abort()`` end the wait too.
        """
        followed = _Followed(connection, on_payload)
        fd = connection.fileno()
        followed.decode(b"")  # what came with the response head
        if followed.finished.is_set():
            self._ended(followed)
            return
        connection.set_blocking(False)
        self._followed[fd] = followed
        try:
            self._set_of(followed).register(fd, EPOLLIN)
            connection.on_abort = followed.finished.set
            self._ensure_running()
            self._wait(followed)
        finally:
            connection.on_abort = None
            if self._followed.get(fd) is followed:
                del self._followed[fd]
                if connection.is_open:  # a closed socket has left the epoll set by itself
                    self._set_of(followed).unregister(fd)
                    connection.set_blocking(True)
        self._ended(followed)

    @staticmethod
    def _ended(followed: _Followed) -> None:
        connection = followed.connection
        if followed.error is not None:
            raise followed.error
        if not followed.decoder.ended:
            raise StreamBroken("aborted" if connection.aborted else "connection closed")
        connection.put_back(followed.decoder.buffer)

    def _wait(self, followed: _Followed) -> None:
        connection = followed.connection
        if not connection.read_timeouts:
            followed.finished.wait()
            return
        while not followed.finished.wait(connection.timeout_s):
            if connection.timeout_s <= 0 or time.time() - connection.arrived_s >= connection.timeout_s:
                raise Timeout(f"no response within {connection.timeout_s} s")

    def _ensure_running(self) -> None:
        if self._greenlet is None or self._greenlet.dead:
            self._greenlet = gevent.spawn(self._run)

    def _set_of(self, followed: _Followed) -> select.epoll:
        return self._fresh if followed.fresh else self._epoll

    def _run(self) -> None:
        try:
            self._serve()
        except Exception as exc:  # noqa: BLE001 -- a fault here must end the bodies it reads, not strand them
            # each owner raises it (its request's outcome) and unregisters its socket; the next follow respawns
            for followed in list(self._followed.values()):
                followed.end(exc)

    def _serve(self) -> None:
        hub = gevent.get_hub()
        ready = hub.loop.io(self._epoll.fileno(), 1)
        poll, fresh_fd, read = self._epoll.poll, self._fresh.fileno(), self._read
        while True:
            hub.wait(ready)  # one switch for every socket ready now
            for count, (fd, _events) in enumerate(poll(0), start=1):
                if fd == fresh_fd:
                    self._read_fresh()
                    continue
                read(fd)
                if count % FRESH_EVERY == 0:
                    self._read_fresh()

    def _read(self, fd: int) -> _Followed | None:
        entry = self._followed.get(fd)
        if entry is None or entry.finished.is_set():
            return None
        entry.readable()
        return entry

    def _read_fresh(self) -> None:
        """Read the fresh bodies with data; those whose first token came join the main set."""
        for fd, _events in self._fresh.poll(0):
            entry = self._read(fd)
            if entry is not None and not entry.fresh:
                self._fresh.unregister(fd)
                self._epoll.register(fd, EPOLLIN)
