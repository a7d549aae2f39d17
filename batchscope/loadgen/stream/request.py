"""One measured request: exact client-side TTFT, ITL gaps, TPOT and E2E, and exactly one outcome.

Figures are `vllm bench serve`'s, each token chunk timed by the kernel's receive stamp of its read (http.py);
TPOT divides by usage.completion_tokens, never by the events. A stream is held to vLLM's format and everything a
peer can fill is bounded: a breach ends the request as ``protocol_error``, the bound named. Definitions, token
chunks and outcomes: docs/loadgen.md, "One request" and "Outcomes of a stream". No Locust import here, so it
is testable on its own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from batchscope.loadgen.stream import framing, http
from batchscope.loadgen.stream.http import Connection, Follow
from batchscope.loadgen.stream.target import Target
from batchscope.vllm import admission

# 2: read_lag_s (a mean over the stream's reads) replaced first_read_lag_s; 3: retry_after_s; 4: rejected_busy,
# reject_reason
RECORD_SCHEMA_VERSION = 4
OUTCOMES = ("ok", "http_error", "timeout", "connection_error", "truncated", "protocol_error", "length_mismatch",
            "rejected_busy", "aborted")
RETRYABLE_4XX = (408, 429)  # request timeout, too many requests: the same request may pass later
THROTTLING = (429, 503)  # too many requests, unavailable: the server asks to come back later (Retry-After)
MAX_EVENT_BYTES = 1 << 20  # one SSE event, 1 MiB: vLLM's token events are hundreds of bytes, a few KB with logprobs
MAX_BODY_BYTES = 16 << 20  # a non-streamed reply, 16 MiB: the JSON of one completion, millions of tokens of text
MAX_ERROR_BODY_BYTES = 64 << 10  # an error answer's body, 64 KiB: vLLM's error object is a few hundred bytes


def rejected(record: RequestRecord) -> bool:
    """The server refused the request itself (a 4xx other than 408/429): as every request of a run is the same,
    sending it again gets the same answer until someone changes the key, the model or the server."""
    return (record.outcome == "http_error" and record.status is not None and 400 <= record.status < 500
            and record.status not in RETRYABLE_4XX)


def throttled(record: RequestRecord) -> bool:
    """The server turned the request away for now (429, 503): it may pass later, after its Retry-After."""
    return record.outcome == "http_error" and record.status in THROTTLING


def refused_by_server(record: RequestRecord) -> bool:
    """Rejected or throttled: the answers the sender backs off from, and a run refused from its start ends on."""
    return rejected(record) or throttled(record)


@dataclass
class RequestRecord:
    """One finished request (a line of records.jsonl). Times are Unix seconds; durations are seconds."""

    request_id: str
    worker: int
    scheduled_s: float
    sent_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    end_s: float | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    itl_s: Sequence[float] = field(default_factory=list)  # a list while measuring, array('d') once stored
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    outcome: str = "aborted"
    status: int | None = None  # the HTTP status, or the code of an error event in a 200 stream
    error: str | None = None
    read_lag_s: float | None = None  # a read minus the kernel's receive time of its data, mean over the body's reads
    retry_after_s: float | None = None  # the wait an error answer's Retry-After asked for (uncapped), seconds
    reject_reason: str | None = None  # rejected_busy: the queue limit vLLM's admission check named (admission.py)
    schema_version: int = RECORD_SCHEMA_VERSION

    @property
    def dispatch_lag_s(self) -> float | None:
        return None if self.sent_s is None else self.sent_s - self.scheduled_s

    def to_dict(self) -> dict:
        # shallow on purpose (asdict's deep copy is slow); gaps as a list, whatever they are held in
        return {**self.__dict__, "itl_s": list(self.itl_s)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))


class TokenStream:
    """Per-request SSE bookkeeping: events cut out of the body as it arrives, token chunk times, usage, [DONE]."""

    def __init__(self, chat: bool, record: RequestRecord | None = None) -> None:
        self.chat = chat
        self.record = record  # its first_token_s is set as the first token arrives: the live prefill backlog
        self._key = b'"content":"' if chat else b'"text":"'
        self._partial: list[bytes] = []  # the start of an event whose blank line has not arrived yet, in parts
        self._partial_bytes = 0
        self.first: float | None = None
        self.last = 0.0  # read only once ``first`` is set
        self.gaps: list[float] = []
        self.usage: dict | None = None
        self.done = False
        self.error: str | None = None
        self.error_code: int | None = None  # an error event's code (vLLM's: the HTTP status it stands for)
        self.error_body: str | None = None  # the error event as an error answer's body: {"error": {...}}

    def feed(self, chunk: bytes, now: float) -> None:
        """Body bytes that arrived at ``now``: every event they complete is read (an event may span reads,
        and one read may complete several). ProtocolError when what is there breaks vLLM's format (see the
        module's docstring), or an event's start waits for its blank line with over MAX_EVENT_BYTES."""
        if (not self._partial and not self.done and chunk.startswith(b"data:") and chunk.endswith(b"\n\n")
                and chunk.count(b"\n") == 2 and self._plain_token(chunk)):
            self._token(now)  # the usual case, one whole token event in the chunk: no splitting, no parsing
            return
        if self._partial:  # gathered in parts, joined once its end is there: linear however it is cut up
            ends = b"\n\n" in chunk or (chunk.startswith(b"\n") and self._partial[-1].endswith(b"\n"))
            self._partial.append(chunk)
            self._partial_bytes += len(chunk)
            if not ends:
                self._check_partial()
                return
            chunk = b"".join(self._partial)
            self._partial, self._partial_bytes = [], 0
        *events, rest = chunk.split(b"\n\n")
        for event in events:
            self.feed_event(event, now)
        if rest:
            self._partial, self._partial_bytes = [rest], len(rest)
            self._check_partial()

    def _check_partial(self) -> None:
        if self._partial_bytes > MAX_EVENT_BYTES:
            raise framing.ProtocolError(f"stream event: over {MAX_EVENT_BYTES >> 20} MiB without its blank line "
                                     "(MAX_EVENT_BYTES)")

    def feed_event(self, event: bytes, now: float) -> None:
        if len(event) > MAX_EVENT_BYTES:
            raise framing.ProtocolError(f"stream event: {len(event)} bytes, over {MAX_EVENT_BYTES >> 20} MiB "
                                     "(MAX_EVENT_BYTES)")
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            if self.done:
                raise framing.ProtocolError("stream: an event after data: [DONE], which ends a vLLM stream")
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
            elif self._plain_token(payload):
                self._token(now)
            else:
                self._parsed(parse_json(payload, "stream event"), now)

    def _plain_token(self, data: bytes) -> bool:
        """A compact token chunk (vLLM's own JSON), told apart without parsing it (``data``: one event, whole or
        its JSON alone): its choices a list opening with an object, and its choice's text key there, whatever the
        text.

        json.loads per token is a tenth of the client's CPU at high rates; anything unusual (usage, errors, JSON
        with spaces after colons, where the keys are not found, chat's role chunk) takes the parsing path instead.
        """
        if b'"usage"' in data or b'"error"' in data or (self.chat and b'"role"' in data):
            return False
        return self._key in data and b'"choices":[{' in data

    def _parsed(self, data: object, now: float) -> None:
        if not isinstance(data, dict):
            raise framing.ProtocolError(f"stream event: a JSON {json_type(data)} where vLLM sends an object")
        if "error" in data:
            self._note_error(data["error"])
        if data.get("usage") is not None:
            self.usage = checked_usage(data["usage"])
        choices = data.get("choices")
        if choices is None:
            return
        if not isinstance(choices, list) or not all(isinstance(choice, dict) for choice in choices):
            raise framing.ProtocolError(f"stream event: choices is a JSON {json_type(choices)} where vLLM sends a "
                                     "list of objects")
        if choices and self._has_token(choices[0]):
            self._token(now)

    def _token(self, now: float) -> None:
        if self.first is None:
            self.first = now
            if self.record is not None:
                self.record.first_token_s = now
        else:
            self.gaps.append(now - self.last)
        self.last = now

    def _has_token(self, choice: dict) -> bool:
        # a chat stream opens with a role chunk (content ""), which carries no token; any other choice does
        delta = (choice.get("delta") or {}) if self.chat else {}
        if not isinstance(delta, dict):
            raise framing.ProtocolError(f"stream event: delta is a JSON {json_type(delta)} where vLLM sends an object")
        return not ("role" in delta and not delta.get("content"))

    def _note_error(self, error: object) -> None:
        """vLLM's error object ({"message", "type", "param", "code"}); its code when it is an HTTP status."""
        fields = error if isinstance(error, dict) else {}
        code = fields.get("code")
        self.error = str(fields.get("message", error))[:200]
        self.error_body = json.dumps({"error": error})
        if isinstance(code, int) and 400 <= code <= 599:
            self.error_code = code


