"""What a broken or hostile peer can make the client hold or believe, without a server process: chunk sizes and
frames, stream events over their cap or after [DONE], JSON that is not vLLM's, error and plain bodies over their
cap, token events against usage, Retry-After, and the rate-limited log of failed requests.

A negative chunk size (which once looped forever, 22 GB in 65 s) is left to tests/hostile, whose runs have an
address-space limit: here a regression would take the test process's memory.
"""

from __future__ import annotations

import logging
import time
from email.utils import formatdate

import pytest

from batchscope.loadgen.run.faults import FaultLog
from batchscope.loadgen.stream import framing
from batchscope.loadgen.stream.framing import ProtocolError, retry_after_s
from batchscope.loadgen.stream.http import Connection
from batchscope.loadgen.stream.request import MAX_EVENT_BYTES, RequestRecord, TokenStream, measure
from batchscope.loadgen.stream.target import Target
from tests.loadgen.test_frames import HEAD, canned_server, chunked, exchange, token

USAGE = token(None, usage={"prompt_tokens": 3, "completion_tokens": 3})
DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize("line", [b"zz", b"+6", b"-0", b"0x6", b"1_0", b" 6", b"", b"e8d4a51000"])
def test_a_chunk_size_that_is_not_hex_digits_or_is_over_the_cap_is_a_protocol_error_naming_the_bound(line):
    with pytest.raises(ProtocolError, match="MAX_CHUNK_BYTES"):
        exchange(HEAD + line + b"\r\n" + b"data: {}\n\n\r\n" + b"0\r\n\r\n")


def test_a_chunk_whose_data_is_not_followed_by_crlf_or_whose_size_line_never_ends_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="not followed by CRLF"):
        exchange(HEAD + b"3\r\nabcXY0\r\n\r\n")
    with pytest.raises(ProtocolError, match="MAX_CHUNK_LINE_BYTES"):
        exchange(HEAD + b"1" * (framing.MAX_CHUNK_LINE_BYTES + 1))


def test_a_chunk_larger_than_the_reads_that_bring_it_is_gathered_whole():
    frames = [b"a" * (3 << 20), b"b", b"c" * 100_000]
    reusable, chunks = exchange(HEAD + chunked(*frames))
    assert chunks == frames and reusable


