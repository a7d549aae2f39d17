"""Reading vLLM's own log: the KV capacity line it prints at start-up, and the cause of a start that failed.

``parse_capacity`` reads the capacity line in every form vLLM has written (any device, one line or two);
``failure_cause`` picks, from a failed start's log, the line that names the cause. The forms: docs/shared.md.
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
