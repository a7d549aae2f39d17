"""Checks of the inputs beside the spec (run id, output directory, ports), each failing with one line naming
the flag. Shared by `batchscope load`, which checks before it becomes Locust (so the user sees that line and
nothing else), and the locustfile, for runs started with `locust -f` directly. No Locust import here.
"""

from __future__ import annotations

import socket
from pathlib import Path

from batchscope.runs import run_ids
from batchscope.wire.listen import ListenError, listen


class BadInput(ValueError):
    """A flag's value is unusable; the message is one line naming the flag."""


def check_run_id(run_id: str) -> str:
    # the run id names a folder under out/ and goes into request ids and metric labels: no path separators, no ".."
    if not run_ids.RUN_ID.fullmatch(run_id):
        raise BadInput(f"--run-id: {run_id!r} must be 1-{run_ids.RUN_ID_MAX_LENGTH} letters, digits, '.', '_' or "
                       "'-', starting with a letter or digit (it names a folder under the output directory)")
    return run_id


def check_out_dir(path: Path) -> None:
    """The output directory must be a directory we can create (an existing one is reused)."""
    if path.exists() and not path.is_dir():
        raise BadInput(f"--out: {path} exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"--out: cannot create {path}: {exc.strerror}") from None


def check_port(flag: str, port: int, host: str = "127.0.0.1", host_flag: str = "--host") -> None:
    """``port`` is 0 (off) or a port number that ``host`` can listen on now (batchscope.wire.listen's bind and
    message, as the servers that will listen there: a port left in TIME_WAIT by an earlier run is free)."""
    if not 0 <= port <= 65535:
        raise BadInput(f"{flag}: {port} is not a port number (1-65535, or 0 for none)")
    if port == 0:
        return
    try:
        listen(host, port, host_flag=host_flag, port_flag=flag).close()
    except ListenError as exc:
        raise BadInput(str(exc)) from None


def check_host(flag: str, host: str) -> None:
    """``host`` resolves (an empty host or 0.0.0.0 means every interface)."""
    if host in ("", "*", "0.0.0.0", "::"):
        return
    try:
        socket.getaddrinfo(host, None)
    except OSError:
        raise BadInput(f"{flag}: cannot resolve {host!r}") from None
