"""Drive the engine core in real time inside an asyncio loop and hand tokens to the waiting HTTP handlers.

Each step is scheduled now, slept until its end on the modelled timeline, then completed at the actual wake-up
time, so a late wake-up shows up in the latencies as a slow engine would, without slowing the pace of the steps
that follow. The lag (actual - modelled end) is kept for the benchmark and for /sim/stats. The profile's output
path (``engine.frontend.output_s``) holds each step's tokens back that long before they are handed over, in
step order, as the virtual clock shifts their times. The API server's admission counts (``engine.admission``)
follow the deliveries: a request is counted in at submit, its prompt leaves the backlog at its first delivery,
and it leaves at its last (or its abort).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

import numpy as np

from batchscope.simulator.engine import EngineCore, StepOutput
from batchscope.simulator.faults import EngineStall
from batchscope.simulator.finish import REASON_NAMES

RESYNC_S = 0.05
# libuv timers have millisecond resolution and so fire half a millisecond late on average: waits for a fixed
# latency aim that much early, so the mean latency is the modelled one
TIMER_SLACK_S = 0.0005
Delivery = tuple["RequestStream", int, str | None]  # a stream, its tokens produced so far, its finish reason
# streams written between two yields to the event loop (~25 µs each): a request arriving during a large step's
# burst of writes is taken in (its handler run) within a fraction of a millisecond; vLLM's API server yields every
# VLLM_V1_OUTPUT_PROC_CHUNK_SIZE outputs for the same reason
DELIVERY_SLICE = 8


class Refused(Exception):
    """The admission check refused the request (``reason``: the queue limit that did)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RequestStream:
    """Tokens of one request as the engine produces them.

    Either the HTTP handler awaits and drains it, or it sets ``sink``: a plain function the engine loop calls
    with each step's result. Streaming responses use a sink that writes the events straight to the socket, so a
    step costs one write per stream and no task switch.
    """

    __slots__ = ("slot", "produced", "finish_reason", "sink", "_event")

    def __init__(self, slot: int = -1) -> None:
        self.slot = slot
        self.produced = 0  # output tokens produced so far
        self.finish_reason: str | None = None
        self.sink: Callable[[int, str | None], None] | None = None
        self._event = asyncio.Event()

    def _push(self, produced: int, finish_reason: str | None) -> None:
        self.produced = produced
        self.finish_reason = finish_reason
        if self.sink is not None:
            self.sink(produced, finish_reason)
        else:
            self._event.set()

    async def wait(self) -> None:
        """Until something new was produced since the last wait."""
        await self._event.wait()
        self._event.clear()

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class RealtimeEngine:
    """Owns the engine core, the step loop and the map from engine slots to open streams."""

    LAG_WINDOW = 100_000

    def __init__(self, engine: EngineCore, stall: EngineStall | None = None) -> None:
        self.engine = engine
        self._stall = stall
        self._started = 0.0  # the loop clock at start(), where a stall's onset counts from
        self._streams: dict[int, RequestStream] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._output_s = engine.frontend.output_s
        self._outbox: deque[tuple[float, list[Delivery]]] = deque()  # (when due, what), in step order
        self._outbox_filled = asyncio.Event()
        self._courier: asyncio.Task | None = None
        self.steps = 0
        self.tokens = 0
        self.step_lags: deque[float] = deque(maxlen=self.LAG_WINDOW)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._started = loop.time()
        self._task = loop.create_task(self._run(), name="engine-loop")
        if self._output_s > 0:
            self._courier = loop.create_task(self._carry(), name="output-path")

    async def stop(self) -> None:
        tasks = [task for task in (self._task, self._courier) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def submit(self, prompt_len: int, max_tokens: int, ignore_eos: bool, min_tokens: int,
               prompt_hashes: list[int] | None = None) -> RequestStream:
        """Queue a request in the engine; Refused when the admission check refuses it (checked and counted at
        once, with no await between, as vLLM's AsyncLLM._add_request)."""
        stream = RequestStream()
        reason = self.engine.admission.admit(stream, prompt_len)
        if reason is not None:
            raise Refused(reason)
        now = asyncio.get_running_loop().time()
        stream.slot = self.engine.add_request(now, prompt_len, max_tokens, ignore_eos, min_tokens, prompt_hashes)
        self._streams[stream.slot] = stream
        self._wake.set()
        return stream

    def abort(self, stream: RequestStream) -> None:
        """The client went away: free the request's KV blocks and forget it."""
        if self._streams.get(stream.slot) is stream:
            del self._streams[stream.slot]
            self.engine.abort(stream.slot)
            self.engine.admission.leave(stream)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        engine = self.engine
        pace = loop.time()  # when the next step should start on the modelled timeline
        while True:
            now = loop.time()
            resume = self._stall.resumes_at(self._started, now) if self._stall is not None else None
            if resume is not None:  # an injected hang: nothing is scheduled, arrivals queue up meanwhile
                await asyncio.sleep(resume - now)
                continue
            step = engine.schedule(now)
            if step is None:
                self._wake.clear()
                await self._wake.wait()
                pace = loop.time()
                continue
            # Timers fire late (whole milliseconds, and uvloop adds the time handlers ran during the sleep). A
            # step therefore ends on the modelled timeline, not after a full duration from a late wake-up, so the
            # server keeps the profile's pace; a loop that falls far behind (CPU-bound) starts afresh from now.
            start = pace if now - pace < RESYNC_S else now
            target_end = start + (step.end - step.start)
            # sleep(0) still yields, so handlers and new arrivals get their turn between steps
            await asyncio.sleep(max(target_end - loop.time(), 0.0))
            now = loop.time()
            self.step_lags.append(now - target_end)
            deliveries = self._addressed(engine.complete(step, now))
            if self._courier is None:
                await self._deliver(deliveries)
            else:
                self._outbox.append((target_end + self._output_s, deliveries))
                self._outbox_filled.set()
            self.steps += 1
            pace = target_end
            # a step's completion and the next one's scheduling are each ~0.3-0.6 ms of numpy at hundreds of
            # streams: requests arriving in between are taken in between the two, as vLLM's engine
            # core takes its input queue between steps
            await asyncio.sleep(0)

    def _addressed(self, output: StepOutput) -> list[Delivery]:
        """Each stream's new tokens. Looked up at once: a slot this step released may go to a new request."""
        streams = self._streams
        finished = dict(zip(output.finished_slots.tolist(), output.finish_reasons.tolist(), strict=True))
        self.tokens += output.token_slots.size
        deliveries = []
        for slot, produced in zip(output.token_slots.tolist(), output.token_index.tolist(), strict=True):
            reason = finished.get(slot)
            stream = streams.pop(slot, None) if reason is not None else streams.get(slot)
            if stream is not None:
                deliveries.append((stream, produced, None if reason is None else REASON_NAMES[reason]))
        return deliveries

    async def _deliver(self, deliveries: list[Delivery]) -> None:
        """Hand each stream its new tokens, yielding to the event loop every few streams.

        The yields let the loop take in new requests during a large step's burst of writes, instead of after
        it (that wait would be part of every TTFT).
        """
        admission = self.engine.admission
        for index, (stream, produced, reason) in enumerate(deliveries, start=1):
            if stream.produced == 0:
                admission.prefilled(stream)
            if reason is not None:
                admission.leave(stream)
            stream._push(produced, reason)
            if index % DELIVERY_SLICE == 0:
                await asyncio.sleep(0)

    async def _carry(self) -> None:
        """The output path: deliver each step's tokens when due, one step after another."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._outbox:
                self._outbox_filled.clear()
                await self._outbox_filled.wait()
                continue
            due, deliveries = self._outbox[0]
            await asyncio.sleep(max(due - TIMER_SLACK_S - loop.time(), 0.0))
            self._outbox.popleft()
            await self._deliver(deliveries)

    def lag_summary(self) -> dict[str, float]:
        """Step lag percentiles over the recent window, seconds."""
        if not self.step_lags:
            return {"p50": 0.0, "p99": 0.0, "max": 0.0}
        lags = np.fromiter(self.step_lags, dtype=float)
        return {"p50": float(np.percentile(lags, 50)), "p99": float(np.percentile(lags, 99)),
                "max": float(lags.max())}
