"""The simulator's OpenAI-compatible HTTP server: vLLM's routes, auth, errors, /metrics and the raw stream writes.

Routes: POST /v1/completions, /v1/chat/completions (streaming and not), /tokenize, /detokenize; GET /v1/models,
/health, /version, /metrics, and /sim/stats (simulator-only: step lag and token counts); other paths get
FastAPI's JSON 404. Request parsing lives in ``protocol``, response shapes in ``responses``, the test hooks in
``faults`` (injected 500s, cut streams, stalls) and ``truth`` (the ground-truth log); this module wires them to
aiohttp and the real-time engine.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import socket
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.process_collector import ProcessCollector

from batchscope.simulator import protocol, responses
from batchscope.simulator.arrivals import ArrivalStamps
from batchscope.simulator.config import Deployment
from batchscope.simulator.faults import EngineStall, FaultInjector, burn_cpu
from batchscope.simulator.metrics import VllmMetricsCollector
from batchscope.simulator.prefix_cache import block_hashes
from batchscope.simulator.protocol import ApiError, GenerationRequest
from batchscope.simulator.realtime import TIMER_SLACK_S, RealtimeEngine, Refused, RequestStream
from batchscope.simulator.responses import SseFormatter, sse_tail
from batchscope.simulator.truth import GroundTruthLog, RequestTiming
from batchscope.vllm import admission
from batchscope.vllm.catalogue import EXPOSITION_CONTENT_TYPE

log = logging.getLogger("batchscope.simulator.server")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
GC_INTERVAL_S = 60.0


class SimulatorServer:
    """Binds a deployment (config + engine) to an aiohttp application."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self.config = deployment.config
        self.engine = deployment.new_engine()
        self.realtime = RealtimeEngine(self.engine, EngineStall.of(self.config))
        self.created = int(time.time())
        self.served = protocol.ServedModel((self.config.name, self.config.model), deployment.max_model_len,
                                           deployment.vocab_size)
        self._faults = FaultInjector(self.config)
        self._request_seeds = itertools.count(self.config.seed * 1_000_003)
        self._ground_truth = GroundTruthLog(self.config.ground_truth_log)
        self.arrivals = ArrivalStamps()
        self.registry = CollectorRegistry()
        self.registry.register(VllmMetricsCollector(self.engine, self.config.name, self._cache_config()))
        ProcessCollector(registry=self.registry)
        self._http_requests = Counter("http_requests", "Total number of requests by method, status and handler.",
                                      ["method", "status", "handler"], registry=self.registry)

    def _cache_config(self) -> dict[str, str]:
        plan = self.deployment.kv_plan
        return {
            "block_size": str(self.deployment.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": str(self.config.enable_prefix_caching),
            "gpu_memory_utilization": str(self.config.gpu_memory_utilization),
            "num_gpu_blocks": str(plan.num_gpu_blocks),
            "num_cpu_blocks": "0",
            "kv_cache_size_tokens": str(plan.kv_cache_tokens),
            "kv_cache_max_concurrency": f"{plan.max_concurrency:.2f}",
        }

    # ----- application ---------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._count_requests, self._errors_and_auth], client_max_size=64 * 2**20)
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/sim/stats", self.sim_stats)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        self.realtime.start()

    async def _on_cleanup(self, _app: web.Application) -> None:
        await self.realtime.stop()
        self._ground_truth.close()

    @web.middleware
    async def _count_requests(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        finally:  # the connection's next bytes are the next request's
            self.arrivals.forget(request.transport)
        route = request.match_info.route.resource
        path = route.canonical if route is not None else "none"
        self._http_requests.labels(request.method, f"{response.status // 100}xx", path).inc()
        return response

    @web.middleware
    async def _errors_and_auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        key = self.config.api_key
        expected = f"Bearer {key.get_secret_value()}" if key else None
        if expected and request.path.startswith("/v1") and request.headers.get("Authorization") != expected:
            return _json_response({"error": "Unauthorized"}, status=401)
        try:
            return await handler(request)
        except ApiError as exc:
            if exc.in_stream:
                return await _error_stream(request, exc)
            return _json_response(exc.body(), status=exc.status)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            # FastAPI's body for routing errors (unknown path, wrong method, body too large)
            return _json_response({"detail": exc.reason}, status=exc.status)

    # ----- simple routes -------------------------------------------------------------------------------

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, _request: web.Request) -> web.Response:
        return _json_response({"version": responses.VLLM_VERSION})

    async def metrics(self, _request: web.Request) -> web.Response:
        # the classic text labelled as vLLM 0.32 labels it, whatever the Accept header (real-parts.md §1)
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": EXPOSITION_CONTENT_TYPE})

    async def sim_stats(self, _request: web.Request) -> web.Response:
        rt = self.realtime
        return _json_response({
            "steps": rt.steps, "tokens": rt.tokens, "step_lag_seconds": rt.lag_summary(),
            "num_requests_running": self.engine.num_running, "num_requests_waiting": self.engine.num_waiting,
            "kv_cache_usage_perc": self.engine.kv_cache_usage, "num_requests_stalled": self._faults.stalled,
            # vLLM 0.32 counts a client disconnect in no series; the simulator's own count
            "num_requests_aborted": self.engine.stats.requests_aborted,
        })

    async def models(self, _request: web.Request) -> web.Response:
        return _json_response(responses.models_body(self.config.name, self.config.model, self.created,
                                                    self.deployment.max_model_len))

    async def tokenize(self, request: web.Request) -> web.Response:
        ids = protocol.tokenize_ids(await _json_body(request))
        return _json_response(responses.tokenize_body(ids, self.deployment.max_model_len))

    async def detokenize(self, request: web.Request) -> web.Response:
        return _json_response(responses.detokenize_body(protocol.detokenize_ids(await _json_body(request))))

    # ----- generation ----------------------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        received = self.arrivals.received(request.transport)
        timing = RequestTiming(received or time.time(), request.headers.get("X-Request-Id"))
        arrival = asyncio.get_running_loop().time()
        gen = protocol.generation_request(await _json_body(request), chat, self.served, self._preflight)
        faults = self._faults.draw(gen.stream, gen.max_tokens)
        if faults.error:
            timing.outcome = "injected_error"
            self._ground_truth.write(gen, timing)
            raise ApiError(500, "Injected fault: internal server error.", "InternalServerError")
        if faults.stall:
            await self._hold(gen, timing, self._faults.stall())
        caching = self.engine.prefix_cache is not None
        hashes = block_hashes(gen.prompt_ids, self.deployment.block_size) if caching else None
        # the profile's input path (parsing, tokenization, the hop to the engine core), counted from arrival
        await self._hold(gen, timing, _until(arrival + self.engine.frontend.input_s(len(gen.prompt_ids))))
        request_id = responses.request_id(gen.chat)
        seed = next(self._request_seeds)
        try:
            stream = self.realtime.submit(len(gen.prompt_ids), gen.max_tokens, gen.ignore_eos, gen.min_tokens,
                                          hashes)
        except Refused as refused:  # passed the pre-flight check: a stream's 200 has gone out in vLLM
            timing.outcome = "rejected"
            self._ground_truth.write(gen, timing)
            raise _refusal(refused.reason, in_stream=gen.stream) from None
        try:
            if gen.stream:
                return await self._stream(request, gen, stream, request_id, seed, faults.cut_after, timing)
            return await self._complete(gen, stream, request_id, seed, timing)
        finally:
            if not stream.finished:
                self.realtime.abort(stream)
                timing.outcome = "cut" if timing.outcome == "cut" else "aborted"
            self._ground_truth.write(gen, timing, stream.produced, stream.finish_reason)

    def _preflight(self, n: int) -> None:
        """vLLM's admission check before a response starts: refused, a plain HTTP 503 (counted, not logged in the
        ground truth: the request was never parsed whole)."""
        reason = self.engine.admission.check(n)
        if reason is not None:
            raise _refusal(reason)

    async def _hold(self, gen: GenerationRequest, timing: RequestTiming, wait: Awaitable[None]) -> None:
        """Hold the request; a client that gives up meanwhile is an abort, logged and counted as vLLM counts it."""
        try:
            await wait
        except asyncio.CancelledError:  # aiohttp cancels the handler when its client disconnects
            timing.outcome = "aborted"
            self.engine.stats.record_aborted(1)
            self._ground_truth.write(gen, timing)
            raise

    async def _stream(self, request: web.Request, gen: GenerationRequest, stream: RequestStream, request_id: str,
                      seed: int, cut_after: int | None, timing: RequestTiming) -> web.StreamResponse:
        response = await _event_stream(request)
        sse = SseFormatter(gen.chat, request_id, int(timing.arrival), self.config.name)
        sink = _TokenSink(request.transport, response.chunked, sse, seed, timing, cut_after,
                          self.config.fault_stream_event_cpu_s)
        stream.sink = sink.push
        if stream.produced:  # tokens that came before the sink was in place
            sink.push(stream.produced, stream.finish_reason)
        if not await sink.done:
            return response  # cut on purpose, or the client went away
        tail = sse_tail(sink.sse, len(gen.prompt_ids), stream.produced, gen.include_usage)
        await response.write(tail.encode())
        await response.write_eof()
        return response

    async def _complete(self, gen: GenerationRequest, stream: RequestStream, request_id: str, seed: int,
                        timing: RequestTiming) -> web.Response:
        while not stream.finished:
            await stream.wait()
        timing.token_written(time.time())
        return _json_response(responses.completion_body(gen, request_id, int(timing.arrival), self.config.name, seed,
                                                        stream.produced, stream.finish_reason))


class _TokenSink:
    """Writes a stream's token events to its socket from the engine loop, one write per step.

    Called synchronously with each step's result: formatting and writing here saves a task switch per token,
    which keeps the event loop free to take new requests promptly. ``done`` resolves True when the request
    finished, False when the stream was cut on purpose or the client is gone. ``event_cpu_s`` is the CPU each
    event costs on top (--fault-stream-event-cpu-s), spent on the event loop as vLLM's output processing is.
    """

    def __init__(self, transport: asyncio.Transport | None, chunked: bool, sse: SseFormatter, seed: int,
                 timing: RequestTiming, cut_after: int | None, event_cpu_s: float) -> None:
        self.transport = transport
        self.chunked = chunked
        self.sse = sse
        self.seed = seed
        self.timing = timing
        self.cut_after = cut_after
        self.event_cpu_s = event_cpu_s
        self.sent = 0
        self.done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def push(self, produced: int, reason: str | None) -> None:
        if self.done.done():
            return
        if self.transport is None or self.transport.is_closing():
            self.done.set_result(False)
            return
        if self.event_cpu_s:
            burn_cpu(self.event_cpu_s)
        data = self.sse.tokens(self.seed, self.sent, produced, reason).encode()
        self.transport.write(b"%x\r\n%s\r\n" % (len(data), data) if self.chunked else data)
        self.timing.token_written(time.time())
        self.sent = produced
        if reason is not None:
            self.done.set_result(True)
        elif self.cut_after is not None and self.sent >= self.cut_after:
            self.timing.outcome = "cut"
            self.transport.close()  # abrupt: no terminating chunk, no [DONE]
            self.done.set_result(False)


async def _event_stream(request: web.Request) -> web.StreamResponse:
    """A 200 SSE response, its head sent."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    if request.version >= (1, 1):
        response.enable_chunked_encoding()
    await response.prepare(request)
    return response


async def _error_stream(request: web.Request, error: ApiError) -> web.StreamResponse:
    """vLLM's answer to an error its engine raises once a stream has begun: HTTP 200, the error event, [DONE]."""
    response = await _event_stream(request)
    await response.write(responses.sse_error(error.body()).encode())
    await response.write_eof()
    return response


async def _until(deadline: float) -> None:
    loop = asyncio.get_running_loop()
    if deadline - TIMER_SLACK_S > loop.time():
        await asyncio.sleep(deadline - TIMER_SLACK_S - loop.time())


def _refusal(reason: str, in_stream: bool = False) -> ApiError:
    """vLLM's QueueOverflowError or MaxQueuedTokensError: its 503 body (batchscope.vllm.admission)."""
    error = admission.error_body(reason)["error"]
    return ApiError(error["code"], error["message"], error["type"], in_stream=in_stream)


def _json_response(body: object, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=responses.dumps)


async def _json_body(request: web.Request) -> dict:
    try:
        body = await request.json()
    except ValueError:
        raise ApiError(400, "Request body is not valid JSON.") from None
    return protocol.require_object(body)


async def serve(deployment: Deployment, sock: socket.socket, stop: asyncio.Event | None = None) -> None:
    """Run the server on the bound ``sock`` until ``stop`` is set (or forever); logs vLLM's start-up lines."""
    server = SimulatorServer(deployment)
    # handler_cancellation: a client that disconnects cancels its handler, which aborts its request
    runner = web.AppRunner(server.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    assert runner.server is not None, "set up just above"
    # not a SockSite: the connections' protocol is aiohttp's wrapped in the ground truth's arrival stamps
    server.arrivals.stamp_listener(sock)
    listener = await asyncio.get_running_loop().create_server(
        server.arrivals.protocol_factory(runner.server), sock=sock, backlog=4096)
    host, port = sock.getsockname()[:2]
    collector = _collect_garbage_on_schedule()
    log.info("Starting vLLM API server 0 on http://%s:%d", host, port)
    log.info("Application startup complete.")
    try:
        await (stop.wait() if stop else asyncio.Event().wait())
    finally:
        collector.cancel()
        gc.enable()
        listener.close()
        await runner.cleanup()


def _collect_garbage_on_schedule() -> asyncio.Task:
    """Python's cycle collector, run every GC_INTERVAL_S instead of whenever allocations pass its thresholds.

    Left to itself it ran a few times a second at hundreds of streams, each pause (up to ~10 ms) delaying every
    stream's next token and the requests arriving meanwhile: latency of the simulator's own, not of the server
    it models. The requests' own objects die by reference counting: a full collection after 10 s at 110
    requests/s found 9 objects to free (and took ~15 ms), so once a minute bounds the garbage and touches a tenth
    of a percent of arrivals. Start-up's objects live as long as the server: frozen out of the collector's sight,
    they cost no collection anything.
    """
    gc.freeze()
    gc.disable()

    async def collect() -> None:
        while True:
            await asyncio.sleep(GC_INTERVAL_S)
            gc.collect()

    return asyncio.get_running_loop().create_task(collect(), name="garbage-collector")
