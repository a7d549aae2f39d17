"""Run the engine core on a virtual clock: minutes of load in a fraction of a second, deterministically.

Used by the tests and for what-if runs. ``run_timed`` runs a load that stops (``ClosedLoop`` users or
``FixedArrivals``), ``run_virtual`` a fixed workload to its end, both on one event loop (``_EventLoop``).
How front-end latencies and in-flight counts apply: docs/simulator.md, "The virtual clock".
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Protocol

import numpy as np

from batchscope.simulator.engine import EngineCore, Step, StepOutput
from batchscope.simulator.finish import REASON_NAMES
from batchscope.simulator.prefix_cache import block_hashes
from batchscope.workload import poisson


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload: when it arrives and how long it is."""

    arrival: float
    prompt_len: int
    max_tokens: int
    ignore_eos: bool = True
    min_tokens: int = 0
    prompt_ids: tuple[int, ...] | None = None  # token ids, for prefix caching (None: a prompt nothing shares)


REJECTED = "rejected"  # a refused request's finish_reason: it never reached the engine (not one of vLLM's reasons)
# how long a closed-loop user waits after a refusal before its next request: the load generator's ADMISSION_PAUSE_S
REJECTED_PAUSE_S = 0.1


@dataclass(frozen=True)
class RequestRecord:
    """One finished request, timed on the virtual clock (seconds); or one the admission check refused
    (``rejected``: the reason; no token, no engine time, times NaN but ``finished``: when it was refused)."""

    index: int
    arrival: float
    first_scheduled: float
    first_token: float
    finished: float
    prompt_tokens: int
    output_tokens: int
    finish_reason: str
    preemptions: int
    rejected: str | None = None


@dataclass
class SimulationResult:
    """Per-request records plus time-weighted scheduler state over the run."""

    records: list[RequestRecord] = field(default_factory=list)
    steps: int = 0
    duration: float = 0.0
    mean_waiting: float = 0.0
    max_waiting: int = 0
    mean_running: float = 0.0
    max_kv_cache_usage: float = 0.0


def poisson_workload(
    rate: float, count: int, prompt_len: int, max_tokens: int, seed: int = 0
) -> list[RequestSpec]:
    """``count`` identical requests arriving at ``rate`` per second (workload.poisson, one sender's stream)."""
    return [RequestSpec(t, prompt_len, max_tokens) for t in poisson.first(count, rate, seed).tolist()]


def add_to_engine(engine: EngineCore, spec: RequestSpec, now: float) -> int:
    """Queue ``spec`` in ``engine`` at ``now`` (when its input path is done); return its slot."""
    hashes = None
    if spec.prompt_ids is not None and engine.prefix_cache is not None:
        hashes = block_hashes(spec.prompt_ids, engine.limits.block_size)
    return engine.add_request(now, spec.prompt_len, spec.max_tokens, spec.ignore_eos, spec.min_tokens, hashes)


def run_virtual(engine: EngineCore, workload: Sequence[RequestSpec], max_steps: int = 5_000_000) -> SimulationResult:
    """Feed ``workload`` to ``engine`` at its arrival times and step until every request is back at its client:
    run_timed's loop with fixed arrivals, no stop and no token gaps kept. A record's index is its request's place
    in ``workload``."""
    place = sorted(range(len(workload)), key=lambda i: workload[i].arrival)  # FixedArrivals' order -> place
    run = _EventLoop(engine, FixedArrivals(workload), math.inf, keep_gaps=False).run(max_steps)
    result = SimulationResult(**{part.name: getattr(run, part.name) for part in fields(SimulationResult)})
    result.records = [replace(record, index=place[record.index]) for record in run.records]
    return result


def _rejected_record(index: int, spec: RequestSpec, now: float, reason: str) -> RequestRecord:
    nan = math.nan
    return RequestRecord(index, spec.arrival, nan, nan, now, spec.prompt_len, 0, REJECTED, 0, rejected=reason)


def _record(engine: EngineCore, slot: int, index: int, arrival: float, reason: int) -> RequestRecord:
    # read right after complete(): the slot is released but not reused before the next add_request
    slots = engine.slots
    output_s = engine.frontend.output_s
    return RequestRecord(
        index=index,
        arrival=arrival,
        first_scheduled=float(slots.first_scheduled[slot]),
        first_token=float(slots.first_token[slot]) + output_s,
        finished=float(slots.last_token[slot]) + output_s,
        prompt_tokens=int(slots.prompt_len[slot]),
        output_tokens=int(slots.num_output[slot]),
        finish_reason=REASON_NAMES[reason],
        preemptions=int(slots.preemptions[slot]),
    )


