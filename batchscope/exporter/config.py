"""The serving configuration in effect: parsed from a `vllm serve` command line, or read from what vLLM exposes.

Sources, most trusted first: the vLLM container's command line (docker SDK), a command line handed to the
exporter (live file, file, flag) or else the local vLLM process's (/proc), and vLLM's own endpoints
(cache_config_info labels, /v1/models, /version). Values from a more trusted source win; what no source tells stays
unknown (""). A knob a command line leaves out is vLLM's default: passing it, or dropping it, is a change.

Secrets are masked here, at the source: the value of every flag whose name says key, token, secret or password
(``--api-key``, ``--hf-token``) is ``***`` in a ServingConfig, so the info metric, the logs and the Grafana
annotations built from it never hold one.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from batchscope.inputs.secrets import mask_mapping
from batchscope.vllm import command_line
from batchscope.vllm import knobs as vllm_knobs

# the knobs this project is about, plus what identifies the deployment; every other flag goes to other_flags
KNOWN_FLAGS = ("model", "served_model_name", *vllm_knobs.KNOB_NAMES)

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
    max_num_active_seqs: str = Field("", description="--max-num-active-seqs: requests admitted into RUNNING.")
    max_num_queued_reqs: str = Field("", description="--max-num-queued-reqs: requests in flight past which vLLM "
                                     "answers 503.")
    max_num_queued_tokens: str = Field("", description="--max-num-queued-tokens: prompt tokens in prefill at which "
                                       "vLLM answers 503.")
    long_prefill_token_threshold: str = Field("", description="--long-prefill-token-threshold: most prefill "
                                              "tokens of one request per step (0 off).")
    long_prefill_token_threshold_adaptive: str = Field("", description="--long-prefill-token-threshold-adaptive: "
                                                       "the cap floored at a fair share of the budget.")
    vllm_version: str = Field("", description="vLLM version from /version.")
    other_flags: dict[str, str] = Field(default_factory=dict, description="Any other flag given, name: value "
                                        "(secret ones, e.g. api_key, hf_token, as '***').")
    defaulted: list[str] | None = Field(None, description="The knobs (vllm_knobs.KNOB_NAMES) a command line leaves "
                                        "out, so vLLM's default applies; None when no command line was read.")

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
            elif key == "defaulted":
                data["defaulted"] = base.defaulted if value is None else value
            elif value:
                data[key] = value
        return ServingConfig(**data)

    def labels(self) -> dict[str, str]:
        """Info-metric labels: the known fields and the other flags folded into one sorted label."""
        labels = self.model_dump(exclude={"other_flags", "defaulted"})
        labels["other_flags"] = ",".join(f"{k}={v}" for k, v in sorted(self.other_flags.items()))
        return labels

    def diff(self, before: ServingConfig) -> list[str]:
        """Human lines such as 'max_num_batched_tokens: 2048 → 8192' or 'max_num_seqs: vLLM default → 64'.

        A value known on both sides is compared. A value only one side knows is a source answering or not (a
        timeout, a daemon away), not a change, unless both sides were read from a command line: then a knob one
        passes and the other leaves out is a change against vLLM's default, and so is another flag given or dropped.
        """
        old, new = before.labels(), self.labels()
        lines = []
        for key in new:
            shown = _changed(key, (old[key], before.defaulted), (new[key], self.defaulted))
            if shown is not None:
                lines.append(f"{key}: {shown[0]} → {shown[1]}")
        return lines


Side = tuple[str, list[str] | None]  # a label's value and its config's defaulted knobs


def _changed(key: str, old: Side, new: Side) -> tuple[str, str] | None:
    """(before, after) as a diff shows them if ``key`` changed, else None."""
    (old_value, old_defaulted), (new_value, new_defaulted) = old, new
    if old_value and new_value:
        return (old_value, new_value) if old_value != new_value else None
    if old_defaulted is None or new_defaulted is None or old_value == new_value:
        return None
    if key == "other_flags":
        return old_value or "none", new_value or "none"
    if key not in vllm_knobs.BY_NAME:
        return None
    # one side's value is unknown: a change only where one command line passes the knob and the other leaves it
    # out (left out on both, vLLM's own value known at one scrape only is no change)
    if key in old_defaulted and key not in new_defaulted:
        return _against_default(key, new_value, default_first=True)
    if key in new_defaulted and key not in old_defaulted:
        return _against_default(key, old_value, default_first=False)
    return None


def _against_default(key: str, passed: str, default_first: bool) -> tuple[str, str] | None:
    """A knob passed on one side only, against vLLM's default on the other; None when the value passed is the
    default vLLM uses on every server (its effect is the same)."""
    knob = vllm_knobs.BY_NAME[key]
    try:
        # a switch reads "true" / "false" (parse_command's words for `--flag` / `--no-flag`), its default 0 or 1
        value = float(passed == "true") if knob.switch else float(passed)
        if knob.default is not None and value == knob.default:
            return None
    except ValueError:
        pass  # not a number: vLLM would refuse it, but it still differs from the default
    pair = (vllm_knobs.DEFAULT_TEXT, passed)
    return pair if default_first else (passed, vllm_knobs.DEFAULT_TEXT)


def parse_command(command: str | list[str]) -> ServingConfig:
    """Read a `vllm serve MODEL --flag value ...` command line (batchscope.vllm.command_line); unknown flags land in
    other_flags."""
    values = command_line.flag_values(command)
    known = {key: values.pop(key) for key in KNOWN_FLAGS if key in values}
    defaulted = [key for key in vllm_knobs.KNOB_NAMES if key not in known]
    return ServingConfig(**known, other_flags=values, defaulted=defaulted)


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
