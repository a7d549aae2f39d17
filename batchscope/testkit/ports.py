"""Free loopback ports for servers a test or bench starts on a port it must know in advance."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on 127.0.0.1 just now (another process may take it before it is bound again)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
