"""vLLM's serving knobs, defined once: each one's name, `vllm serve` flag, default, bounds, and the rules across them.

A knob left unset is not passed, so vLLM picks its value: a fixed default for some, one that depends on the
device, the model or the release for the others (``default`` None, ``default_rule`` says how vLLM picks it).
What a server chose is read back from it after a start, not assumed from here. The simulator, which has no
device to size by, takes ``baseline`` for an unset knob: SchedulerConfig's own default, the seed's baseline.
The argv helpers write the set knobs' flags and remove knob flags from a command line written either way,
``--max-num-seqs 8`` or ``--max_num_seqs=8``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

KnobValue = int | float


@dataclass(frozen=True)
class Knob:
    """One knob: vLLM's engine argument and what vLLM does with it."""

    name: str  # the engine argument (EngineArgs field), as a plan and vLLM's config labels name it
    above: KnobValue  # values must be > above ...
    at_most: KnobValue  # ... and <= at_most
    default: KnobValue | None  # vLLM's value when the flag is not passed, where one value holds for every server
    default_rule: str  # how vLLM picks its value when the flag is not passed (beyond ``default``)
    meaning: str
    # the simulator's value when unset, where it differs from vLLM's on purpose: SchedulerConfig's class default
    # (DEFAULT_MAX_NUM_SEQS 128, DEFAULT_MAX_NUM_BATCHED_TOKENS 2048 in vllm/config/scheduler.py, 0.32: the seed's
    # baseline), not the device-sized one `vllm serve` picks (1024 / 8192 on an H100)
    baseline: KnobValue | None = None
    # a switch: vLLM's BooleanOptionalAction, `--flag` on, `--no-flag` off, no value word (bounds 0..1)
    switch: bool = False

    @property
    def flag(self) -> str:
        """The `vllm serve` flag."""
        return "--" + self.name.replace("_", "-")

    @property
    def description(self) -> str:
        """What the knob is and what an unset one means (a config field's description)."""
        fixed = "" if self.default is None else "off; " if self.switch else f"{self.default:g}; "
        return f"{self.flag}: {self.meaning}. Unset: not passed, vLLM's default applies ({fixed}{self.default_rule})."


# The seed's three knobs, the two lengths they depend on, the KV cache's size in blocks, then the queue's own
# knobs (vLLM 0.32's SchedulerConfig: the API server's admission limits, the RUNNING cap, the long-prefill chunk
# cap) (a plan's, a diff's and the flags' order).
KNOBS: Final = (
    # by device memory for `vllm serve` (EngineArgs.get_batch_defaults, v0.32): >= 160 GiB, >= 70 GiB but not
    # A100, other GPUs, the CPU build (times the world size there)
    Knob("max_num_seqs", 0, 100_000, None, "by device: 1024 on GPUs of 70 GiB or more but A100, 256 on "
         "other GPUs, 128 per rank on the CPU build", "sequences per scheduler step", baseline=128),
    Knob("max_num_batched_tokens", 0, 10_000_000, None, "by device: 16384 on GPUs of 160 GiB or more, 8192 "
         "of 70 GiB or more but A100, 2048 on other GPUs and per rank on the CPU build", "tokens per scheduler step",
         baseline=2048),
    Knob("gpu_memory_utilization", 0, 1, 0.92, "0.9 before v0.25; on the CPU build the fraction "
         "of NUMA node 0's memory, ignored when VLLM_CPU_KVCACHE_SPACE is set", "fraction of device memory, in "
         "(0, 1]", baseline=0.92),
    Knob("max_model_len", 0, 10_000_000, None, "the model's context length, from its config",
         "prompt + output limit, tokens"),
    Knob("block_size", 0, 1024, None, "by attention backend: 16 on CUDA, 128 on the CPU build, which takes "
         "multiples of 32 only", "tokens per KV block"),
    # the KV cache's size in blocks, bypassing gpu_memory_utilization's sizing: how a test (or the CPU build,
    # whose memory share is coarse) gets a cache small enough to preempt
    Knob("num_gpu_blocks_override", 0, 100_000_000, None, "the blocks gpu_memory_utilization leaves room for",
         "KV cache blocks, replacing the size vLLM profiles from memory"),
    # SchedulerConfig.max_num_active_seqs (ge=1): max_num_seqs still sizes the runner; must be <= max_num_seqs
    Knob("max_num_active_seqs", 0, 100_000, None, "max_num_seqs: RUNNING is capped by max_num_seqs alone",
         "requests the scheduler admits into RUNNING, at most max_num_seqs"),
    # AsyncLLM.check_admission, in the API server: 503 when waiting + running + n > N (n slots per request)
    Knob("max_num_queued_reqs", -1, 100_000_000, None, "no limit", "requests in flight (waiting + running) past "
         "which the API server answers HTTP 503"),
    # the same check: 503 when the prompt tokens of requests still in prefill are >= T (a whole prompt counts
    # until its prefill ends); vLLM's guidance is T = TTFT target x prefill throughput
    Knob("max_num_queued_tokens", -1, 10_000_000_000, None, "no limit", "prompt tokens of requests in prefill "
         "at which the API server answers HTTP 503"),
    Knob("long_prefill_token_threshold", -1, 10_000_000, 0, "0 is off", "most tokens of one request's prefill "
         "per scheduler step, 0 off (not applied to the only request in the batch)", baseline=0),
    Knob("long_prefill_token_threshold_adaptive", -1, 1, 0, "a plain cap", "floor the long-prefill cap at "
         "max_num_batched_tokens // (running + waiting requests)", baseline=0, switch=True),
)
KNOB_NAMES: Final = tuple(knob.name for knob in KNOBS)
BY_NAME: Final = {knob.name: knob for knob in KNOBS}
BY_FLAG: Final = {knob.flag: knob for knob in KNOBS}  # look a word up with flag_key()
DEFAULT_TEXT = "vLLM default"  # how an unset knob reads in a diff or a report: "vLLM default → 32"


