"""Reading vLLM's own log: the KV capacity line it prints at start-up, and the cause of a start that failed.

The capacity line names the device the cache is on (vllm/v1/core/kv_cache_utils.py): ``GPU`` on CUDA, the
device type upper-cased elsewhere (``CPU`` on the CPU build), with `` + host`` appended to it when part of the
cache lives in host memory (v0.32's HiSparse mode). One line in 2026 releases, two before (PR #13596, 2025):

    GPU KV cache size: 42,656 tokens
    Maximum concurrency for 32,768 tokens per request: 1.30x
    CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 2,048 tokens per request: 1024.00x
    GPU + host KV cache size: 1,048,576 tokens, Maximum concurrency for 8,192 tokens per request: 128.00x

A failed start ends in a traceback, often followed by lines that are not the cause (multiprocessing's
``resource_tracker`` warnings, the API server's own "See root cause above" error); ``failure_cause`` picks the
line that names it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

CAPACITY_LINE = re.compile(r"\b[A-Za-z]+(?: \+ host)? KV cache size: ([\d,]+) tokens")
CONCURRENCY_LINE = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
# vLLM's log prefix (vllm/logger.py _FORMAT), which its formatter repeats on every line of a logged traceback:
# `(EngineCore_DP0 pid=1133552) ERROR 12-01 10:00:00 [core.py:1510] `
LOG_PREFIX = r"(?:\([\w.-]+ pid=\d+\) )?(?:[A-Z]+ \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\] )?"
# the last line of a Python traceback: `ValueError: ...`, `torch.OutOfMemoryError: ...`, `RuntimeError: ...`
EXCEPTION_LINE = re.compile(rf"^{LOG_PREFIX}\s*((?:\w+\.)*\w*(?:Error|Exception): .*)")
# vLLM's API server re-raises an engine core's failure with this pointer; the cause is the exception before it
POINTER = "See root cause above"


def parse_capacity(log_text: str) -> tuple[int | None, float | None]:
    """The last KV cache size (tokens, on whatever device) and 'Maximum concurrency' figures in a vLLM log."""
    tokens = CAPACITY_LINE.findall(log_text)
    concurrency = CONCURRENCY_LINE.findall(log_text)
    return (int(tokens[-1].replace(",", "")) if tokens else None,
            float(concurrency[-1][1]) if concurrency else None)


def failure_cause(lines: Sequence[str]) -> str | None:
    """The line of a log's tail that says why the process failed: the last exception line (vLLM's log prefix
    dropped) that is not a pointer to an earlier one, else the last exception line, else the last line (None for
    no lines)."""
    exceptions = [found.group(1).strip() for found in map(EXCEPTION_LINE.match, lines) if found]
    causes = [line for line in exceptions if POINTER not in line]
    found = causes or exceptions or [line.strip() for line in lines if line.strip()]
    return found[-1] if found else None
