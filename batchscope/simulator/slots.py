"""Per-request state of the engine core, one entry per slot, as typed numpy columns.

A slot is a row shared by every column; the engine reuses a slot once its request has ended. Keeping each field
in its own array (rather than one object per request) lets a step over hundreds of decoding requests be a handful
of vector operations. The columns double in size when every slot is taken.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

FREE, WAITING, RUNNING, FINISHED, ABORTED = range(5)

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]


def _ints(capacity: int) -> Ints:
    return np.zeros(capacity, dtype=np.int64)


def _times(capacity: int) -> Floats:
    return np.full(capacity, np.nan, dtype=np.float64)


@dataclass
class SlotTable:
    """The engine's per-request columns; ``slots.prompt_len[slot]`` is the prompt length of the slot's request.

    Token counts are tokens; times are seconds on the caller's clock, NaN until the event happened.
    """

    state: npt.NDArray[np.int8]  # FREE, WAITING, RUNNING, FINISHED or ABORTED
    prompt_len: Ints
    max_tokens: Ints
    eos_at: Ints  # output length at which EOS is drawn (NEVER when ignore_eos)
    num_computed: Ints  # tokens whose KV is computed (vLLM's num_computed_tokens)
    num_output: Ints  # tokens generated so far
    num_blocks: Ints  # KV blocks held, shared cached blocks included
    preemptions: Ints
    cached_tokens: Ints  # prompt tokens found in the prefix cache when first scheduled (vLLM's num_cached_tokens)
    arrival: Floats
    first_scheduled: Floats
    first_token: Floats
    last_token: Floats

    @classmethod
    def empty(cls, capacity: int) -> SlotTable:
        """A table of ``capacity`` free slots."""
        return cls(
            state=np.full(capacity, FREE, dtype=np.int8),
            prompt_len=_ints(capacity), max_tokens=_ints(capacity), eos_at=_ints(capacity),
            num_computed=_ints(capacity), num_output=_ints(capacity), num_blocks=_ints(capacity),
            preemptions=_ints(capacity), cached_tokens=_ints(capacity),
            arrival=_times(capacity), first_scheduled=_times(capacity), first_token=_times(capacity),
            last_token=_times(capacity),
        )

    @property
    def capacity(self) -> int:
        return int(self.state.size)

    def grow(self, capacity: int) -> None:
        """Enlarge every column to ``capacity`` slots; the new slots are free."""
        larger = SlotTable.empty(capacity)
        for column in fields(self):
            old = getattr(self, column.name)
            new = getattr(larger, column.name)
            new[: old.size] = old
            setattr(self, column.name, new)