def parse_json(text: bytes, what: str) -> object:
    """``text`` as JSON; ProtocolError saying why not (nesting too deep for the parser included)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise framing.ProtocolError(f"{what}: not JSON ({exc.__class__.__name__}: {str(exc)[:80]})") from None


def json_type(value: object) -> str:
    """The JSON name of a parsed value's type, for the reason of a protocol_error."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    names = {dict: "object", list: "array", str: "string", int: "number", float: "number"}
    return names.get(type(value), type(value).__name__)


def checked_usage(usage: object) -> dict:
    """vLLM's usage object: prompt_tokens and completion_tokens counts (ints >= 0); ProtocolError otherwise."""
    if not isinstance(usage, dict):
        raise framing.ProtocolError(f"usage: a JSON {json_type(usage)} where vLLM sends an object")
    for name in ("prompt_tokens", "completion_tokens"):
        value = usage.get(name)
        if type(value) is not int or value < 0:
            raise framing.ProtocolError(f"usage.{name}: {json.dumps(value)[:40]} is not a count of tokens")
    return usage


def measure(connection: Connection, target: Target, record: RequestRecord, extra_headers: dict[str, str],
            follow: Follow | None = None) -> RequestRecord:
    """Send one request on ``connection`` and fill ``record``; every failure becomes an outcome, never an
    exception (BaseExceptions such as a killed greenlet propagate, leaving outcome 'aborted'). ``follow``: the
    process's stream reader (loadgen.stream.reader), which reads streamed bodies for every request at once."""
    try:
        return _exchange(connection, target, record, extra_headers, follow)
    except http.ConnectFailed as exc:
        return _finish(record, "connection_error", error=str(exc))
    except http.Timeout as exc:
        return _finish(record, "timeout", error=str(exc))
    except http.StreamBroken as exc:
        return _finish(record, "truncated" if record.status else "connection_error", error=str(exc))
    except framing.ProtocolError as exc:
        connection.close()  # what else the peer sent on it cannot be framed
        return _finish(record, "protocol_error", error=str(exc)[:200])


