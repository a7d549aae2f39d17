"""Binding a listening socket with a one-line explanation when it fails (shared by every batchscope server).

Servers bind before they start, as vLLM does, so a busy port or a bad host is a start-up error that names the flag
rather than a traceback from deep inside a framework.
"""

from __future__ import annotations

import errno
import os
import socket


class ListenError(ValueError):
    """The address cannot be listened on; the message is one line naming the flag."""


def resolve(host: str, port: int, *, host_flag: str = "--host") -> tuple[socket.AddressFamily, tuple]:
    """The address family and socket address for a passive (listening) socket on ``host:port``."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                      flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise ListenError(f"{host_flag}: cannot resolve {host!r} ({getattr(exc, 'strerror', None) or exc})") from None
    return family, address


def explain(exc: OSError, host: str, port: int, *, host_flag: str = "--host", port_flag: str = "--port") -> str:
    """One line for a failed bind: the host's flag when the address is not this machine's, else the port's."""
    flag = host_flag if exc.errno == errno.EADDRNOTAVAIL else port_flag
    if exc.errno == errno.EADDRINUSE:
        return f"{flag}: {host}:{port} is in use"
    reason = os.strerror(exc.errno) if exc.errno else str(exc)  # create_server pads strerror with the address
    return f"{flag}: cannot listen on {host}:{port} ({reason})"


def listen(host: str, port: int, *, host_flag: str = "--host", port_flag: str = "--port",
           backlog: int = 4096) -> socket.socket:
    """A bound, listening TCP socket on ``host:port``, or ListenError naming the flag at fault."""
    family, address = resolve(host, port, host_flag=host_flag)
    try:
        return socket.create_server(address, family=family, backlog=backlog)
    except OSError as exc:
        raise ListenError(explain(exc, host, port, host_flag=host_flag, port_flag=port_flag)) from None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` just now, for a child server that must be told its port in advance (another
    process may take it before the child binds it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