def cross_knob_problem(values: Mapping[str, KnobValue | None]) -> str | None:
    """vLLM's rules across knobs (SchedulerConfig, 0.32), each checked when both its knobs are set (vLLM's own
    defaults satisfy them); the first problem as one line in vLLM's words, or None."""
    seqs, tokens = values.get("max_num_seqs"), values.get("max_num_batched_tokens")
    if seqs is not None and tokens is not None and tokens < seqs:
        return f"max_num_batched_tokens ({tokens}) must be greater than or equal to max_num_seqs ({seqs})."
    active = values.get("max_num_active_seqs")
    if active is not None and seqs is not None and active > seqs:
        return f"max_num_active_seqs ({active}) cannot be greater than max_num_seqs ({seqs})."
    threshold, model_len = values.get("long_prefill_token_threshold"), values.get("max_model_len")
    if threshold is not None and model_len is not None and threshold > model_len:
        return f"long_prefill_token_threshold ({threshold}) cannot be greater than the max_model_len ({model_len})."
    return None


def shown(value: object) -> str:
    """A knob's value in a diff or a report: the number, 'on' or 'off' for a switch, or 'vLLM default' when it is
    not passed."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return DEFAULT_TEXT if value is None else str(value)


def knob_flags(values: Mapping[str, KnobValue | None]) -> list[str]:
    """`--flag value` for every knob set in ``values``, in KNOBS order (a switch: `--flag` or `--no-flag`); unset
    ones are not passed."""
    flags: list[str] = []
    for knob in KNOBS:
        value = values.get(knob.name)
        if value is None:
            continue
        if knob.switch:
            flags.append(knob.flag if value else "--no-" + knob.flag[2:])
        else:
            flags += [knob.flag, str(value)]
    return flags


def flag_key(word: str) -> str:
    """A flag as BY_FLAG names it: vLLM's parser takes underscores for dashes anywhere in a flag's name, and a
    switch's `--no-` form names the same knob."""
    if not word.startswith("--"):
        return word
    key = word.replace("_", "-")
    negated = "--" + key[len("--no-"):]
    return negated if key.startswith("--no-") and negated in BY_FLAG and BY_FLAG[negated].switch else key


def without_knobs(argv: Sequence[str]) -> list[str]:
    """An argv with every knob flag and its value removed, in any spelling (`--max-num-seqs 8`,
    `--max_num_seqs=8`); everything else kept in order."""
    kept: list[str] = []
    index = 0
    while index < len(argv):
        word = argv[index]
        index += 1
        name, has_value, _ = word.partition("=")
        knob = BY_FLAG.get(flag_key(name))
        if knob is None:
            kept.append(word)
        elif not has_value and not knob.switch:
            index += 1  # the flag's value is the next word
    return kept