def _exchange(connection: Connection, target: Target, record: RequestRecord, extra_headers: dict,
              follow: Follow | None) -> RequestRecord:
    request = framing.encode_request(target.endpoint, target.next_body(), {**target.headers, **extra_headers})
    reused = connection.is_open
    try:
        record.sent_s = connection.send(request)
        connection.deadline = record.sent_s + target.timeout_s
        status, headers = connection.read_head()
    except http.StreamBroken:
        if not reused:
            raise
        # a kept-alive connection the server had already closed: nothing was processed, send again once
        connection.close()
        record.sent_s = connection.send(request)
        connection.deadline = record.sent_s + target.timeout_s
        status, headers = connection.read_head()
    record.status = status
    if status != 200:
        record.retry_after_s = framing.retry_after_s(headers.get("retry-after"))
        body, _whole = connection.read_bounded(headers, MAX_ERROR_BODY_BYTES)  # closed when longer
        text = body.decode("utf-8", "replace")
        return _finish(record, _refused(record, status, text), error=text[:200])
    if target.stream:
        return _read_stream(connection, headers, target, record, follow)
    body, whole = connection.read_bounded(headers, MAX_BODY_BYTES)
    if not whole:
        raise framing.ProtocolError(f"body: over the {MAX_BODY_BYTES >> 20} MiB a non-streamed reply may have "
                                 "(MAX_BODY_BYTES)")
    return _read_body(body, target, record)


def _read_stream(connection: Connection, headers: dict[str, str], target: Target, record: RequestRecord,
                 follow: Follow | None) -> RequestRecord:
    stream = TokenStream(target.chat, record)
    try:  # timings are kept even when the stream breaks, times out or is aborted
        # each piece timed by when its bytes arrived, not when a greenlet got to them
        connection.read_body(headers, stream.feed, follow)
    finally:
        _fill_timing(record, target, stream.first, stream.last, stream.gaps)
        record.read_lag_s = connection.read_lag_s()
    if stream.error_code is not None:  # answered as if by HTTP: rejected() and the back-off see the code
        record.status = stream.error_code
        return _finish(record, _refused(record, stream.error_code, stream.error_body), error=stream.error)
    if stream.error:
        return _finish(record, "truncated", error=stream.error)
    if not stream.done or stream.usage is None or stream.first is None:
        missing = "[DONE]" if not stream.done else "usage" if stream.usage is None else "tokens"
        return _finish(record, "truncated", error=f"stream ended without {missing}")
    return _check_usage(record, target, stream.usage, events=len(stream.gaps) + 1)


