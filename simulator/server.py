"""The simulator's OpenAI-compatible HTTP server: vLLM's routes, response shapes, errors, auth and /metrics.

Routes: POST /v1/completions, /v1/chat/completions (streaming and not), /tokenize, /detokenize; GET /v1/models,
/health, /version, /metrics, and /sim/stats (simulator-only: step lag and token counts); other paths get
FastAPI's JSON 404. Test hooks: injected 500s, streams cut half-way, stalls before the response, and a
ground-truth JSONL log of server timestamps.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import random
import socket
import time
import uuid
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.process_collector import ProcessCollector

from simulator import tokenizer
from simulator.config import Deployment
from simulator.metrics import VllmMetricsCollector
from simulator.protocol import ApiError, DetokenizeFields, GenerationFields, TokenizeFields, check_sampling, parse
from simulator.realtime import RealtimeEngine, RequestStream

VLLM_VERSION = "0.13.0"
# Always the classic text format: Prometheus 2.x would otherwise receive escaped `vllm_` names
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
log = logging.getLogger("simulator.server")
# compact separators, as vLLM's FastAPI responses
_dumps = functools.partial(json.dumps, separators=(",", ":"))


@dataclass
class GenerationRequest:
    """A validated completion or chat request."""

    chat: bool
    prompt_ids: list[int]
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool


class SseFormatter:
    """Pre-rendered pieces of one response's SSE events: token chunks cost a string join, not a JSON dump."""

    def __init__(self, chat: bool, request_id: str, created: int, model: str) -> None:
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._head = f'data: {{"id":"{request_id}","object":"{obj}","created":{created},"model":{json.dumps(model)},'
        if chat:
            self._open = self._head + '"choices":[{"index":0,"delta":{"content":"'
            self._close = '"},"logprobs":null,"finish_reason":%s}]}\n\n'
        else:
            self._open = self._head + '"choices":[{"index":0,"text":"'
            self._close = '","logprobs":null,"finish_reason":%s,"stop_reason":null}]}\n\n'
        self.role_chunk = (self._head + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                           '"logprobs":null,"finish_reason":null}]}\n\n') if chat else ""

    def token(self, text: str, finish_reason: str | None) -> str:
        # token texts are ' ' + lowercase ASCII letters (tokenizer.decode_one), so they need no JSON escaping
        return self._open + text + self._close % ("null" if finish_reason is None else f'"{finish_reason}"')

    def usage(self, prompt_tokens: int, completion_tokens: int) -> str:
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
                 "completion_tokens": completion_tokens}
        return self._head + f'"choices":[],"usage":{json.dumps(usage, separators=(",", ":"))}}}\n\n'


