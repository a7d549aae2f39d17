"""The serving configuration in effect: parsed from a `vllm serve` command line, or read from what vLLM exposes.

Sources, most trusted first: the vLLM container's command line (docker SDK), a command line handed to the
exporter (string or file), and vLLM's own endpoints (cache_config_info labels, /v1/models, /version). Values
from a more trusted source win; what no source tells stays unknown ("").

Secrets are masked here, at the source: the value of every flag whose name says key, token, secret or password
(``--api-key``, ``--hf-token``) is ``***`` in a ServingConfig, so the info metric, the logs and the Grafana
annotations built from it never hold one.
"""

from __future__ import annotations

import shlex

from pydantic import BaseModel, Field, field_validator

from batchscope import vllm_knobs
from batchscope.secrets import mask_mapping

# the knobs this project is about, plus what identifies the deployment; every other flag goes to other_flags
KNOWN_FLAGS = ("model", "served_model_name", *vllm_knobs.KNOB_NAMES)
# vLLM flags that take no value
BOOLEAN_FLAGS = {"enable_prefix_caching", "no_enable_prefix_caching", "enable_chunked_prefill",
                 "no_enable_chunked_prefill", "enforce_eager", "trust_remote_code", "disable_log_requests",
                 "disable_log_stats", "enable_prompt_tokens_details", "enable_force_include_usage",
                 "async_scheduling", "no_async_scheduling", "disable_frontend_multiprocessing"}


class ServingConfig(BaseModel):
    """What vLLM was started with, as far as the sources tell (strings; "" = unknown)."""

    model: str = Field("", description="Model name or path given to `vllm serve`.")
    served_model_name: str = Field("", description="--served-model-name (the API's model id).")
    max_num_seqs: str = Field("", description="--max-num-seqs: sequences per scheduler step.")
    max_num_batched_tokens: str = Field("", description="--max-num-batched-tokens: tokens per scheduler step.")
    gpu_memory_utilization: str = Field("", description="--gpu-memory-utilization, in (0, 1].")
    max_model_len: str = Field("", description="--max-model-len: prompt + output limit, tokens.")
    block_size: str = Field("", description="--block-size: tokens per KV block.")
    num_gpu_blocks_override: str = Field("", description="--num-gpu-blocks-override: KV blocks replacing the size "
                                         "profiled from memory.")
    vllm_version: str = Field("", description="vLLM version from /version.")
    other_flags: dict[str, str] = Field(default_factory=dict, description="Any other flag given, name: value "
                                        "(secret ones, e.g. api_key, hf_token, as '***').")

    @field_validator("other_flags")
    @classmethod
    def _mask_secrets(cls, flags: dict[str, str]) -> dict[str, str]:
        # A masked value cannot be diffed: a new --api-key alone is not a configuration change (only adding or
        # removing a secret flag is). A server restarted with a new key still shows as a restart (start time).
        return {name: str(value) for name, value in mask_mapping(flags).items()}

    def merged_over(self, base: ServingConfig) -> ServingConfig:
        """This config's known values on top of ``base``'s."""
        data = base.model_dump()
        for key, value in self.model_dump().items():
            if key == "other_flags":
                data["other_flags"] = {**base.other_flags, **value}
            elif value:
                data[key] = value
        return ServingConfig(**data)

    def labels(self) -> dict[str, str]:
        """Info-metric labels: the known fields and the other flags folded into one sorted label."""
        labels = self.model_dump(exclude={"other_flags"})
        labels["other_flags"] = ",".join(f"{k}={v}" for k, v in sorted(self.other_flags.items()))
        return labels

    def diff(self, before: ServingConfig) -> list[str]:
        """Human lines such as 'max_num_batched_tokens: 2048 → 8192', for values known on both sides.

        A value that only one side knows is a source answering or not (a timeout, a daemon away), not a change.
        """
        old, new = before.labels(), self.labels()
        return [f"{key}: {old[key]} → {new[key]}" for key in new if old[key] and new[key] and old[key] != new[key]]


def parse_command(command: str | list[str]) -> ServingConfig:
    """Read a `vllm serve MODEL --flag value ...` command line (also `python -m vllm.entrypoints.openai.api_server
    --model M ...` and `--flag=value`); unknown flags land in other_flags."""
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
        values[name] = value
    known = {key: values.pop(key) for key in KNOWN_FLAGS if key in values}
    return ServingConfig(**known, other_flags=values)


def from_exposed(cache_config: dict[str, str], model_card: dict | None, version: str | None) -> ServingConfig:
    """What a running vLLM tells about itself without its command line."""
    fields = {}
    for key in ("block_size", "gpu_memory_utilization"):
        if cache_config.get(key):
            fields[key] = cache_config[key]
    if model_card:
        fields["served_model_name"] = str(model_card.get("id", ""))
        fields["model"] = str(model_card.get("root") or model_card.get("id", ""))
        if model_card.get("max_model_len"):
            fields["max_model_len"] = str(model_card["max_model_len"])
    if version:
        fields["vllm_version"] = version
    return ServingConfig(**fields)
