"""One measured request against the simulator over loopback: timings and exactly one outcome each."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from batchscope.loadgen.spec import SpecError
from batchscope.loadgen.stream.http import ConnectionPool
from batchscope.loadgen.stream.reader import StreamReader
from batchscope.loadgen.stream.request import rejected
from batchscope.loadgen.stream.target import VOCAB_PROBES, Target
from tests.conftest import free_port
from tests.loadgen.support import send, target_for

pytestmark = pytest.mark.e2e


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


def test_a_closed_loop_request_is_timed_from_its_write_and_an_open_loop_one_from_its_schedule(simulator):
    url = simulator("--profile", "tiny").url
    closed = send(target_for(url, **{"load.mode": "concurrency", "load.concurrency": 1, "load.requests": "null"}))
    opened = send(target_for(url))  # offline
    assert closed.outcome == opened.outcome == "ok"
    assert closed.ttft_s == pytest.approx(closed.first_token_s - closed.sent_s)
    assert opened.ttft_s == pytest.approx(opened.first_token_s - opened.scheduled_s)
    assert closed.e2e_s == pytest.approx(closed.last_token_s - closed.sent_s)


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


def test_a_timed_out_connection_is_not_reused_so_its_late_response_is_nobodys(simulator):
    # the first request's response comes 1 s after it was sent, inside the second request's 0.7 s window:
    # on the same connection the second would read it as its own answer
    sim = simulator("--profile", "tiny", "--fault-stall-rate", "1", "--fault-stall-s", "1")
    target = replace(target_for(simulator("--profile", "tiny").url), url=sim.url + "/v1/completions", timeout_s=0.7)
    pool = ConnectionPool(target.endpoint, target.timeout_s)
    pool.prepare()  # a connection opened ahead, as every load generator user has
    assert [send(target, pool).outcome for _ in range(2)] == ["timeout", "timeout"]
    assert pool._idle == []


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


def completions_served(sim) -> float:
    """Requests the simulator answered on /v1/completions, whatever their status (its http_requests_total)."""
    text = requests.get(sim.url + "/metrics", timeout=5).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "http_requests_total" and s.labels["handler"] == "/v1/completions")


@pytest.mark.parametrize(("vocab_size", "ids"), [(None, (1000, 30000)), (8000, (1000, 8000)), (1500, (100, 1500))])
def test_prompt_ids_are_drawn_from_the_vocabulary_the_server_accepts(simulator, vocab_size, ids):
    sim = simulator("--profile", "tiny", *(["--vocab-size", str(vocab_size)] if vocab_size else []))
    target = target_for(sim.url, **{"shared_prefix.tokens": 20})
    assert (target.id_low, target.id_high) == ids
    probes = completions_served(sim)
    # one probe when ID_HIGH - 1 is in the vocabulary, else a bisection for its end, bounded
    assert probes == 1 if vocab_size is None else 2 < probes <= VOCAB_PROBES
    records = [send(target) for _ in range(3)]
    assert [r.outcome for r in records] == ["ok"] * 3, records[0].error
    low, high = ids
    assert all(low <= token < high for token in target.body["prompt"] + target.prefixes[0])


def test_a_vocabulary_too_small_to_tell_prompts_apart_is_refused_before_the_run(simulator):
    sim = simulator("--profile", "tiny", "--vocab-size", "150")
    with pytest.raises(SpecError) as refused:
        target_for(sim.url)
    assert str(refused.value) == ("server: a vocabulary of 150 token ids leaves 50 ids (100-149) for prompts, fewer "
                                  "than the 100 the load generator needs to make each prompt its own")
    offline = simulator("--profile", "tiny", "--vocab-size", "1200")
    with pytest.raises(SpecError, match="3 salt ids tell 1,210,000 requests apart, fewer than the run's 2,000,000"):
        target_for(offline.url, **{"load.requests": 2_000_000})


def test_an_error_event_in_a_200_stream_ends_the_request_as_an_http_error_of_its_code(simulator):
    sim = simulator("--profile", "tiny", "--vocab-size", "8000")
    target = target_for(sim.url)
    # ids a load generator that did not probe could send (1000-29999): vLLM answers 200, then the error
    record = send(replace(target, body={**target.body, "prompt": [12000] * 50}))
    assert (record.outcome, record.status, record.error) == ("http_error", 400, "Token id 12000 is out of vocabulary")
    assert rejected(record) and record.first_token_s is None and record.itl_s == []


def test_keep_alive_connections_are_reused(simulator):
    sim = simulator("--profile", "tiny")
    target = target_for(sim.url)
    pool = ConnectionPool(target.endpoint, target.timeout_s)
    assert [send(target, pool).outcome for _ in range(3)] == ["ok"] * 3
    assert len(pool._idle) == 1  # one connection served all three
