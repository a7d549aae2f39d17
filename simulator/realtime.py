"""Drive the engine core in real time inside an asyncio loop and hand tokens to the waiting HTTP handlers.

Each step is scheduled now, slept until its end on the modelled timeline, then completed at the actual wake-up
time, so a late wake-up shows up in the latencies as a slow engine would, without slowing the pace of the steps
that follow. The lag (actual - modelled end) is kept for the benchmark and for /sim/stats.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

import numpy as np

from simulator.engine import EngineCore, StepOutput
from simulator.finish import REASON_NAMES

RESYNC_S = 0.05
DELIVERY_SLICE = 32


class RequestStream:
    """Tokens of one request as the engine produces them.

    Either the HTTP handler awaits and drains it, or it sets ``sink``: a plain function the engine loop calls
    with each step's result. Streaming responses use a sink that writes the events straight to the socket, so a
    step costs one write per stream and no task switch.
    """

    __slots__ = ("slot", "produced", "finish_reason", "sink", "_event")

    def __init__(self, slot: int) -> None:
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

    def __init__(self, engine: EngineCore) -> None:
        self.engine = engine
        self._streams: dict[int, RequestStream] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.steps = 0
        self.tokens = 0
        self.step_lags: deque[float] = deque(maxlen=self.LAG_WINDOW)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-loop")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def submit(self, prompt_len: int, max_tokens: int, ignore_eos: bool, min_tokens: int) -> RequestStream:
        now = asyncio.get_running_loop().time()
        slot = self.engine.add_request(now, prompt_len, max_tokens, ignore_eos, min_tokens)
        stream = RequestStream(slot)
        self._streams[slot] = stream
        self._wake.set()
        return stream

    def abort(self, stream: RequestStream) -> None:
        """The client went away: free the request's KV blocks and forget it."""
        if self._streams.get(stream.slot) is stream:
            del self._streams[stream.slot]
            self.engine.abort(stream.slot)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        engine = self.engine
        pace = loop.time()  # when the next step should start on the modelled timeline
        while True:
            now = loop.time()
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
            await self._deliver(engine.complete(step, now))
            self.steps += 1
            pace = target_end

    async def _deliver(self, output: StepOutput) -> None:
        """Hand each stream its new tokens, yielding to the event loop every few streams.

        The streams are looked up before the first yield: a slot released by this step may be given to a new
        request while we yield. The yields let the loop take in new requests during a large step's burst of
        writes, instead of after it (that wait would be part of every TTFT).
        """
        streams = self._streams
        finished = dict(zip(output.finished_slots.tolist(), output.finish_reasons.tolist(), strict=True))
        self.tokens += output.token_slots.size
        deliveries = []
        for slot, produced in zip(output.token_slots.tolist(), output.token_index.tolist(), strict=True):
            reason = finished.get(slot)
            stream = streams.pop(slot, None) if reason is not None else streams.get(slot)
            if stream is not None:
                deliveries.append((stream, produced, None if reason is None else REASON_NAMES[reason]))
        for index, (stream, produced, reason) in enumerate(deliveries, start=1):
            stream._push(produced, reason)
            if index % DELIVERY_SLICE == 0:
                await asyncio.sleep(0)

    def lag_summary(self) -> dict[str, float]:
        """Step lag percentiles over the recent window, seconds."""
        if not self.step_lags:
            return {"p50": 0.0, "p99": 0.0, "max": 0.0}
        lags = np.fromiter(self.step_lags, dtype=float)
        return {"p50": float(np.percentile(lags, 50)), "p99": float(np.percentile(lags, 99)),
                "max": float(lags.max())}
