"""One request: what it sends (``Target``, built once from the spec and the server; each request's prompt) and
its streamed exchange, timed and judged (request.py over http.py's connections, framing.py's bounds and
reader.py's shared epoll reader). This face lists what the rest of the load generator uses of it."""

from batchscope.loadgen.stream.http import Connection, ConnectionPool, Timeout
from batchscope.loadgen.stream.prompts import draw_prompt
from batchscope.loadgen.stream.reader import StreamReader
from batchscope.loadgen.stream.request import (
    OUTCOMES,
    RequestRecord,
    measure,
    refused_by_server,
    throttled,
    timed_elsewhere,
)
from batchscope.loadgen.stream.target import Target, build_target

__all__ = [
    "OUTCOMES", "Connection", "ConnectionPool", "RequestRecord", "StreamReader", "Target", "Timeout", "build_target",
    "draw_prompt", "measure", "refused_by_server", "throttled", "timed_elsewhere",
]
