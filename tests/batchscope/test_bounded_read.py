"""One bounded exchange (batchscope/wire/bounded_read.py) for the pre-flight's requests and every fetch, against local
servers: any status answered or raised, redirects followed only when asked, error bodies within their cap, and
the deadline whatever the peer does."""

from __future__ import annotations

import time

import pytest
import requests

from batchscope.loadgen.stream.target import exchange
from batchscope.testkit.hostile import HostileServer
from batchscope.wire.bounded_read import ERROR_MAX_BYTES, JSON_MAX_BYTES, BodyTooLarge, FetchTimeout, fetch, request
from tests.stubs import HttpStub, Reply


@pytest.fixture
def stub():
    bodies = {"/missing": Reply(status=404, body=b'{"error": "no such route"}'),
              "/huge-error": Reply(status=500, body=b"x" * (ERROR_MAX_BYTES + 1)),
              "/ok": Reply(body=b'{"data": []}')}
    server = HttpStub(lambda _method, path: bodies[path]).start()
    yield server
    server.stop()


def soon(seconds: float = 5.0) -> float:
    return time.monotonic() + seconds


def test_an_error_status_is_an_answer_to_request_and_raised_by_fetch(stub):
    with requests.Session() as session:
        answer = request(session, "POST", stub.url + "/missing", deadline=soon(), max_bytes=JSON_MAX_BYTES,
                         json={"a": 1})
        assert (answer.reply.status_code, answer.body.text()) == (404, '{"error": "no such route"}')
        assert stub.requests[-1].method == "POST" and stub.requests[-1].json() == {"a": 1}
        with pytest.raises(requests.HTTPError) as raised:
            fetch(session, stub.url + "/missing", deadline=soon(), max_bytes=JSON_MAX_BYTES)
        assert raised.value.response is not None and raised.value.response.status_code == 404
        assert request(session, "GET", stub.url + "/huge-error", deadline=soon(), max_bytes=JSON_MAX_BYTES
                       ).body.data == b"", "an error's body over its cap is dropped: the status says enough"
        assert fetch(session, stub.url + "/ok", deadline=soon(), max_bytes=JSON_MAX_BYTES).text() == '{"data": []}'


def test_a_redirect_is_followed_only_when_asked():
    with HostileServer("ok") as elsewhere, HostileServer("redirect-models", redirect_to=elsewhere.url) as server, \
            requests.Session() as session:
        status, headers, _ = exchange(session, "GET", server.url + "/v1/models", 5.0)
        assert (status, headers["location"]) == (302, elsewhere.url + "/v1/models")
        assert elsewhere.seen.get("/v1/models", 0) == 0
        fetch(session, server.url + "/v1/models", deadline=soon(), max_bytes=JSON_MAX_BYTES)
        assert elsewhere.seen["/v1/models"] == 1


def test_a_body_over_its_cap_and_a_peer_past_the_deadline_end_the_exchange_in_time():
    with HostileServer("models-huge") as huge, requests.Session() as session, pytest.raises(BodyTooLarge):
        exchange(session, "GET", huge.url + "/v1/models", 5.0)
    for mode in ("metrics-hang", "metrics-drip"):
        with HostileServer(mode) as server, requests.Session() as session:
            began = time.monotonic()
            with pytest.raises(FetchTimeout):
                exchange(session, "GET", server.url + "/metrics", 0.5)
            assert time.monotonic() - began < 0.5 + 0.5  # a read's wait at most past the deadline
