"""`batchscope load` (a real subprocess) against each stream mode of the hostile vLLM-shaped server
(batchscope.testkit.hostile).

Whatever the server sends, each run ends within WALL_BOUND_S with its documented exit status (0 when the
requests complete, 4 when none does), every started request ends in exactly one outcome (summary.balanced), the
one the mode calls for, with the reason (and the bound, where one was hit) in the record's error, the load
process's peak RSS (wait4's ru_maxrss) stays under RSS_BOUND_MB, and no traceback is printed. The run has an
address space of AS_LIMIT_BYTES, so a runaway fails fast instead of eating the host: a chunk size of -6 once took
22 GB in 65 s. A /v1/models that redirects to another host is refused in one line, and nothing reaches that host.
"""

from __future__ import annotations

import re

import pytest

from batchscope.loadgen.run.control import FAIL_FAST_REQUESTS
from batchscope.testkit.bounded import BoundedLoad, bounded_load
from batchscope.testkit.hostile import HostileServer

pytestmark = pytest.mark.e2e

CONCURRENCY = 2
SPEC = {"input_tokens": 16, "output_tokens": 8, "timeout_s": 1.0, "duration_s": 2.5,
        "load": {"mode": "concurrency", "concurrency": CONCURRENCY}}
RSS_BOUND_MB = 300.0  # the load idles at ~85 MB; 1 MiB events and 16 MiB chunks at their caps stay far below
# each mode's case: long enough for a request to time out (timeout_s) and another to start
CASE_DURATION_S = 1.5
WALL_BOUND_S = 30.0  # 2.5 s of load, Locust's start and end, on 2 cores shared with other test runs
KILL_AFTER_S = 60.0  # a run still going then is killed (and fails the time bound)
AS_LIMIT_BYTES = 2 << 30  # address space: the load maps ~0.4 GB at rest
FAULT_LOG_LINES = 2  # one kind of fault: its first line, then its count when the run ends

# mode -> (exit status, the outcome of every request that was not cut by the run's end, what its error says)
CASES = {
    "ok": (0, "ok", None),
    "chunk-negative": (4, "protocol_error", "b'-6' is not hexadecimal digits (a size of 0 to 16 MiB, MAX_CHUNK_BYTES)"),
    "chunk-nonhex": (4, "protocol_error", "b'zz' is not hexadecimal digits (a size of 0 to 16 MiB, MAX_CHUNK_BYTES)"),
    "chunk-huge": (4, "protocol_error", "1000000000000 bytes is over the 16 MiB a chunk may have (MAX_CHUNK_BYTES)"),
    "error-body-endless": (4, "http_error", "a" * 200),
    "event-endless": (4, "protocol_error", "stream event: over 1 MiB without its blank line (MAX_EVENT_BYTES)"),
    "event-not-object": (4, "protocol_error", "stream event: a JSON array where vLLM sends an object"),
    "choices-not-list": (4, "protocol_error", "choices is a JSON object where vLLM sends a list of objects"),
    "usage-not-object": (4, "protocol_error", "usage: a JSON array where vLLM sends an object"),
    "events-after-done": (4, "protocol_error", "stream: an event after data: [DONE]"),
    "too-many-events": (4, "length_mismatch", "24 token events, more than usage.completion_tokens 8"),
    "too-few-events": (0, "ok", None),  # vLLM merges tokens into one event when its API server lags
    "retry-after-429": (4, "http_error", "slow down"),
    "storm-503": (4, "http_error", "overloaded"),
    # vLLM's admission check refusing all: its own outcome, no back-off, and a run that completed nothing fails
    "admission-503": (4, "rejected_busy", "The engine is currently busy"),
    "admission-event": (4, "rejected_busy", "The engine is currently busy"),
    "stall": (4, "timeout", "no complete response within 1.0 s"),
}


def load(tmp_path, host: str, **spec) -> BoundedLoad:
    return bounded_load(tmp_path, {**SPEC, **spec}, host, timeout_s=KILL_AFTER_S, address_space_bytes=AS_LIMIT_BYTES)


def fault_lines(output: str) -> list[str]:
    # a failure is a warning, an admission refusal (the server's policy working, not a fault) an INFO line
    return [line for line in output.splitlines()
            if re.search(r"(WARNING/batchscope\.loadgen: request|INFO/batchscope\.loadgen: requests? refused)", line)]


