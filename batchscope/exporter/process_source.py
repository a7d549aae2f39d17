"""The command line of a local vLLM, read from /proc: the process listening on the vLLM URL's loopback port.

/proc/net/tcp{,6} name the listening socket's inode; the /proc/<pid>/fd links name the process holding it (its
oldest holder, the server, not a forked child); /proc/<pid>/cmdline is its argv. Only when vLLM's URL is on
loopback, only in the exporter's network namespace, only processes it may read; the scan is bounded by the
scrape's deadline and a socket seen before is not searched again. The argv is used only when it is a server's
(`vllm serve`, vLLM's api_server module, `batchscope sim serve`) and never logged: it may hold a key. When there
is no argv, ``why`` says why, for the "configuration not visible" annotation.
"""

from __future__ import annotations

import ipaddress
import os
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column
MAX_TABLE_LINES = 200_000  # listening sockets come first in the table; established ones may be many
MAX_CMDLINE_BYTES = 1 << 20  # a Linux argv is at most a few MiB (ARG_MAX); the knobs fit in far less
SERVER_MODULES = ("vllm.entrypoints.openai.api_server",)


class OutOfTime(Exception):
    """The deadline passed before the search ended."""


@dataclass(frozen=True)
class ProcessView:
    """The server's argv, or why there is none (one clause, for the annotation and the log)."""

    argv: list[str] | None
    why: str = ""


class ProcessSource:
    """Finds the local process serving a URL and reads its argv; ``proc`` is where procfs is mounted."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = proc
        self._known: tuple[frozenset[int], ProcessView] | None = None  # the last socket inodes and what they gave

    def read(self, url: str, deadline: float) -> ProcessView:
        """The argv of the process listening on ``url``'s port, searched until ``deadline`` (time.monotonic)."""
        port = loopback_port(url)
        if port is None:
            return ProcessView(None, f"vLLM's host {urlsplit(url).hostname} is not this host's loopback")
        inodes = frozenset(self._listening(port))
        if not inodes:
            return ProcessView(None, f"no process listens on port {port} in the exporter's network namespace")
        if self._known is not None and self._known[0] == inodes:
            return self._known[1]  # the same socket: the same server
        try:
            view = self._find(inodes, port, deadline)
        except OutOfTime:  # searched again at the next scrape
            return ProcessView(None, f"the process on port {port} was not found in time")
        self._known = (inodes, view)
        return view

    def _listening(self, port: int) -> set[int]:
        inodes = set()
        for table in ("tcp", "tcp6"):
            try:
                with open(self._proc / "net" / table, encoding="ascii", errors="replace") as lines:
                    next(lines, None)  # the header
                    for _, line in zip(range(MAX_TABLE_LINES), lines, strict=False):
                        fields = line.split()
                        if len(fields) > 9 and fields[3] == LISTEN and fields[1].endswith(f":{port:04X}"):
                            inodes.add(int(fields[9]))
            except OSError:  # no IPv6 in this kernel, or no procfs
                continue
        return inodes

    def _find(self, inodes: frozenset[int], port: int, deadline: float) -> ProcessView:
        links = {f"socket:[{inode}]" for inode in inodes}
        hidden = 0
        for pid in sorted(self._pids(), reverse=True):  # a server restarted just now is among the newest
            if time.monotonic() > deadline:
                raise OutOfTime
            held = self._holds(pid, links)
            if held is None:
                hidden += 1
            elif held:
                return self._server_view(pid, links, port)
        if hidden:
            return ProcessView(None, f"the process listening on port {port} is not readable by the exporter "
                                     f"({hidden} processes' sockets were not: another user's?)")
        return ProcessView(None, f"no process of this PID namespace holds port {port}'s socket")

    def _pids(self) -> list[int]:
        try:
            return [int(name) for name in os.listdir(self._proc) if name.isdigit()]
        except OSError:
            return []

    def _holds(self, pid: int, links: set[str]) -> bool | None:
        """Whether ``pid`` holds one of the sockets; None when its descriptors may not be read."""
        fd_dir = self._proc / str(pid) / "fd"
        try:
            names = os.listdir(fd_dir)
        except PermissionError:
            return None
        except OSError:  # it exited meanwhile
            return False
        for name in names:
            try:
                if os.readlink(fd_dir / name) in links:
                    return True
            except OSError:
                continue
        return False

    def _server_view(self, pid: int, links: set[str], port: int) -> ProcessView:
        """The argv of the oldest holder up ``pid``'s parents (a forked child holds the socket too) that is a
        server's command line."""
        chain = [pid]
        while (parent := self._parent(chain[-1])) is not None and self._holds(parent, links):
            chain.append(parent)
        for holder in reversed(chain):
            argv = self._cmdline(holder)
            if argv is not None and is_server_command(argv):
                return ProcessView(argv)
        return ProcessView(None, f"process {pid}, listening on port {port}, is not a `vllm serve` command line")

    def _parent(self, pid: int) -> int | None:
        try:
            stat = (self._proc / str(pid) / "stat").read_text(encoding="ascii", errors="replace")
        except OSError:
            return None
        fields = stat.rpartition(")")[2].split()  # the name, in parentheses, may hold spaces
        parent = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0
        return parent if parent > 1 else None

    def _cmdline(self, pid: int) -> list[str] | None:
        try:
            with open(self._proc / str(pid) / "cmdline", "rb") as file:
                raw = file.read(MAX_CMDLINE_BYTES)
        except OSError:
            return None
        return [arg.decode("utf-8", "replace") for arg in raw.rstrip(b"\0").split(b"\0")] if raw else None


def loopback_port(url: str) -> int | None:
    """The port of ``url`` when its host is loopback (127.0.0.0/8, ::1, localhost), else None."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        local = host == "localhost" or ipaddress.ip_address(host).is_loopback
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:  # a host name, or a port out of range
        return None
    return port if local else None


def is_server_command(argv: list[str]) -> bool:
    """`vllm serve ...`, `python -m vllm.entrypoints.openai.api_server ...` or `batchscope sim serve ...`."""
    return "serve" in argv or any(module in argv for module in SERVER_MODULES)
