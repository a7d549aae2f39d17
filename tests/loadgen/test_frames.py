"""The HTTP client's framing without a server process: chunked transfer over a loopback socket fed canned bytes,
and the SSE token stream fed arbitrary splits (frames across reads, several per read, [DONE], errors) and what it
counts as a token (every event with choices, as `vllm bench serve`, but chat's opening role chunk)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import pytest

from batchscope.loadgen.stream.framing import Endpoint, encode_request
from batchscope.loadgen.stream.http import Connection, StreamBroken
from batchscope.loadgen.stream.request import RequestRecord, TokenStream, measure
from batchscope.loadgen.stream.target import Target

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def token(text: str, usage: dict | None = None, chat: bool = False) -> bytes:
    choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
    data = {"id": "x", "choices": [choice] if text is not None else [], "usage": usage}
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


# what vLLM opens a chat stream with, beside the first token: a role and no content
ROLE_CHUNK = b'data: {"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'


def chunked(*frames: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(f), f) for f in frames) + b"0\r\n\r\n"


def canned_server(reply: bytes, close: bool = False) -> tuple[Endpoint, threading.Thread]:
    """A one-connection server on loopback that reads one request head and writes ``reply`` in one send."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        # a client that stops reading a reply hangs up on the rest of it (a reset, here)
        with listener, listener.accept()[0] as conn, contextlib.suppress(ConnectionError):
            received = b""
            while b"\r\n\r\n" not in received:
                received += conn.recv(4096)
            conn.sendall(reply)
            if not close:
                conn.recv(1)  # until the client hangs up

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return Endpoint(f"http://127.0.0.1:{listener.getsockname()[1]}/v1/completions"), thread


def exchange(reply: bytes, close: bool = False) -> tuple[bool, list[bytes]]:
    """The body's pieces, and whether the connection was left reusable."""
    endpoint, thread = canned_server(reply, close)
    connection = Connection(endpoint, timeout_s=5)
    connection.send(encode_request(endpoint, b"{}", {}))
    status, headers = connection.read_head()
    assert status == 200
    chunks = []
    try:
        chunks.extend(connection.body(headers))
        return connection.reusable, chunks
    finally:
        connection.close()
        thread.join(timeout=5)


def test_chunks_of_every_size_come_out_whole_whatever_the_reads():
    # frames of changing sizes, one as large as several reads
    frames = [b"a" * 300, b"b" * 7, b"c" * 1000, b"d", b"e" * 70000, b"f" * 40]
    reusable, chunks = exchange(HEAD + chunked(*frames))
    assert b"".join(chunks) == b"".join(frames)
    assert reusable  # the terminal chunk ended the body cleanly


def test_a_body_cut_inside_a_chunk_is_a_broken_stream():
    with pytest.raises(StreamBroken):
        exchange(HEAD + b"64\r\n" + b"x" * 10, close=True)


def test_sized_body_and_connection_close():
    body = b'{"usage":{}}'
    reply = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    reusable, chunks = exchange(reply)
    assert b"".join(chunks) == body and not reusable


def feed_in_pieces(stream: TokenStream, data: bytes, size: int) -> None:
    for moment, start in enumerate(range(0, len(data), size)):
        stream.feed(data[start:start + size], float(moment))


@pytest.mark.parametrize("size", [1, 3, 17, 10_000])
def test_sse_events_split_across_and_packed_into_reads(size):
    usage = {"prompt_tokens": 4, "completion_tokens": 3}
    data = token("a") + token("b") + token("c") + token(None, usage=usage) + b"data: [DONE]\n\n"
    stream = TokenStream(chat=False)
    feed_in_pieces(stream, data, size)
    assert stream.done and stream.usage == usage and stream.error is None
    assert len(stream.gaps) == 2  # three tokens
    if size == 10_000:  # one read: every token stamped with its arrival
        assert (stream.first, stream.last, stream.gaps) == (0.0, 0.0, [0.0, 0.0])
    else:
        assert stream.first < stream.last and sum(stream.gaps) == stream.last - stream.first


def test_sse_times_each_token_by_the_read_that_completed_it():
    stream = TokenStream(chat=True)
    first, second = token("hi", chat=True), token(" there", chat=True)
    stream.feed(ROLE_CHUNK, 1.0)  # chat's role-only opening chunk carries no token
    stream.feed(first[:5], 2.0)
    stream.feed(first[5:] + second[:-1], 3.0)
    stream.feed(second[-1:], 4.5)
    assert (stream.first, stream.last, stream.gaps) == (3.0, 4.5, [1.5])


def test_sse_error_event_and_spaced_json_take_the_parsing_path():
    stream = TokenStream(chat=False)
    stream.feed(b'data: {"choices": [{"text": "x"}]}\n\n', 1.0)  # not vLLM's compact JSON
    stream.feed(b'data: {"error": {"message": "boom"}}\n\n', 2.0)
    assert (stream.first, stream.error, stream.error_code, stream.done) == (1.0, "boom", None, False)
    # vLLM's own, as it writes an error once a stream has begun: its code is the HTTP status it stands for
    stream.feed(b'data: {"error": {"message": "Token id 9000 is out of vocabulary", "type": "BadRequestError", '
                b'"param": null, "code": 400}}\n\ndata: [DONE]\n\n', 3.0)
    assert (stream.error, stream.error_code, stream.done) == ("Token id 9000 is out of vocabulary", 400, True)


def test_sse_comments_are_not_tokens_and_an_empty_text_is_one():
    stream = TokenStream(chat=False)
    stream.feed(b": keep-alive\n\n" + token("") + b"data: [DONE]\n\n", 1.0)
    assert stream.first == 1.0 and stream.done


@pytest.mark.parametrize("chat", [False, True])
def test_a_stream_with_empty_texts_is_timed_by_every_chunk_as_vllm_bench_serve_times_it(chat):
    # vLLM sends "text":"" for a token that ends inside a UTF-8 character: it is a token all the same
    texts = ["ab", "", "c", "", "", "d"]
    events = [token(text, chat=chat) for text in texts]
    usage = token(None, usage={"prompt_tokens": 3, "completion_tokens": len(texts)})
    opening = [ROLE_CHUNK] if chat else []
    endpoint, thread = canned_server(HEAD + chunked(*opening, *events, usage, b"data: [DONE]\n\n"))
    target = Target(url=f"http://{endpoint.host_header}{endpoint.path}", headers={}, body={"prompt": [1, 2, 3]},
                    chat=chat, stream=True, prompt_tokens=3, output_tokens=len(texts), timeout_s=5)
    connection = Connection(target.endpoint, timeout_s=5)
    try:
        record = measure(connection, target, RequestRecord("r", 0, scheduled_s=time.time()), {})
    finally:
        connection.close()
        thread.join(timeout=5)
    assert record.outcome == "ok", record.error
    assert len(record.itl_s) == len(texts) - 1  # the first chunk is TTFT, each later one a gap
    assert record.tpot_s is not None


def test_sse_events_with_other_fields_or_no_data_are_not_taken_for_tokens():
    stream = TokenStream(chat=False)
    stream.feed(b'event: note\ndata: {"choices":[{"text":"x"}]}\n\n', 1.0)  # a named event's data still counts
    stream.feed(b'id: 7 "text":"x"\n\n', 2.0)  # no data line: nothing
    assert (stream.first, stream.last, stream.gaps) == (1.0, 1.0, [])