def test_an_event_over_its_cap_is_a_protocol_error_whether_it_ends_or_not():
    stream = TokenStream(chat=False)
    with pytest.raises(ProtocolError, match="MAX_EVENT_BYTES"):
        for _ in range(MAX_EVENT_BYTES // 65536 + 1):  # data: aaaa... and no blank line
            stream.feed(b"data: " + b"a" * 65536, 1.0)
    with pytest.raises(ProtocolError, match="MAX_EVENT_BYTES"):
        TokenStream(chat=False).feed(b"data: " + b"a" * MAX_EVENT_BYTES + b"\n\n", 1.0)


def test_events_split_into_single_bytes_are_read_as_whole_ones():
    stream = TokenStream(chat=False)
    for index, byte in enumerate(token("a") + token("b") + USAGE + DONE):
        stream.feed(bytes([byte]), float(index))
    assert stream.done and len(stream.gaps) == 1 and stream.usage == {"prompt_tokens": 3, "completion_tokens": 3}


@pytest.mark.parametrize("after", [token("late"), USAGE, DONE])
def test_an_event_after_done_is_a_protocol_error_in_the_same_read_or_a_later_one(after):
    with pytest.raises(ProtocolError, match=r"after data: \[DONE\]"):
        TokenStream(chat=False).feed(token("a") + DONE + after, 1.0)
    stream = TokenStream(chat=False)
    stream.feed(token("a") + DONE, 1.0)
    with pytest.raises(ProtocolError, match=r"after data: \[DONE\]"):
        stream.feed(after, 2.0)


@pytest.mark.parametrize(("chat", "payload", "reason"), [
    (False, b"[1,2]", "stream event: a JSON array where vLLM sends an object"),
    (False, b'"text"', "stream event: a JSON string where vLLM sends an object"),
    (False, b'{"choices": {"a": 1}}', "choices is a JSON object where vLLM sends a list of objects"),
    (False, b'{"choices":{"text":"x"}}', "choices is a JSON object where vLLM sends a list of objects"),
    (False, b'{"choices": [1]}', "choices is a JSON array where vLLM sends a list of objects"),
    (False, b'{"choices": [], "usage": [1]}', "usage: a JSON array where vLLM sends an object"),
    (False, b'{"usage": {"prompt_tokens": "4", "completion_tokens": 3}}', 'usage.prompt_tokens: "4" is not a count'),
    (False, b'{"usage": {"prompt_tokens": 4, "completion_tokens": -1}}', "usage.completion_tokens: -1 is not a count"),
    (False, b'{"usage": {"prompt_tokens": 4}}', "usage.completion_tokens: null is not a count"),
    (False, b"{not json", "stream event: not JSON (JSONDecodeError"),
    (False, b"[" * 100_000, "stream event: not JSON (RecursionError"),
    (True, b'{"choices": [{"delta": "x"}]}', "delta is a JSON string where vLLM sends an object"),
])
def test_an_event_that_is_not_vllms_object_is_a_protocol_error_with_its_reason(chat, payload, reason):
    with pytest.raises(ProtocolError) as raised:
        TokenStream(chat=chat).feed(b"data: " + payload + b"\n\n", 1.0)
    assert reason in str(raised.value)


def target(url: str, stream: bool = True, output_tokens: int = 3) -> Target:
    return Target(url=url, headers={}, body={"prompt": [1, 2, 3]}, chat=False, stream=stream, prompt_tokens=3,
                  output_tokens=output_tokens, timeout_s=5)


def measured(reply: bytes, stream: bool = True, output_tokens: int = 3) -> tuple[RequestRecord, Connection]:
    """The record of one request answered ``reply``, and its connection (closed after)."""
    endpoint, thread = canned_server(reply)
    request = target(f"http://{endpoint.host_header}{endpoint.path}", stream, output_tokens)
    connection = Connection(request.endpoint, timeout_s=5)
    try:
        return measure(connection, request, RequestRecord("r", 0, scheduled_s=time.time()), {}), connection
    finally:
        connection.close()
        thread.join(timeout=5)


def test_an_error_body_is_read_up_to_its_cap_and_the_connection_closed_with_retry_after_recorded():
    body = b"e" * (200 << 10)
    record, connection = measured(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: %d\r\nretry-after: 7\r\n\r\n"
                                  % len(body) + body)
    assert (record.outcome, record.status, record.error, record.retry_after_s) == ("http_error", 503, "e" * 200, 7.0)
    assert not connection.reusable  # the rest of the body was left unread


def test_a_plain_body_over_its_cap_or_not_vllms_object_is_a_protocol_error():
    body = b" " * (17 << 20)
    record, _ = measured(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body, stream=False)
    assert (record.outcome, record.error) == (
        "protocol_error", "body: over the 16 MiB a non-streamed reply may have (MAX_BODY_BYTES)")
    for reply, reason in ((b"[]", "body: a JSON array where vLLM sends an object"),
                          (b'{"choices": []}', "usage: a JSON null where vLLM sends an object")):
        record, _ = measured(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(reply) + reply, stream=False)
        assert (record.outcome, record.error) == ("protocol_error", reason)


def test_more_token_events_than_usage_is_a_length_mismatch_and_fewer_is_ok_with_tpot_from_usage():
    events = [token("x") for _ in range(6)]
    record, _ = measured(HEAD + chunked(*events, USAGE, DONE))
    assert (record.outcome, record.error) == (
        "length_mismatch", "6 token events, more than usage.completion_tokens 3 (spec output=3)")
    # vLLM merges tokens into one event when its API server lags: two events for three tokens are fine
    record, _ = measured(HEAD + chunked(token("xy"), token("z"), USAGE, DONE))
    assert record.outcome == "ok" and len(record.itl_s) == 1
    assert record.tpot_s == pytest.approx((record.last_token_s - record.first_token_s) / 2)


def test_retry_after_is_seconds_or_an_http_date():
    now = time.time()
    assert retry_after_s("2") == 2.0 and retry_after_s(" 120 ") == 120.0
    assert retry_after_s(formatdate(now + 10, usegmt=True), now) == pytest.approx(10, abs=1)
    assert retry_after_s(formatdate(now - 10, usegmt=True), now) == 0.0  # a date past: now
    assert [retry_after_s(value) for value in (None, "", "-1", "1.5", "soon", "²")] == [None] * 6


def test_failed_requests_are_logged_once_per_kind_then_counted(caplog):
    moment = [0.0]
    faults = FaultLog(every_s=10.0, clock=lambda: moment[0])

    def fail(outcome: str, status: int | None = None) -> RequestRecord:
        return RequestRecord("r", 0, 0.0, outcome=outcome, status=status, error=f"{outcome} detail")

    with caplog.at_level(logging.WARNING, logger="batchscope.loadgen"):
        for _ in range(1000):
            faults.note(fail("protocol_error"))
            faults.note(fail("http_error", 503))
            faults.note(RequestRecord("r", 0, 0.0, outcome="ok"))
            faults.note(fail("aborted"))
            moment[0] += 0.001  # 1000 of each in 1 s
        moment[0] = 10.2
        faults.note(fail("protocol_error"))
        faults.flush()
    assert [record.getMessage() for record in caplog.records] == [
        "request failed, protocol_error: protocol_error detail (more of this kind are counted every 10 s)",
        "request failed, http_error 503: http_error detail (more of this kind are counted every 10 s)",
        "requests failed, protocol_error: 1000 more in the last 10 s",
        "requests failed, http_error 503: 999 more in the last 10 s",
    ]