@pytest.mark.parametrize("mode", list(CASES))
def test_a_hostile_server_ends_every_request_in_one_outcome_in_bounded_time_and_memory(tmp_path, mode):
    status, outcome, reason = CASES[mode]
    with HostileServer(mode) as server:
        result = load(tmp_path, server.url, duration_s=CASE_DURATION_S)
    run, summary, output = result.run, result.summary, result.run.log()
    assert not run.timed_out and run.wall_s < WALL_BOUND_S, f"{run.wall_s:.1f} s\n{output[-3000:]}"
    assert run.peak_rss_mb < RSS_BOUND_MB, f"peak RSS {run.peak_rss_mb:.0f} MB"
    assert run.returncode == status and summary["balanced"], output[-3000:]
    assert "Traceback" not in output
    counted = {name: count for name, count in summary["outcomes"].items() if count}
    assert counted.get(outcome, 0) >= 1 and set(counted) <= {outcome, "aborted"}, counted
    assert counted.get("aborted", 0) <= CONCURRENCY  # only the requests in flight when the run ended
    ended = [record for record in result.records if record["outcome"] == outcome]
    if reason is not None:
        assert all(reason in record["error"] for record in ended), ended[0]["error"]
    # a line for the first fault of its kind and a count, never one per request
    assert len(fault_lines(output)) == (0 if outcome == "ok" else FAULT_LOG_LINES), fault_lines(output)


def test_too_few_events_are_ok_and_tpot_comes_from_usage(tmp_path):
    with HostileServer("too-few-events") as server:
        result = load(tmp_path, server.url)
    ok = [record for record in result.records if record["outcome"] == "ok"]
    assert ok and result.summary["tpot"]["count"] == result.summary["completed"] > 0
    for record in ok:  # two events for eight tokens: one gap, TPOT over usage's seven
        assert len(record["itl_s"]) == 1 and record["output_tokens"] == 8
        assert record["tpot_s"] == pytest.approx((record["last_token_s"] - record["first_token_s"]) / 7)


def test_a_429_with_retry_after_is_honoured_by_every_user(tmp_path):
    with HostileServer("retry-after-429") as server:
        result = load(tmp_path, server.url)
    sends = sorted(record["sent_s"] for record in result.records)
    assert {record["retry_after_s"] for record in result.records} == {2.0}
    # each user waits the 2 s asked after each 429: no more than CONCURRENCY sends in any 1.5 s
    assert len(sends) >= CONCURRENCY and all(
        later - earlier >= 1.5 for earlier, later in zip(sends, sends[CONCURRENCY:], strict=False)), sends
    assert server.seen["/v1/completions"] <= 1 + len(sends)  # the pre-flight's probe, then these


def test_a_503_storm_is_backed_off_and_ends_the_run_once_every_request_is_refused(tmp_path):
    with HostileServer("storm-503") as server:
        result = bounded_load(tmp_path, {**SPEC, "duration_s": 30}, server.url, timeout_s=KILL_AFTER_S,
                              address_space_bytes=AS_LIMIT_BYTES)
    summary, run = result.summary, result.run
    assert run.returncode == 4 and summary["balanced"], run.log()[-3000:]
    assert run.wall_s < 20, "stopped by the first refusals, not the 30 s duration"
    # backed off 0.1 s doubling (no Retry-After): about ten requests, where thousands a second went without
    assert FAIL_FAST_REQUESTS <= summary["started"] == summary["outcomes"]["http_error"] <= 20
    assert server.seen["/v1/completions"] == 1 + summary["started"]  # the pre-flight's probe, then these
    assert summary["failure"] == (f"all {summary['started']} finished requests were rejected with HTTP 503 "
                                  f"({result.records[0]['error']})")


def test_a_models_listing_redirecting_off_the_host_is_refused_in_one_line_and_not_followed(tmp_path):
    with HostileServer("ok", host="127.0.0.2") as elsewhere, \
            HostileServer("redirect-models", redirect_to=elsewhere.url) as server:
        result = load(tmp_path, server.url)
        lines = result.run.log().strip().splitlines()
    assert result.run.returncode == 2 and result.summary == {}
    assert lines == [f"batchscope load: error: server: GET {server.url}/v1/models answered HTTP 302, a redirect to "
                     f"'{elsewhere.url}/v1/models', and redirects are not followed: give --host the server's own URL"]
    assert sum(elsewhere.seen.values()) == 0  # nothing arrived at the other host


def test_a_models_listing_over_its_cap_is_refused_in_one_line_before_any_request(tmp_path):
    # the pre-flight reads every peer answer within a cap (batchscope.wire.bounded_read): 2 MiB is no model listing
    with HostileServer("models-huge") as server:
        result = load(tmp_path, server.url)
        lines = result.run.log().strip().splitlines()
        sent = server.seen["/v1/completions"]
    assert result.run.returncode == 2 and result.summary == {} and sent == 0
    assert lines == [f"batchscope load: error: model: 'auto' could not read {server.url}/v1/models (BodyTooLarge)"]