def _refused(record: RequestRecord, status: int, body: str | None) -> str:
    """The outcome of an error answer: rejected_busy (its reason noted) when vLLM's admission check refused the
    request, http_error otherwise. vLLM checks admission before it starts the answer (an HTTP 503), and again as
    it adds the request to the engine (AsyncLLM._add_request): a request that lost that race gets a 200 stream
    whose one event is the same error, code 503."""
    record.reject_reason = admission.reason_of(status, body)
    return "http_error" if record.reject_reason is None else "rejected_busy"


def _read_body(body: bytes, target: Target, record: RequestRecord) -> RequestRecord:
    data = parse_json(body, "body")
    if not isinstance(data, dict):
        raise framing.ProtocolError(f"body: a JSON {json_type(data)} where vLLM sends an object")
    now = time.time()
    _fill_timing(record, target, now, now, [])
    return _check_usage(record, target, checked_usage(data.get("usage")))


def _fill_timing(record: RequestRecord, target: Target, first: float | None, last: float | None,
                 gaps: Sequence[float]) -> None:
    # a closed loop's "schedule" is only its user being ready: what the client spends before the write (a
    # burst of users started together, a preempted process) is the client's, and stays in the dispatch lag
    origin = record.sent_s if target.timed_from_send and record.sent_s is not None else record.scheduled_s
    _time_tokens(record, origin, first, last, gaps)


def _time_tokens(record: RequestRecord, origin: float, first: float | None, last: float | None,
                 gaps: Sequence[float]) -> None:
    """The token times, and TTFT and E2E from ``origin``."""
    record.first_token_s, record.last_token_s, record.itl_s = first, last, gaps
    if first is not None and last is not None:
        record.ttft_s = first - origin
        record.e2e_s = last - origin


def tpot_s(first_token_s: float | None, last_token_s: float | None, output_tokens: int) -> float | None:
    """TPOT = (E2E - TTFT) / (n - 1): (last token - first token) / (n - 1), n from usage; None for one token."""
    if output_tokens > 1 and first_token_s is not None and last_token_s is not None:
        return (last_token_s - first_token_s) / (output_tokens - 1)
    return None


def timed_elsewhere(request_id: str, sent_s: float, first_token_s: float, last_token_s: float,
                    itl_s: Sequence[float], prompt_tokens: int, output_tokens: int) -> RequestRecord:
    """The ok record of a request timed by another clock (a what-if run's virtual one) under a measured one's
    rules: sent when scheduled, TTFT and E2E from the send, TPOT from the output tokens, ended at its last token."""
    record = RequestRecord(request_id=request_id, worker=0, scheduled_s=sent_s, sent_s=sent_s,
                           prompt_tokens=prompt_tokens, output_tokens=output_tokens)
    _time_tokens(record, sent_s, first_token_s, last_token_s, itl_s)
    record.tpot_s = tpot_s(first_token_s, last_token_s, output_tokens)
    record.outcome, record.end_s = "ok", last_token_s
    return record


def _check_usage(record: RequestRecord, target: Target, usage: dict, events: int | None = None) -> RequestRecord:
    """Usage against the spec, and a stream's token ``events`` against usage (more is a fault, fewer is not: see
    the module's docstring); TPOT from usage's count."""
    record.prompt_tokens = usage["prompt_tokens"]
    record.output_tokens = usage["completion_tokens"]
    record.tpot_s = tpot_s(record.first_token_s, record.last_token_s, record.output_tokens)
    if (record.prompt_tokens, record.output_tokens) != (target.prompt_tokens, target.output_tokens):
        return _finish(record, "length_mismatch", error=(
            f"usage prompt={record.prompt_tokens} output={record.output_tokens}, "
            f"spec prompt={target.prompt_tokens} output={target.output_tokens}"))
    if events is not None and events > record.output_tokens:
        return _finish(record, "length_mismatch", error=(
            f"{events} token events, more than usage.completion_tokens {record.output_tokens} "
            f"(spec output={target.output_tokens})"))
    return _finish(record, "ok")


def _finish(record: RequestRecord, outcome: str, error: str | None = None) -> RequestRecord:
    record.outcome = outcome
    record.error = error
    record.end_s = time.time()
    return record
