"""A hostile vLLM-shaped server for fault-injection tests and benches: each mode breaks one rule a peer may break.

    with HostileServer("chunk-negative") as server:      # a thread of the caller's process, on 127.0.0.1
        run `batchscope load --host {server.url}` or `batchscope exporter --vllm-url {server.url}`

What each path answers, and what the modes send: docs/testkit.md, "The hostile server".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections import Counter
from collections.abc import Awaitable, Callable

from batchscope.vllm import admission, catalogue

HEAD_LIMIT = 65536  # a request's head, bytes
BODY_LIMIT = 1 << 20  # a request's body, bytes
ENDLESS_S = 120.0  # an endless body stops after this long even if the peer keeps reading
FILL = b"a" * (1 << 20)  # what endless bodies are made of, 1 MiB a write
MODEL = "hostile-model"
RUNNING = catalogue.NUM_REQUESTS_RUNNING
METRICS = (f'# HELP {RUNNING.name} {RUNNING.help}\n# TYPE {RUNNING.name} gauge\n'
           f'{RUNNING.name}{{engine="0",model_name="{MODEL}"}} 0.0\n').encode()

STREAM_MODES = ("ok", "chunk-negative", "chunk-nonhex", "chunk-huge", "error-body-endless", "event-endless",
                "event-not-object", "choices-not-list", "usage-not-object", "events-after-done", "too-many-events",
                "too-few-events", "retry-after-429", "storm-503", "admission-503", "admission-event",
                "stall", "redirect-models")
METRICS_MODES = ("metrics-huge", "metrics-endless", "metrics-hang", "metrics-drip", "metrics-no-charset")
MODELS_MODES = ("models-huge",)  # /v1/models: a valid model card of HUGE_CARD_BYTES (an exporter's cap is 1 MiB)
MODES = STREAM_MODES + METRICS_MODES + MODELS_MODES
HUGE_CARD_BYTES = 2 << 20
Writer = asyncio.StreamWriter


def head(status: str, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status}", *(f"{name}: {value}" for name, value in headers.items()), "", ""]
    return "\r\n".join(lines).encode()


def json_reply(status: str, payload: object, extra: dict[str, str] | None = None) -> bytes:
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body)), **(extra or {})}
    return head(status, headers) + body


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def event(payload: object) -> bytes:
    return chunk(b"data: " + (payload if isinstance(payload, bytes) else json.dumps(payload).encode()) + b"\n\n")


def token(text: str = "x") -> dict:
    return {"id": "cmpl-h", "object": "text_completion", "model": MODEL,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": None}]}


def usage(prompt: int, completion: int) -> dict:
    return {"id": "cmpl-h", "object": "text_completion", "model": MODEL, "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion}}


STREAM_HEAD = head("200 OK", {"Content-Type": "text/event-stream", "Transfer-Encoding": "chunked"})
DONE = event(b"[DONE]") + b"0\r\n\r\n"


class HostileServer:
    """The server, on a thread of its own with its own event loop."""

    def __init__(self, mode: str, host: str = "127.0.0.1", port: int = 0, redirect_to: str = "") -> None:
        if mode not in MODES:
            raise ValueError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
        self.mode, self.host, self.port, self.redirect_to = mode, host, port, redirect_to
        self.seen: Counter[str] = Counter()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"hostile-{mode}", daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> HostileServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the hostile server did not start in 10 s")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, self.host, self.port))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._server.close()
        for task in asyncio.all_tasks(self._loop):
            task.cancel()
        with contextlib.suppress(Exception):
            self._loop.run_until_complete(asyncio.sleep(0))

    async def _serve(self, reader: asyncio.StreamReader, writer: Writer) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                                 asyncio.CancelledError, ValueError):
            while True:
                request_head = await reader.readuntil(b"\r\n\r\n")
                if len(request_head) > HEAD_LIMIT:
                    return
                method, path, headers = parse_head(request_head)
                length = min(int(headers.get("content-length", "0")), BODY_LIMIT)
                body = json.loads(await reader.readexactly(length)) if length else {}
                self.seen[path] += 1
                if not await self._answer(method, path, body, writer):
                    return
        with contextlib.suppress(Exception):
            writer.close()

    async def _answer(self, method: str, path: str, body: dict, writer: Writer) -> bool:
        """Answer one request; False when the connection is to be closed."""
        if path == "/metrics":
            return await self._metrics(writer)
        if path == "/v1/models":
            if self.mode == "redirect-models":
                writer.write(head("302 Found", {"Location": self.redirect_to + "/v1/models", "Content-Length": "0"}))
                return True
            root = "x" * HUGE_CARD_BYTES if self.mode == "models-huge" else MODEL
            writer.write(json_reply("200 OK", {"object": "list", "data": [
                {"id": MODEL, "object": "model", "root": root, "max_model_len": 4096}]}))
        elif path in ("/v1/completions", "/v1/chat/completions") and method == "POST" and body.get("stream"):
            return await STREAMS.get(self.mode, STREAMS["ok"])(writer, body)  # a /metrics mode streams well
        elif path in ("/v1/completions", "/v1/chat/completions"):
            prompt = len(body.get("prompt") or [])
            writer.write(json_reply("200 OK", {**token(), "usage": usage(prompt, 1)["usage"]}))
        elif path == "/version":
            writer.write(json_reply("200 OK", {"version": "0.32.0"}))
        else:
            writer.write(head("200 OK", {"Content-Length": "0"}))
        await writer.drain()
        return True

    async def _metrics(self, writer: Writer) -> bool:
        mode = self.mode
        if mode == "metrics-hang":
            await asyncio.sleep(ENDLESS_S)
            return False
        if mode == "metrics-huge":
            writer.write(head("200 OK", {"Content-Type": "text/plain", "Content-Length": str(200 << 20)}))
            return await endless(writer, limit_bytes=200 << 20)
        if mode == "metrics-endless":
            writer.write(head("200 OK", {"Content-Type": "text/plain", "Transfer-Encoding": "chunked"}))
            return await endless(writer, chunked=True)
        if mode == "metrics-drip":
            writer.write(head("200 OK", {"Content-Type": "text/plain", "Content-Length": str(len(METRICS))}))
            for byte in METRICS:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.1)
            return True
        text = METRICS.replace(f'model_name="{MODEL}"'.encode(), 'model_name="modèle"'.encode())
        content_type = "text/plain" if mode == "metrics-no-charset" else "text/plain; version=0.0.4; charset=utf-8"
        body = text if mode == "metrics-no-charset" else METRICS
        writer.write(head("200 OK", {"Content-Type": content_type, "Content-Length": str(len(body))}) + body)
        await writer.drain()
        return True


def parse_head(raw: bytes) -> tuple[str, str, dict[str, str]]:
    lines = raw.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    return method, path, headers


async def endless(writer: Writer, chunked: bool = False, limit_bytes: int | None = None) -> bool:
    """Write filler as fast as the peer takes it, until it hangs up, ``limit_bytes`` or ENDLESS_S."""
    loop = asyncio.get_running_loop()
    deadline, sent = loop.time() + ENDLESS_S, 0
    piece = chunk(FILL) if chunked else FILL
    while loop.time() < deadline and (limit_bytes is None or sent < limit_bytes):
        data = piece if limit_bytes is None else piece[:limit_bytes - sent]
        writer.write(data)
        sent += len(data)
        await writer.drain()
    return False


def tokens_of(body: dict) -> int:
    return int(body.get("max_tokens") or body.get("max_completion_tokens") or 1)


async def stream(writer: Writer, body: dict, events: int, extra: bytes = b"", counted: int | None = None) -> bool:
    """A well-formed stream of ``events`` token events, usage saying ``counted`` (default: the asked tokens)."""
    prompt = len(body.get("prompt") or [])
    writer.write(STREAM_HEAD + b"".join(event(token()) for _ in range(events)))
    writer.write(event(usage(prompt, tokens_of(body) if counted is None else counted)) + extra + DONE)
    await writer.drain()
    return True


async def _write(writer: Writer, data: bytes, keep_open: bool = False) -> bool:
    writer.write(data)
    await writer.drain()
    return keep_open


async def _stall(writer: Writer, body: dict) -> bool:
    await asyncio.sleep(ENDLESS_S)
    return False


async def _error_body_endless(writer: Writer, body: dict) -> bool:
    writer.write(head("503 Service Unavailable", {"Content-Type": "text/plain", "Transfer-Encoding": "chunked"}))
    return await endless(writer, chunked=True)


async def _event_endless(writer: Writer, body: dict) -> bool:
    writer.write(STREAM_HEAD + chunk(b"data: "))
    return await endless(writer, chunked=True)


async def _events_after_done(writer: Writer, body: dict) -> bool:
    prompt = len(body.get("prompt") or [])
    events = b"".join(event(token()) for _ in range(tokens_of(body)))
    late = b"".join(event(token()) for _ in range(3))
    return await _write(writer, STREAM_HEAD + events + event(usage(prompt, tokens_of(body))) + event(b"[DONE]")
                        + late + b"0\r\n\r\n", keep_open=True)


Stream = Callable[[Writer, dict], Awaitable[bool]]
STREAMS: dict[str, Stream] = {
    "ok": lambda w, b: stream(w, b, tokens_of(b)),
    "redirect-models": lambda w, b: stream(w, b, tokens_of(b)),
    "chunk-negative": lambda w, b: _write(w, STREAM_HEAD + b"-6\r\n" + b"data: {}\n\n\r\n"),
    "chunk-nonhex": lambda w, b: _write(w, STREAM_HEAD + b"zz\r\n" + b"data: {}\n\n\r\n"),
    "chunk-huge": lambda w, b: _write(w, STREAM_HEAD + b"e8d4a51000\r\n" + FILL[:4096]),
    "error-body-endless": _error_body_endless,
    "event-endless": _event_endless,
    "event-not-object": lambda w, b: _write(w, STREAM_HEAD + event(b"[1,2]") + DONE, keep_open=True),
    "choices-not-list": lambda w, b: _write(w, STREAM_HEAD + event({"choices": {"a": 1}}) + DONE, keep_open=True),
    "usage-not-object": lambda w, b: _write(w, STREAM_HEAD + event(token()) + event({"choices": [], "usage": [1]})
                                            + DONE, keep_open=True),
    "events-after-done": _events_after_done,
    "too-many-events": lambda w, b: stream(w, b, 3 * tokens_of(b)),
    "too-few-events": lambda w, b: stream(w, b, 2),
    "retry-after-429": lambda w, b: _write(w, json_reply("429 Too Many Requests", {"error": {
        "message": "slow down", "type": "RateLimitError", "code": 429}}, {"Retry-After": "2"}), keep_open=True),
    "storm-503": lambda w, b: _write(w, json_reply("503 Service Unavailable", {"error": {
        "message": "overloaded", "type": "ServiceUnavailable", "code": 503}}), keep_open=True),
    "admission-503": lambda w, b: _write(w, json_reply("503 Service Unavailable", admission.error_body(
        "max_num_queued_reqs")), keep_open=True),  # vLLM's admission check refusing every request
    # ... and refusing it once the stream began (its second check, as it adds the request to the engine)
    "admission-event": lambda w, b: _write(w, STREAM_HEAD + event(admission.error_body("max_num_queued_reqs"))
                                           + DONE, keep_open=True),
    "stall": _stall,
}
