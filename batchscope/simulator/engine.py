"""The pure engine core: vLLM V1 scheduling, KV block accounting and recompute preemption.

No I/O and no clock: callers pass ``now``. A step is two calls, ``schedule(now)`` (the batch, as vLLM's
``Scheduler.schedule()`` picks it, priced by the cost model) and ``complete(step, now)`` (its results).
How it schedules, and why state lives in numpy columns: docs/simulator.md, "The engine core".
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass

import numpy as np

from batchscope.simulator.admission import AdmissionControl
from batchscope.simulator.cost import StepCostModel
from batchscope.simulator.finish import REASON_LENGTH, REASON_NAMES, REASON_STOP
from batchscope.simulator.frontend import FrontEnd
from batchscope.simulator.prefix_cache import PrefixCache, RequestBlocks, free_request, lookup, register_prompt_blocks
from batchscope.simulator.slots import ABORTED, FINISHED, FREE, RUNNING, WAITING, SlotTable
from batchscope.simulator.stats import EngineStats

NEVER = np.iinfo(np.int64).max // 4


@dataclass(frozen=True)
class SchedulerLimits:
    """The knobs this project is about, plus the KV pool they share (docs/simulator.md, "The engine core")."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    num_gpu_blocks: int
    max_num_active_seqs: int | None = None  # None: RUNNING is capped by max_num_seqs alone
    long_prefill_token_threshold: int = 0  # 0: off
    long_prefill_token_threshold_adaptive: bool = False

    @property
    def running_cap(self) -> int:
        """How many requests may be RUNNING: vLLM's max_num_active_reqs."""
        active = self.max_num_active_seqs
        return self.max_num_seqs if active is None else min(active, self.max_num_seqs)

    def prefill_cap(self, num_running: int, num_waiting: int) -> int:
        """The step's cap on one request's new tokens, 0 for none: off for the only eligible request, floored at
        the budget's fair share when adaptive (vLLM's Scheduler.schedule, counted before the step)."""
        eligible = num_running + num_waiting
        threshold = self.long_prefill_token_threshold if eligible > 1 else 0
        if threshold > 0 and self.long_prefill_token_threshold_adaptive:
            threshold = max(threshold, self.max_num_batched_tokens // eligible)
        return threshold


@dataclass(frozen=True)
class Step:
    """One scheduled engine step: who runs, how many tokens each, and when the step ends."""

    start: float
    end: float
    slots: np.ndarray
    new_tokens: np.ndarray
    num_preempted: int


@dataclass(frozen=True)
class StepOutput:
    """What a completed step produced: one token for each slot in ``token_slots``, and the finishes."""

    token_slots: np.ndarray
    token_index: np.ndarray  # 1-based position of the token in its request's output
    finished_slots: np.ndarray
    finish_reasons: np.ndarray  # REASON_LENGTH or REASON_STOP, aligned with finished_slots


class EngineCore:
    """Requests in, steps out. Slots are reused after a request ends; callers map slots to their requests."""

    def __init__(self, limits: SchedulerLimits, cost: StepCostModel, eos_probability: float, seed: int = 0,
                 enable_prefix_caching: bool = False, frontend: FrontEnd | None = None,
                 admission: AdmissionControl | None = None):
        self.limits = limits
        # not used by the core: the latencies its drivers add outside the step and the API server's admission
        # check, kept with it so every driver applies the same
        self.frontend = frontend or FrontEnd()
        self.admission = admission or AdmissionControl()
        self.stats = EngineStats(limits.max_model_len)
        self._cost = cost
        self._eos_probability = eos_probability
        self._rng = np.random.default_rng(seed)
        # vLLM reserves one null block, so usage is measured against num_gpu_blocks - 1
        self.usable_blocks = limits.num_gpu_blocks - 1
        self._free_count = self.usable_blocks  # without prefix caching, free blocks are only counted
        self.prefix_cache = PrefixCache(self.usable_blocks) if enable_prefix_caching else None
        self._cached: dict[int, RequestBlocks] = {}  # slot -> its cache view, with prefix caching on
        self._uids = itertools.count()
        self._waiting: deque[int] = deque()
        self._running = np.zeros(0, dtype=np.int64)
        self._free_slots: list[int] = []
        self._pending_release: list[int] = []
        self._step_in_flight = False
        self.slots = SlotTable.empty(0)
        self._grow(64)

    # ----- request lifecycle -------------------------------------------------------------------------

    def _grow(self, capacity: int) -> None:
        old = self.slots.capacity
        self.slots.grow(capacity)
        self._free_slots.extend(range(capacity - 1, old - 1, -1))

    def add_request(
        self, now: float, prompt_len: int, max_tokens: int, ignore_eos: bool = True, min_tokens: int = 0,
        prompt_hashes: list[int] | None = None,
    ) -> int:
        """Queue a request that arrived at ``now``; return its slot. The caller validated the lengths.

        ``prompt_hashes``: ``prefix_cache.block_hashes`` of its prompt token ids, so equal prefixes can share
        cached blocks; without them its blocks can be hit only by itself, after a preemption.
        """
        if not self._free_slots:
            self._grow(self.slots.capacity * 2)
        slot = self._free_slots.pop()
        self.slots.prompt_len[slot] = prompt_len
        self.slots.max_tokens[slot] = max_tokens
        # EOS ends a free-running output early; drawn up front so a seed fixes every output length
        free_running = not ignore_eos and self._eos_probability > 0
        self.slots.eos_at[slot] = min_tokens + self._rng.geometric(self._eos_probability) if free_running else NEVER
        self.slots.num_computed[slot] = 0
        self.slots.num_output[slot] = 0
        self.slots.num_blocks[slot] = 0
        self.slots.preemptions[slot] = 0
        self.slots.cached_tokens[slot] = 0
        self.slots.arrival[slot] = now
        self.slots.first_scheduled[slot] = np.nan
        self.slots.first_token[slot] = np.nan
        self.slots.last_token[slot] = np.nan
        self.slots.state[slot] = WAITING
        if self.prefix_cache is not None:
            self._cached[slot] = RequestBlocks(next(self._uids), list(prompt_hashes or ()))
        self._waiting.append(slot)
        return slot

    def abort(self, slot: int) -> None:
        """Drop a waiting or running request (client gone): free its blocks at once."""
        if self.slots.state[slot] == WAITING:
            self._waiting.remove(slot)
        elif self.slots.state[slot] == RUNNING:
            self._release_blocks(np.array([slot]))
            self._running = self._running[self._running != slot]
        else:
            return
        self.slots.state[slot] = ABORTED
        self.stats.record_aborted(1)
        self._pending_release.append(slot)
        if not self._step_in_flight:
            self._release_slots()

    def _release_slots(self) -> None:
        for slot in self._pending_release:
            self.slots.state[slot] = FREE
            self._cached.pop(slot, None)
        self._free_slots.extend(self._pending_release)
        self._pending_release.clear()

    # ----- KV blocks -----------------------------------------------------------------------------------

    @property
    def free_blocks(self) -> int:
        """Blocks in the free queue; cached blocks no request uses count as free, as in vLLM."""
        return self._free_count if self.prefix_cache is None else self.prefix_cache.free_blocks

    def _take_blocks(self, count: int) -> None:
        if self.prefix_cache is None:
            self._free_count -= count
        else:
            self.prefix_cache.take(count)

    def _release_blocks(self, slots: np.ndarray, preempted: bool = False) -> None:
        if self.prefix_cache is None:
            self._free_count += int(self.slots.num_blocks[slots].sum())
        else:
            size = self.limits.block_size
            for slot in slots.tolist():
                free_request(self.prefix_cache, self._cached[slot], int(self.slots.num_blocks[slot]),
                             int(self.slots.num_computed[slot]) // size, keep_own=preempted)
        self.slots.num_blocks[slots] = 0

    def _cache_hits(self, slot: int) -> list[int]:
        """The leading cached blocks a request being admitted can reuse; counted as vLLM's prefix cache stats."""
        if self.prefix_cache is None:
            return []
        num_tokens = int(self.slots.prompt_len[slot] + self.slots.num_output[slot])
        # the last token is always recomputed, so a full hit still leaves one token to schedule (vLLM)
        hits = lookup(self.prefix_cache, self._cached[slot], (num_tokens - 1) // self.limits.block_size)
        self.stats.record_prefix_cache(num_tokens, len(hits) * self.limits.block_size)
        return hits

    def _register(self, chosen: np.ndarray, granted: np.ndarray) -> None:
        """Cache the full prompt blocks just scheduled for requests still in their prefill."""
        if self.prefix_cache is None:
            return
        covered = np.minimum(self.slots.num_computed[chosen] + granted, self.slots.prompt_len[chosen])
        prefilling = self.slots.num_computed[chosen] < self.slots.prompt_len[chosen]
        size = self.limits.block_size
        for slot, tokens in zip(chosen[prefilling].tolist(), covered[prefilling].tolist(), strict=True):
            register_prompt_blocks(self.prefix_cache, self._cached[slot], tokens // size)

    # ----- scheduling ----------------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return int(self._running.size)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_cache_usage(self) -> float:
        """vLLM's kv_cache_usage_perc: 1 - free / (num_gpu_blocks - 1)."""
        return 1.0 - self.free_blocks / self.usable_blocks

    def has_work(self) -> bool:
        return bool(self._running.size or self._waiting)

    def schedule(self, now: float) -> Step | None:
        """Choose the next batch (V1 semantics, FCFS policy) and price it; None when idle."""
        if not self.has_work():
            return None
        budget = self.limits.max_num_batched_tokens
        cap = self.limits.prefill_cap(self.num_running, self.num_waiting)
        parts: list[np.ndarray] = []
        counts: list[np.ndarray] = []
        budget, preempted = self._schedule_running(budget, cap, parts, counts)
        if not preempted:
            self._schedule_waiting(now, budget, cap, parts, counts)
        chosen = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        new_tokens = np.concatenate(counts) if counts else np.zeros(0, dtype=np.int64)
        duration = self._cost.step_seconds(new_tokens, self.slots.num_computed[chosen]) if chosen.size else 0.0
        self._step_in_flight = True
        return Step(now, now + duration, chosen, new_tokens, preempted)

    def _blocks_needed(self, slots: np.ndarray, new_tokens: np.ndarray) -> np.ndarray:
        size = self.limits.block_size
        total = (self.slots.num_computed[slots] + new_tokens + size - 1) // size
        return np.maximum(total - self.slots.num_blocks[slots], 0)

    def _schedule_running(self, budget: int, cap: int, parts: list[np.ndarray], counts: list[np.ndarray]
                          ) -> tuple[int, int]:
        """Phase 1: every running request in order gets its remaining tokens (at most ``cap``, when set), within
        the budget."""
        preempted = 0
        start = 0
        while start < self._running.size and budget > 0:
            segment = self._running[start:]
            need = self.slots.prompt_len[segment] + self.slots.num_output[segment] - self.slots.num_computed[segment]
            if cap:
                need = np.minimum(need, cap)
            before = np.cumsum(need) - need
            granted = np.minimum(need, np.maximum(budget - before, 0))
            served = int(np.count_nonzero(granted))  # a prefix: once the budget is gone the rest get 0
            segment, granted = segment[:served], granted[:served]
            blocks = self._blocks_needed(segment, granted)
            fits = np.cumsum(blocks) <= self.free_blocks
            ok = served if fits.all() else int(np.argmin(fits))
            self._allocate(segment[:ok], granted[:ok], blocks[:ok], parts, counts)
            budget -= int(granted[:ok].sum())
            if ok == served:
                break
            # the request at `ok` lacks blocks: preempt the newest running requests until it fits
            blocked = int(segment[ok])
            while self.free_blocks < blocks[ok]:
                victim = int(self._running[-1])
                self._preempt(victim)
                preempted += 1
                if victim == blocked:
                    return budget, preempted
            self._allocate(segment[ok : ok + 1], granted[ok : ok + 1], blocks[ok : ok + 1], parts, counts)
            budget -= int(granted[ok])
            start += ok + 1
        return budget, preempted

    def _allocate(self, chosen: np.ndarray, granted: np.ndarray, blocks: np.ndarray, parts: list[np.ndarray],
                  counts: list[np.ndarray]) -> None:
        if chosen.size == 0:
            return
        self.slots.num_blocks[chosen] += blocks
        self._take_blocks(int(blocks.sum()))
        self._register(chosen, granted)
        parts.append(chosen)
        counts.append(granted)

    def _preempt(self, slot: int) -> None:
        """Recompute-style preemption: free everything, forget computed tokens, go to the queue's front."""
        self._running = self._running[:-1]
        self._release_blocks(np.array([slot]), preempted=True)
        self.slots.num_computed[slot] = 0
        self.slots.preemptions[slot] += 1
        self.stats.num_preemptions += 1
        self.slots.state[slot] = WAITING
        self._waiting.appendleft(slot)

    def _schedule_waiting(self, now: float, budget: int, cap: int, parts: list[np.ndarray], counts: list[np.ndarray]
                          ) -> None:
        """Phase 2: admit waiting requests FCFS while budget, the RUNNING cap and KV blocks allow; each gets its
        remaining tokens, at most ``cap`` when set."""
        admitted: list[int] = []
        size = self.limits.block_size
        room = self.limits.running_cap - self._running.size
        while self._waiting and budget > 0 and len(admitted) < room:
            slot = self._waiting[0]
            hits = self._cache_hits(slot)
            computed = len(hits) * size
            remaining = int(self.slots.prompt_len[slot] + self.slots.num_output[slot]) - computed
            granted = min(remaining, cap or remaining, budget)
            blocks = -(-(computed + granted) // size) - len(hits)
            # a hit on a free cached block takes it out of the free queue
            evictable = self.prefix_cache.evictable(hits) if hits and self.prefix_cache is not None else 0
            if blocks + evictable > self.free_blocks:
                break  # head-of-line: waiting requests never preempt
            self._waiting.popleft()
            if hits and self.prefix_cache is not None:
                self.prefix_cache.touch(hits)
                self._cached[slot].held = hits
            self._take_blocks(blocks)
            self.slots.num_blocks[slot] = len(hits) + blocks
            self.slots.num_computed[slot] = computed
            self._register(np.array([slot]), np.array([granted]))
            self.slots.state[slot] = RUNNING
            if np.isnan(self.slots.first_scheduled[slot]):
                self.slots.first_scheduled[slot] = now
                # vLLM sets num_cached_tokens once, here: a resumed request's hits on its own blocks are not in it
                self.slots.cached_tokens[slot] = computed
            admitted.append(slot)
            budget -= granted
            parts.append(np.array([slot]))
            counts.append(np.array([granted]))
        if admitted:
            self._running = np.concatenate([self._running, np.array(admitted, dtype=np.int64)])

    # ----- step completion -----------------------------------------------------------------------------

    def complete(self, step: Step, now: float) -> StepOutput:
        """Apply a step's results at ``now`` (its end, or later in real time): tokens, finishes, stats."""
        self._step_in_flight = False
        alive = self.slots.state[step.slots] == RUNNING  # skip requests aborted during the step
        slots, new_tokens = step.slots[alive], step.new_tokens[alive]
        self.slots.num_computed[slots] += new_tokens
        sampled = slots[self.slots.num_computed[slots] == self.slots.prompt_len[slots] + self.slots.num_output[slots]]
        first = self.slots.num_output[sampled] == 0
        self.slots.num_output[sampled] += 1
        self._record_tokens(sampled, first, now)
        output_len = self.slots.num_output[sampled]
        by_length = output_len >= self.slots.max_tokens[sampled]
        by_stop = ~by_length & (output_len >= self.slots.eos_at[sampled])
        done = by_length | by_stop
        finished = sampled[done]
        reasons = np.where(by_length[done], REASON_LENGTH, REASON_STOP)
        if finished.size:
            self._finish(finished, reasons, now)
        out = StepOutput(sampled, output_len, finished, reasons)
        self._release_slots()
        return out

    def _record_tokens(self, sampled: np.ndarray, first: np.ndarray, now: float) -> None:
        firsts, decodes = sampled[first], sampled[~first]
        self.slots.first_token[firsts] = now
        self.stats.record_tokens(
            ttft=now - self.slots.arrival[firsts],
            itl=now - self.slots.last_token[decodes],
            prompt_tokens_of_first=int(self.slots.prompt_len[firsts].sum()),
            cached_tokens_of_first=int(self.slots.cached_tokens[firsts].sum()),
        )
        self.slots.last_token[sampled] = now

    def _finish(self, finished: np.ndarray, reasons: np.ndarray, now: float) -> None:
        self._release_blocks(finished)
        self.slots.state[finished] = FINISHED
        self._running = self._running[self.slots.state[self._running] == RUNNING]
        for code, name in enumerate(REASON_NAMES):
            group = finished[reasons == code]
            self.stats.record_finished(
                name,
                arrival=self.slots.arrival[group],
                scheduled=self.slots.first_scheduled[group],
                first_token=self.slots.first_token[group],
                last_token=self.slots.last_token[group],
                now=now,
                prompt_tokens=self.slots.prompt_len[group],
                generation_tokens=self.slots.num_output[group],
                max_tokens=self.slots.max_tokens[group],
                preemptions=self.slots.preemptions[group],
                cached_tokens=self.slots.cached_tokens[group],
            )
        self._pending_release.extend(int(s) for s in finished)