# ----- timed runs: a load that stops, as the load generator's does ---------------------------------------


class FixedArrivals:
    """Open-loop arrivals known in advance (Poisson, offline): the workload's requests at their times."""

    def __init__(self, workload: Sequence[RequestSpec]) -> None:
        self._workload = sorted(workload, key=lambda spec: spec.arrival)
        self._next = 0

    def next_time(self) -> float:
        return self._workload[self._next].arrival if self._next < len(self._workload) else math.inf

    def take(self) -> RequestSpec:
        self._next += 1
        return self._workload[self._next - 1]

    def finished(self, index: int, now: float, rejected: bool = False) -> None:
        """Open loop: a completion or a refusal changes nothing."""


class ClosedLoop:
    """N users, each sending its next request the moment its previous one ends (load mode `concurrency`).

    User u sends its first request at u x ramp_up_s / N, as the load generator starts its users; no request is
    sent at or after ``issue_until`` (the run's stop). A user whose request was refused waits ``rejected_pause_s``
    (> 0) first, as the load generator's users do.
    """

    def __init__(self, users: int, prompt_len: int, max_tokens: int, ramp_up_s: float = 0.0,
                 issue_until: float = math.inf, rejected_pause_s: float = REJECTED_PAUSE_S) -> None:
        if rejected_pause_s <= 0:
            raise ValueError(f"rejected_pause_s must be > 0, got {rejected_pause_s:g}")  # else a refused user spins
        self._template = (prompt_len, max_tokens)
        self._pause_s = rejected_pause_s
        self._issue_until = issue_until
        self._due: list[tuple[float, int]] = [(u * ramp_up_s / users, u) for u in range(users)]
        heapq.heapify(self._due)
        self._user_of: list[int] = []  # request index -> user
        self.in_flight = 0  # users whose request is out: sent, and its last token not yet back

    def next_time(self) -> float:
        moment = self._due[0][0] if self._due else math.inf
        return moment if moment < self._issue_until else math.inf

    def take(self) -> RequestSpec:
        moment, user = heapq.heappop(self._due)
        self._user_of.append(user)
        self.in_flight += 1
        return RequestSpec(moment, *self._template)

    def finished(self, index: int, now: float, rejected: bool = False) -> None:
        self.in_flight -= 1
        heapq.heappush(self._due, (now + self._pause_s if rejected else now, self._user_of[index]))


class ArrivalSource(Protocol):
    """Where a timed run's requests come from; request indices count ``take()`` calls from 0."""

    def next_time(self) -> float: ...  # when the next request arrives (math.inf: none is due)

    def take(self) -> RequestSpec: ...

    # request ``index``'s last token reached its client, or (``rejected``) its refusal did
    def finished(self, index: int, now: float, rejected: bool = False) -> None: ...


StepObserver = Callable[[EngineCore, Step], None]
PromptIds = Callable[[int], Sequence[int]]  # the prompt token ids of the n-th request sent (n from 0)


@dataclass
class TimedResult(SimulationResult):
    """A timed run: run_virtual's result plus the load generator's accounting and every token gap."""

    stop: float = math.inf
    issued: int = 0
    refused: int = 0  # arrivals not sent: max_in_flight requests were already in flight
    cut: int = 0  # in flight at the stop, on the front end's paths or in the engine (the load generator aborts them)
    gaps: dict[int, np.ndarray] = field(default_factory=dict)  # request index -> its inter-token gaps, seconds


def run_timed(engine: EngineCore, source: ArrivalSource, stop: float = math.inf, *,
              max_in_flight: int | None = None, on_step: StepObserver | None = None,
              prompts: PromptIds | None = None, max_steps: int = 5_000_000) -> TimedResult:
    """Step ``engine`` under ``source`` until ``stop``, or, with no stop, until every request is back.

    At ``stop`` the run ends as the load generator's does: the step running then never delivers and the
    requests in flight are cut (counted, not recorded). A request is recorded, and its source told, when its
    last token reaches the client (after the output path), or when the engine's admission check refuses it.
    ``on_step`` sees each step right after it is scheduled (the batch it runs with), before its results apply.
    Token gaps are kept for every finished request.
    """
    loop = _EventLoop(engine, source, stop, max_in_flight=max_in_flight, on_step=on_step, prompts=prompts)
    return loop.run(max_steps)


