"""vLLM's command line read back: `vllm serve MODEL --flag value ...` as the flags it sets, the way vLLM's
parser takes them (`--flag value` or `--flag=value`, dashes or underscores, a flag without a value, a switch's
`--no-` form). The exporter builds its serving configuration from it, the LLM tab its knob rows.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Final

from batchscope.vllm import knobs

# vLLM flags that take no value (store_true, or BooleanOptionalAction with its --no- form), beside the knobs' switches
BOOLEAN_FLAGS: Final = frozenset({
    "enable_prefix_caching", "no_enable_prefix_caching", "enable_chunked_prefill", "no_enable_chunked_prefill",
    "enforce_eager", "trust_remote_code", "disable_log_requests", "disable_log_stats",
    "enable_prompt_tokens_details", "enable_force_include_usage", "async_scheduling", "no_async_scheduling",
    "disable_frontend_multiprocessing",
    *(knob.name for knob in knobs.KNOBS if knob.switch), *("no_" + knob.name for knob in knobs.KNOBS if knob.switch)})


def flag_values(command: str | Sequence[str]) -> dict[str, str]:
    """The flags a `vllm serve` command line sets (also `python -m vllm.entrypoints.openai.api_server --model M`),
    by name with underscores: a flag without a value reads "true", a knob switch's `--no-` form "false" under the
    knob's name, the positional MODEL "model". A string is split as a shell splits it (ValueError on a bad quote)."""
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if "serve" in argv:
        argv = argv[argv.index("serve") + 1:]
    values: dict[str, str] = {}
    index = 0
    while index < len(argv):
        token = argv[index]
        index += 1
        if not token.startswith("--"):
            values.setdefault("model", token)  # the positional MODEL of `vllm serve`
            continue
        name, has_value, value = token[2:].partition("=")
        name = name.replace("-", "_")
        if not has_value:
            if name in BOOLEAN_FLAGS or index >= len(argv) or argv[index].startswith("--"):
                value = "true"
            else:
                value, index = argv[index], index + 1
        if name.startswith("no_") and getattr(knobs.BY_NAME.get(name[3:]), "switch", False):
            name, value = name[3:], "false"  # a switch's off form names the knob
        values[name] = value
    return values
