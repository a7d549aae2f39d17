"""One measured request against the simulator over loopback: timings and exactly one outcome each."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from loadgen.http import ConnectionPool, Follow
from loadgen.reader import StreamReader
from loadgen.request import RequestRecord, measure
from loadgen.spec import load_spec
from loadgen.target import Target, build_target
from tests.conftest import free_port

pytestmark = pytest.mark.e2e


def target_for(url: str, **spec_fields) -> Target:
    fields = {"input_tokens": 50, "output_tokens": 20, "timeout_s": 10, "load.mode": "offline", "load.requests": 1}
    fields.update(spec_fields)
    return build_target(load_spec(None, [f"{k}={v}" for k, v in fields.items()]), url)


def send(target: Target, pool: ConnectionPool | None = None, follow: Follow | None = None) -> RequestRecord:
    record = RequestRecord(request_id="t", worker=0, scheduled_s=time.time())
    pool = pool or ConnectionPool(target.endpoint, target.timeout_s)
    connection = pool.acquire()
    try:
        return measure(connection, target, record, {}, follow)
    finally:
        pool.release(connection)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_ok_stream_has_exact_lengths_and_vllm_bench_timings(simulator, endpoint):
    sim = simulator("--profile", "tiny")
    record = send(target_for(sim.url, endpoint=endpoint))
    assert record.outcome == "ok", record.error
    assert (record.prompt_tokens, record.output_tokens) == (50, 20)
    assert len(record.itl_s) == 19 and all(gap >= 0 for gap in record.itl_s)
    assert record.ttft_s == pytest.approx(record.first_token_s - record.scheduled_s)
    assert record.e2e_s == pytest.approx(record.last_token_s - record.scheduled_s)
    assert record.tpot_s == pytest.approx((record.e2e_s - record.ttft_s) / 19)
    assert sum(record.itl_s) == pytest.approx(record.last_token_s - record.first_token_s)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_the_process_reader_measures_streams_as_their_own_greenlet_does(simulator, endpoint):
    sim = simulator("--profile", "tiny")
    target = target_for(sim.url, endpoint=endpoint)
    pool = ConnectionPool(target.endpoint, target.timeout_s)
    records = [send(target, pool), send(target, pool, follow=StreamReader().follow)]
    for record in records:
        assert record.outcome == "ok", record.error
        assert (record.prompt_tokens, record.output_tokens, len(record.itl_s)) == (50, 20, 19)
        assert sum(record.itl_s) == pytest.approx(record.last_token_s - record.first_token_s)
    assert len(pool._idle) == 1  # the reader left the connection reusable: one served both


def test_a_stream_cut_under_the_process_reader_is_truncated(simulator):
    sim = simulator("--profile", "tiny", "--fault-cut-rate", "1")
    record = send(target_for(sim.url), follow=StreamReader().follow)
    assert record.outcome == "truncated" and record.first_token_s is not None


def test_non_streaming_request_is_ok_without_itl(simulator):
    sim = simulator("--profile", "tiny")
    record = send(target_for(sim.url, stream="false"))
    assert record.outcome == "ok" and record.itl_s == [] and record.output_tokens == 20


def test_http_error(simulator):
    sim = simulator("--profile", "tiny", "--fault-error-rate", "1")
    target = replace(target_for(simulator("--profile", "tiny").url), url=sim.url + "/v1/completions")
    record = send(target)
    assert (record.outcome, record.status) == ("http_error", 500)


def test_cut_stream_is_truncated(simulator):
    sim = simulator("--profile", "tiny", "--fault-cut-rate", "1")
    record = send(target_for(sim.url))
    assert record.outcome == "truncated" and record.first_token_s is not None


def test_stalled_server_times_out(simulator):
    sim = simulator("--profile", "tiny", "--fault-stall-rate", "1", "--fault-stall-s", "3")
    target = replace(target_for(simulator("--profile", "tiny").url), url=sim.url + "/v1/completions", timeout_s=0.5)
    started = time.monotonic()
    record = send(target)
    assert record.outcome == "timeout" and time.monotonic() - started < 2.5


def test_refused_connection(simulator):
    target = replace(target_for(simulator("--profile", "tiny").url), url=f"http://127.0.0.1:{free_port()}/v1/completions")
    assert send(target).outcome == "connection_error"


def test_length_mismatch_when_usage_differs_from_the_spec(simulator):
    sim = simulator("--profile", "tiny")
    target = target_for(sim.url)
    record = send(replace(target, body={**target.body, "max_tokens": 7}))
    assert record.outcome == "length_mismatch" and record.output_tokens == 7


def test_target_round_trips_through_json(simulator):
    target = target_for(simulator("--profile", "tiny").url, endpoint="chat")
    assert Target.from_json(target.to_json()) == target
    assert json.loads(target.to_json())["body"]["max_completion_tokens"] == 20


def test_keep_alive_connections_are_reused(simulator):
    sim = simulator("--profile", "tiny")
    target = target_for(sim.url)
    pool = ConnectionPool(target.endpoint, target.timeout_s)
    assert [send(target, pool).outcome for _ in range(3)] == ["ok"] * 3
    assert len(pool._idle) == 1  # one connection served all three