class _EventLoop:
    """One run on the virtual clock, moved from event to event: an arrival is sent, a sent request reaches the
    engine (after its input path), a step ends, a last token reaches its client (after its output path).

    A request is in flight from its send until its last token is back: on its input path (``transit``), in the
    engine (``slot_to_index``), then on its output path (``returning``). The admission check runs at the send
    (vLLM's pre-flight) and when it reaches the engine (counted in at once); the API server's counts move when
    a first token (``first_outputs``) or a last one is back, each applied in time order before a check.
    """

    def __init__(self, engine: EngineCore, source: ArrivalSource, stop: float, *, max_in_flight: int | None = None,
                 on_step: StepObserver | None = None, prompts: PromptIds | None = None,
                 keep_gaps: bool = True) -> None:
        self.engine, self.source, self.stop = engine, source, stop
        self.max_in_flight, self.on_step, self.prompts = max_in_flight, on_step, prompts
        self.result = TimedResult(stop=stop)
        self.now = self.waiting_area = self.running_area = 0.0
        self.transit: list[tuple[float, int, RequestSpec]] = []  # (reaches the engine, index, spec), a heap
        self.slot_to_index: dict[int, int] = {}
        self.returning: deque[RequestRecord] = deque()  # FIFO by when they are back: every output path is alike
        self.first_outputs: deque[tuple[float, int]] = deque()  # (first token back, index), FIFO as returning
        self.arrivals: dict[int, float] = {}  # request index -> when its client sent it
        self.gaps = _TokenGaps(engine.slots.capacity) if keep_gaps else None

    def run(self, max_steps: int) -> TimedResult:
        while self.result.steps < max_steps:
            self._take_in()
            step = self.engine.schedule(self.now)
            if step is None:
                if self._idle_to_next_event():
                    continue
                break
            if self.on_step is not None:
                self.on_step(self.engine, step)
            if step.end > self.stop:
                self.now = self.stop  # the step running at the stop never delivers
                break
            self._complete(step)
        else:
            raise RuntimeError(f"virtual run did not finish within max_steps={max_steps}")
        return self._close()

    def _in_flight(self) -> int:
        return len(self.transit) + len(self.slot_to_index) + len(self.returning)

    def _deliver_returned(self, until: float) -> None:
        """First and last tokens back at their clients by ``until``: the API server's counts follow them."""
        admission = self.engine.admission
        while self.first_outputs and self.first_outputs[0][0] <= until:
            admission.prefilled(self.first_outputs.popleft()[1])
        while self.returning and self.returning[0].finished <= until:
            record = self.returning.popleft()
            admission.leave(record.index)
            self.result.records.append(record)
            self.source.finished(record.index, record.finished)

    def _next_in(self) -> float:
        """When the next request is sent or reaches the engine."""
        return min(self.source.next_time(), self.transit[0][0] if self.transit else math.inf)

    def _take_in(self) -> None:
        """Sends and arrivals at the engine due by now, in time order, each after the tokens back before it."""
        while True:
            moment = min(self._next_in(), self.now)
            self._deliver_returned(moment)
            if self._next_in() > self.now:
                return
            if self._next_in() < moment:
                continue  # a user whose request came back meanwhile sends first
            if self.source.next_time() == moment:
                self._send()
            else:
                self._reach()

    def _send(self) -> None:
        result = self.result
        spec = self.source.take()
        if self.max_in_flight is not None and self._in_flight() >= self.max_in_flight:
            result.refused += 1  # keeps its index; open loop only (a closed loop never exceeds its users)
            return
        index = result.issued + result.refused
        result.issued += 1
        if self._rejected(index, spec, spec.arrival, self.engine.admission.check()):
            return
        if self.prompts is not None:
            spec = replace(spec, prompt_ids=tuple(self.prompts(result.issued - 1)))
        self.arrivals[index] = spec.arrival
        heapq.heappush(self.transit, (spec.arrival + self.engine.frontend.input_s(spec.prompt_len), index, spec))

    def _rejected(self, index: int, spec: RequestSpec, now: float, reason: str | None) -> bool:
        """Record a refusal (``reason`` set) at once: no engine time, no output path."""
        if reason is None:
            return False
        self.result.records.append(_rejected_record(index, spec, now, reason))
        self.source.finished(index, now, rejected=True)
        return True

    def _reach(self) -> None:
        reach, index, spec = heapq.heappop(self.transit)
        if self._rejected(index, spec, reach, self.engine.admission.admit(index, spec.prompt_len)):
            del self.arrivals[index]
            return
        slot = add_to_engine(self.engine, spec, reach)
        self.slot_to_index[slot] = index
        if self.gaps is not None:
            self.gaps.place(slot, index, self.engine.slots.capacity)

    def _idle_to_next_event(self) -> bool:
        """Nothing to schedule: move the clock to the next event before the stop; False when there is none."""
        due = min(self.source.next_time(), self.transit[0][0] if self.transit else math.inf,
                  self.returning[0].finished if self.returning else math.inf,
                  self.first_outputs[0][0] if self.first_outputs else math.inf)
        if due >= self.stop or due == math.inf:
            self.now = self.stop if self.stop < math.inf else self.now  # idle to the stop: the run still lasted
            return False
        self.now = due
        return True

    def _complete(self, step: Step) -> None:
        engine, result = self.engine, self.result
        result.max_waiting = max(result.max_waiting, engine.num_waiting)
        self.waiting_area += engine.num_waiting * (step.end - step.start)
        self.running_area += engine.num_running * (step.end - step.start)
        result.max_kv_cache_usage = max(result.max_kv_cache_usage, engine.kv_cache_usage)
        last_token = engine.slots.last_token.copy() if self.gaps is not None else None  # complete() overwrites it
        output = engine.complete(step, step.end)
        result.steps += 1
        self.now = step.end
        if self.gaps is not None and last_token is not None:
            self.gaps.add(output, self.now, last_token)
        back = self.now + engine.frontend.output_s
        for slot in output.token_slots[output.token_index == 1].tolist():
            self.first_outputs.append((back, self.slot_to_index[slot]))
        for slot, reason in zip(output.finished_slots.tolist(), output.finish_reasons.tolist(), strict=True):
            index = self.slot_to_index.pop(slot)
            self.returning.append(_record(engine, slot, index, self.arrivals.pop(index), reason))

    def _close(self) -> TimedResult:
        result, now = self.result, self.now
        back = [record for record in self.returning if record.finished <= now]  # came back while the last step ran
        result.records.extend(back)
        result.cut = self._in_flight() - len(back)
        result.duration = now
        if now > 0:
            result.mean_waiting = self.waiting_area / now
            result.mean_running = self.running_area / now
        if self.gaps is not None:
            result.gaps = self.gaps.grouped({record.index for record in result.records})
        return result