class SimulatorServer:
    """Binds a deployment (config + engine) to an aiohttp application."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self.config = deployment.config
        self.engine = deployment.new_engine()
        self.realtime = RealtimeEngine(self.engine)
        self.created = int(time.time())
        self._faults = random.Random(self.config.seed)
        self._request_seeds = itertools.count(self.config.seed * 1_000_003)
        self._stalled = 0  # requests held by --fault-stall-*, shown by /sim/stats
        truth_path = self.config.ground_truth_log
        # line-buffered and kept open for the server's life: closed in _on_cleanup
        self._ground_truth = open(truth_path, "a", buffering=1) if truth_path else None  # noqa: SIM115
        self.registry = CollectorRegistry()
        self.registry.register(VllmMetricsCollector(self.engine, self.config.name, self._cache_config()))
        ProcessCollector(registry=self.registry)
        self._http_requests = Counter("http_requests", "Total number of requests by method, status and handler.",
                                      ["method", "status", "handler"], registry=self.registry)

    def _cache_config(self) -> dict[str, str]:
        plan = self.deployment.kv_plan
        return {
            "block_size": str(self.config.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": "False",
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
        if self._ground_truth:
            self._ground_truth.close()

    @web.middleware
    async def _count_requests(self, request: web.Request, handler):
        response = await handler(request)
        route = request.match_info.route.resource
        path = route.canonical if route is not None else "none"
        self._http_requests.labels(request.method, f"{response.status // 100}xx", path).inc()
        return response

    @web.middleware
    async def _errors_and_auth(self, request: web.Request, handler):
        key = self.config.api_key
        expected = f"Bearer {key.get_secret_value()}" if key else None
        if expected and request.path.startswith("/v1") and request.headers.get("Authorization") != expected:
            return _json_response({"error": "Unauthorized"}, status=401)
        try:
            return await handler(request)
        except ApiError as exc:
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
        return _json_response({"version": VLLM_VERSION})

    async def metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def sim_stats(self, _request: web.Request) -> web.Response:
        rt = self.realtime
        return _json_response({
            "steps": rt.steps, "tokens": rt.tokens, "step_lag_seconds": rt.lag_summary(),
            "num_requests_running": self.engine.num_running, "num_requests_waiting": self.engine.num_waiting,
            "kv_cache_usage_perc": self.engine.kv_cache_usage, "num_requests_stalled": self._stalled,
        })

    async def models(self, _request: web.Request) -> web.Response:
        card = {
            "id": self.config.name, "object": "model", "created": self.created, "owned_by": "vllm",
            "root": self.config.model, "parent": None, "max_model_len": self.deployment.max_model_len,
            "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                            "created": self.created, "allow_create_engine": False, "allow_sampling": True,
                            "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                            "allow_fine_tuning": False, "organization": "*", "group": None, "is_blocking": False}],
        }
        return _json_response({"object": "list", "data": [card]})

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if "messages" in body:
            ids = tokenizer.encode_chat(_messages(body))
        else:
            ids = _prompt_ids(body.get("prompt"), add_bos=parse(TokenizeFields, body).add_special_tokens)
        return _json_response({"count": len(ids), "max_model_len": self.deployment.max_model_len,
                                  "tokens": ids, "token_strs": None})

    async def detokenize(self, request: web.Request) -> web.Response:
        tokens = parse(DetokenizeFields, await _json_body(request)).tokens
        _check_vocabulary(tokens, "tokens")
        return _json_response({"prompt": tokenizer.decode(tokens)})

    # ----- generation ----------------------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        arrival = time.time()
        body = await _json_body(request)
        fields = parse(GenerationFields, body)
        self._check_model(fields)
        prompt_ids = _prompt_ids(body.get("prompt"), add_bos=True)
        max_tokens = 16 if fields.max_tokens is None else fields.max_tokens
        return await self._generate(request, arrival, self._validated(fields, False, prompt_ids, max_tokens))

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        arrival = time.time()
        body = await _json_body(request)
        fields = parse(GenerationFields, body)
        self._check_model(fields)
        prompt_ids = tokenizer.encode_chat(_messages(body))
        max_tokens = next((n for n in (fields.max_completion_tokens, fields.max_tokens) if n is not None),
                          max(self.deployment.max_model_len - len(prompt_ids), 1))
        return await self._generate(request, arrival, self._validated(fields, True, prompt_ids, max_tokens))

    def _check_model(self, fields: GenerationFields) -> None:
        model = fields.model
        if model is not None and model not in (self.config.name, self.config.model):
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")

    def _validated(self, fields: GenerationFields, chat: bool, prompt_ids: list[int],
                   max_tokens: int) -> GenerationRequest:
        if not prompt_ids:
            raise ApiError(400, "The decoder prompt cannot be empty", param="prompt")
        limit, prompt_len = self.deployment.max_model_len, len(prompt_ids)
        if prompt_len + max_tokens > limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_len + max_tokens} tokens ({prompt_len} in the messages, {max_tokens} in the completion). "
                "Please reduce the length of the messages or completion.",
                param="messages" if chat else "prompt",
            )
        check_sampling(fields, max_tokens)
        return GenerationRequest(chat, prompt_ids, max_tokens, fields.min_tokens, fields.ignore_eos,
                                 bool(fields.stream), fields.include_usage)

    async def _generate(self, request: web.Request, arrival: float, gen: GenerationRequest) -> web.StreamResponse:
        config = self.config
        timing = _Timing(arrival, request.headers.get("X-Request-Id"))
        if self._faults.random() < config.fault_error_rate:
            timing.outcome = "injected_error"
            self._log_truth(gen, timing)
            raise ApiError(500, "Injected fault: internal server error.", "InternalServerError")
        cut = gen.stream and self._faults.random() < config.fault_cut_rate
        if self._faults.random() < config.fault_stall_rate:
            await self._stall(gen, timing)
        request_id = ("chatcmpl-" if gen.chat else "cmpl-") + uuid.uuid4().hex
        seed = next(self._request_seeds)
        stream = self.realtime.submit(len(gen.prompt_ids), gen.max_tokens, gen.ignore_eos, gen.min_tokens)
        try:
            if gen.stream:
                return await self._stream(request, gen, stream, request_id, seed, cut, timing)
            return await self._complete(gen, stream, request_id, seed, timing)
        finally:
            if not stream.finished:
                self.realtime.abort(stream)
                timing.outcome = "cut" if timing.outcome == "cut" else "aborted"
            self._log_truth(gen, timing, stream.produced, stream.finish_reason)

    async def _stall(self, gen: GenerationRequest, timing: _Timing) -> None:
        """Hold the request; a client that gives up meanwhile is an abort, logged and counted as vLLM counts it."""
        self._stalled += 1
        try:
            await asyncio.sleep(self.config.fault_stall_s)
        except asyncio.CancelledError:  # aiohttp cancels the handler when its client disconnects
            timing.outcome = "aborted"
            self.engine.stats.record_aborted(1)
            self._log_truth(gen, timing)
            raise
        finally:
            self._stalled -= 1

    async def _stream(self, request, gen, stream: RequestStream, request_id, seed, cut, timing) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        if request.version >= (1, 1):
            response.enable_chunked_encoding()
        await response.prepare(request)
        sink = _TokenSink(request.transport, response.chunked, SseFormatter(gen.chat, request_id, int(timing.arrival),
                          self.config.name), seed, timing, max(gen.max_tokens // 2, 1) if cut else None)
        stream.sink = sink.push
        if stream.produced:  # tokens that came before the sink was in place
            sink.push(stream.produced, stream.finish_reason)
        if not await sink.done:
            return response  # cut on purpose, or the client went away
        tail = sse_tail(sink.sse, len(gen.prompt_ids), stream.produced, gen.include_usage)
        await response.write(tail.encode())
        await response.write_eof()
        return response

    async def _complete(self, gen, stream: RequestStream, request_id, seed, timing) -> web.Response:
        while not stream.finished:
            await stream.wait()
        timing.token_written(time.time())
        count = stream.produced
        stopped = stream.finish_reason == "stop"
        text = "".join(tokenizer.output_text(seed, i, stopped and i == count) for i in range(1, count + 1))
        usage = {"prompt_tokens": len(gen.prompt_ids), "total_tokens": len(gen.prompt_ids) + count,
                 "completion_tokens": count, "prompt_tokens_details": None}
        common = {"id": request_id, "created": int(timing.arrival), "model": self.config.name}
        if gen.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                      "logprobs": None, "finish_reason": stream.finish_reason, "stop_reason": None}
            body = {**common, "object": "chat.completion", "choices": [choice], "usage": usage,
                    "prompt_logprobs": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": stream.finish_reason,
                      "stop_reason": None, "prompt_logprobs": None}
            body = {**common, "object": "text_completion", "choices": [choice], "usage": usage}
        return _json_response(body)

    def _log_truth(self, gen, timing: _Timing, output_tokens: int = 0, finish_reason: str | None = None) -> None:
        if self._ground_truth is None:
            return
        record = {
            "request_id": timing.request_id,
            "arrival_s": timing.arrival,
            "first_token_s": timing.first,
            "last_token_s": timing.last,
            "endpoint": "chat" if gen.chat else "completions",
            "stream": gen.stream,
            "prompt_tokens": len(gen.prompt_ids),
            "output_tokens": output_tokens,
            "finish_reason": finish_reason,
            "outcome": timing.outcome,
        }
        self._ground_truth.write(json.dumps(record) + "\n")


def sse_tail(sse: SseFormatter, prompt_tokens: int, completion_tokens: int, include_usage: bool) -> str:
    """What follows the last token: the usage chunk when asked for, then [DONE]."""
    return (sse.usage(prompt_tokens, completion_tokens) if include_usage else "") + "data: [DONE]\n\n"


class _TokenSink:
    """Writes a stream's token events to its socket from the engine loop, one write per step.

    Called synchronously with each step's result: formatting and writing here saves a task switch per token,
    which keeps the event loop free to take new requests promptly. ``done`` resolves True when the request
    finished, False when the stream was cut on purpose or the client is gone.
    """

    def __init__(self, transport, chunked: bool, sse: SseFormatter, seed: int, timing: _Timing,
                 cut_after: int | None) -> None:
        self.transport = transport
        self.chunked = chunked
        self.sse = sse
        self.seed = seed
        self.timing = timing
        self.cut_after = cut_after
        self.sent = 0
        self.done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def push(self, produced: int, reason: str | None) -> None:
        if self.done.done():
            return
        if self.transport is None or self.transport.is_closing():
            self.done.set_result(False)
            return
        pieces = [self.sse.role_chunk] if self.sent == 0 else []
        for index in range(self.sent + 1, produced + 1):
            last = index == produced
            text = tokenizer.output_text(self.seed, index, last and reason == "stop")
            pieces.append(self.sse.token(text, reason if last else None))
        data = "".join(pieces).encode()
        self.transport.write(b"%x\r\n%s\r\n" % (len(data), data) if self.chunked else data)
        self.timing.token_written(time.time())
        self.sent = produced
        if reason is not None:
            self.done.set_result(True)
        elif self.cut_after is not None and self.sent >= self.cut_after:
            self.timing.outcome = "cut"
            self.transport.close()  # abrupt: no terminating chunk, no [DONE]
            self.done.set_result(False)


class _Timing:
    """Wall-clock truth of one request as the server wrote it."""

    __slots__ = ("arrival", "request_id", "first", "last", "outcome")

    def __init__(self, arrival: float, request_id: str | None) -> None:
        self.arrival = arrival
        self.request_id = request_id  # the client's X-Request-Id, to match records
        self.first: float | None = None
        self.last: float | None = None
        self.outcome = "ok"

    def token_written(self, now: float) -> None:
        if self.first is None:
            self.first = now
        self.last = now


def _json_response(body: object, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=_dumps)


async def _json_body(request: web.Request) -> dict:
    try:
        body = await request.json()
    except ValueError:
        raise ApiError(400, "Request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise ApiError(400, "Request body must be a JSON object.")
    return body


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise ApiError(400, "messages must be a non-empty list of message objects.", param="messages")
    return messages


def _prompt_ids(prompt: object, add_bos: bool) -> list[int]:
    """A single prompt as token ids: text, a list of ids, or a one-element list of either."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt, add_bos=add_bos)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        _check_vocabulary(prompt, "prompt")
        return list(prompt)
    raise ApiError(400, "prompt must be a string or a list of token ids (one prompt per request).", param="prompt")


def _check_vocabulary(ids: list[int], param: str) -> None:
    if any(not 0 <= t < tokenizer.VOCAB_SIZE for t in ids):
        raise ApiError(400, f"Token id out of vocabulary (0 <= id < {tokenizer.VOCAB_SIZE}).", param=param)


async def serve(deployment: Deployment, sock: socket.socket, stop: asyncio.Event | None = None) -> None:
    """Run the server on the bound ``sock`` until ``stop`` is set (or forever); logs vLLM's start-up lines."""
    server = SimulatorServer(deployment)
    # handler_cancellation: a client that disconnects cancels its handler, which aborts its request
    runner = web.AppRunner(server.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.SockSite(runner, sock, backlog=4096)
    await site.start()
    host, port = runner.addresses[0][:2]
    log.info("Starting vLLM API server 0 on http://%s:%d", host, port)
    log.info("Application startup complete.")
    try:
        await (stop.wait() if stop else asyncio.Event().wait())
    finally:
        await runner.cleanup()
