"""The reference client: the least a streaming client can do, so that benches can tell what a real one costs.

In a bench it runs as a child process, so that its CPU is its own:

    python -m batchscope.testkit.reference_client --url URL --body BODY.json --streams N --warmup S \\
        --duration S --timings OUT.json [--rate R] [--ramp-s S]

What it counts and what it prints: docs/testkit.md, "The reference client".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np

COMPLETION_TEXT = b'"text":"'  # once per token event of a completions stream; the usage chunk has none
EVENT = b"data: {"  # once per SSE event: one per token when no usage chunk is asked for
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 60.0
RAMP_TIMEOUT_S = 40.0
POLL_S = 0.05

Timing = tuple[str, float, float | None, float | None, int]  # request id, sent, first, last token, tokens


class MarkerCounter:
    """Occurrences of ``marker`` in a stream read in chunks: one split across two chunks counts once, in the later."""

    def __init__(self, marker: bytes) -> None:
        self.marker = marker
        self.keep = len(marker) - 1
        self.tail = b""

    def feed(self, chunk: bytes) -> int:
        data = self.tail + chunk
        self.tail = data[-self.keep:] if self.keep else b""
        return data.count(self.marker)


class ReferenceClient:
    """Streams of completions on one aiohttp session, counted by marker; ``tokens`` and ``errors`` are running
    totals, ``timings`` one entry per request that completed."""

    def __init__(self, session: aiohttp.ClientSession, url: str, body: bytes, marker: bytes = COMPLETION_TEXT,
                 expected_tokens: int | None = None, error_pause_s: float = 0.0) -> None:
        self.session, self.url, self.body, self.marker = session, url, body, marker
        self.expected = expected_tokens  # a stream with another count is an error (None: any count)
        self.error_pause_s = error_pause_s  # a closed-loop user waits this long after a failed request
        self.tokens = 0
        self.errors = 0
        self.users_ready = 0  # closed-loop users whose first request completed
        self.timings: list[Timing] = []

    async def one(self, request_id: str) -> bool:
        """Send one request and read it to the end; False when it failed."""
        headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
        counter = MarkerCounter(self.marker)
        first = last = None
        count = 0
        sent = time.time()
        try:
            async with self.session.post(self.url, data=self.body, headers=headers) as response:
                if response.status != 200:
                    await response.read()
                    raise aiohttp.ClientError(f"HTTP {response.status}")
                async for chunk in response.content.iter_any():
                    found = counter.feed(chunk)
                    if found:
                        last = time.time()
                        first = first or last
                        count += found
                        self.tokens += found
        except (aiohttp.ClientError, TimeoutError):
            self.errors += 1
            return False
        self.timings.append((request_id, sent, first, last, count))
        complete = self.expected is None or count == self.expected
        self.errors += not complete
        return complete

    async def user(self, index: int, start_delay: float = 0.0) -> None:
        """Closed loop: request after request until cancelled (started after ``start_delay``, as ramped)."""
        await asyncio.sleep(start_delay)
        for sequence in range(10**9):
            ok = await self.one(f"ref{index}-{sequence}")
            if sequence == 0 and ok:
                self.users_ready += 1
            if not ok and self.error_pause_s:
                await asyncio.sleep(self.error_pause_s)

    async def arrivals(self, rate: float, seed: int = 1) -> None:
        """Open loop: a request at each Poisson arrival, whatever is in flight, until cancelled."""
        loop = asyncio.get_running_loop()
        pending: set[asyncio.Task] = set()
        moment = loop.time()
        gaps = np.random.default_rng(seed).exponential(1 / rate, size=10**6)
        try:
            for index, gap in enumerate(gaps):
                moment += gap
                await asyncio.sleep(max(moment - loop.time(), 0.0))
                task = asyncio.create_task(self.one(f"refp-{index}"))
                pending.add(task)
                task.add_done_callback(pending.discard)
        finally:
            for task in list(pending):
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)


# ----- as a child process ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m batchscope.testkit.reference_client",
                                     description="Stream completions, announce a window on stdout, write timings.")
    parser.add_argument("--url", required=True, help="the server's base URL")
    parser.add_argument("--body", required=True, help="request body JSON file (its max_tokens: the expected count)")
    parser.add_argument("--streams", type=int, required=True, help="closed-loop users")
    parser.add_argument("--rate", type=float, default=0.0, help="Poisson arrivals per second (0: closed loop)")
    parser.add_argument("--warmup", type=float, required=True, help="seconds after ramp-up before the window")
    parser.add_argument("--duration", type=float, required=True, help="the window, seconds")
    parser.add_argument("--timings", required=True, help="where to write per-request timings (JSON)")
    parser.add_argument("--ramp-s", type=float, default=0.0, help="start the closed-loop users over this time")
    return parser.parse_args(argv)


def ready(client: ReferenceClient, args: argparse.Namespace) -> bool:
    # a whole first request per user (closed loop), any token (open loop): then the warm-up runs
    return client.tokens > 0 if args.rate else client.users_ready >= args.streams


def announce(client: ReferenceClient) -> None:
    """One line on stdout marking a window edge: the parent takes its own snapshot when it reads it."""
    mark = {"wall": time.time(), "tokens": client.tokens, "errors": client.errors, "cpu": time.process_time()}
    print(json.dumps(mark), flush=True)


async def run(args: argparse.Namespace) -> int:
    body = Path(args.body).read_bytes()
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        client = ReferenceClient(session, args.url + "/v1/completions", body,
                                 expected_tokens=json.loads(body)["max_tokens"])
        if args.rate:
            tasks = [asyncio.create_task(client.arrivals(args.rate))]
        else:
            tasks = [asyncio.create_task(client.user(i, i * args.ramp_s / args.streams)) for i in range(args.streams)]
        try:
            deadline = time.monotonic() + RAMP_TIMEOUT_S
            while not ready(client, args) and time.monotonic() < deadline:
                await asyncio.sleep(POLL_S)
            if not ready(client, args):
                print(f"not ramped up in {RAMP_TIMEOUT_S:.0f} s ({client.users_ready} users streaming, "
                      f"{client.errors} errors)", file=sys.stderr)
                return 1
            await asyncio.sleep(args.warmup)
            announce(client)
            await asyncio.sleep(args.duration)
            announce(client)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    Path(args.timings).write_text(json.dumps(client.timings))
    return 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