class _TokenGaps:
    """Every gap between a request's consecutive tokens, gathered a step at a time and grouped per request once."""

    def __init__(self, capacity: int) -> None:
        self.index_of = np.full(capacity, -1, dtype=np.int64)  # slot -> request index, for vectorised lookups
        self.indices: list[np.ndarray] = []
        self.values: list[np.ndarray] = []

    def place(self, slot: int, index: int, capacity: int) -> None:
        if slot >= self.index_of.size:
            self.index_of = np.concatenate((self.index_of, np.full(max(slot + 1, capacity) - self.index_of.size, -1)))
        self.index_of[slot] = index

    def add(self, output: StepOutput, now: float, last_token: np.ndarray) -> None:
        """The gaps of a step's tokens after each request's first, measured from its previous token."""
        decoded = output.token_slots[output.token_index > 1]
        if decoded.size:
            self.indices.append(self.index_of[decoded])
            self.values.append(now - last_token[decoded])

    def grouped(self, keep: set[int]) -> dict[int, np.ndarray]:
        """Per-request gap arrays (in token order) for the requests in ``keep``; one sort instead of per-token work."""
        if not self.indices:
            return {}
        index, value = np.concatenate(self.indices), np.concatenate(self.values)
        order = np.argsort(index, kind="stable")  # stable: each request's gaps stay in time order
        index, value = index[order], value[order]
        bounds = np.flatnonzero(np.diff(index)) + 1
        starts = np.concatenate(([0], bounds))
        return {int(index[s]): part for s, part in zip(starts, np.split(value, bounds), strict=True)
                if int(index[s]) in keep}

