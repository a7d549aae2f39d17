"""The kernel's receive stamps on TCP sockets: when data reached a socket, not when a busy process got to read it.

Linux stamps received data when asked (``SO_TIMESTAMPNS``, CLOCK_REALTIME in nanoseconds) and hands the stamp
with each ``recvmsg``. The load generator times tokens with them, the simulator its requests' arrivals. For TCP
a read is stamped with the arrival of the last segment it returns (segments left waiting merge under the later
stamp), so a stamp is exact for data read before more arrives on the same socket.
"""

from __future__ import annotations

import socket
import struct

# the socket module has no name for it; 35 on Linux
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
TIMESPEC = struct.Struct("qq")  # struct timespec: seconds, nanoseconds
ANCILLARY_SIZE = 64  # room for the one control message asked for


def enable(sock: socket.socket) -> bool:
    """Ask the kernel to stamp ``sock``'s received data; False where it cannot (not Linux)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        return True
    except OSError:
        return False


def arrival(ancillary: list[tuple[int, int, bytes]]) -> float | None:
    """The receive stamp in ``recvmsg``'s ancillary data (seconds since the epoch), None if there is none."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= TIMESPEC.size:
            seconds, nanoseconds = TIMESPEC.unpack_from(data)
            return seconds + nanoseconds * 1e-9
    return None
