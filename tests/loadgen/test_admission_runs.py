"""`batchscope load` end to end against a server with vLLM's admission check (a queue cap answering its 503):
rejections counted exactly and apart, the closed loop's bounded pause, the open loop's schedule kept, and any
other 503 still backed off (docs/loadgen.md, "Back-off")."""

from __future__ import annotations

import asyncio
import csv
import json

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from batchscope.testkit.hostile import DONE, STREAM_HEAD, HostileServer, Writer, event, json_reply, token, usage
from batchscope.vllm import admission
from batchscope.workload import poisson
from tests.conftest import run_load

pytestmark = pytest.mark.e2e

TOKEN_STEP_S = 0.02  # one token per 20 ms: a request of OUTPUT tokens holds its slot 0.16 s
OUTPUT = 8
BASE = {"input_tokens": 16, "output_tokens": OUTPUT, "timeout_s": 5, "seed": 3}


class CappedServer(HostileServer):
    """Streams well while fewer than ``cap`` requests are in flight, else answers a 503: vLLM's admission one
    (``proxy`` False) or a bare one, as a proxy in front of a full server would. Counts what it refused."""

    def __init__(self, cap: int, proxy: bool = False) -> None:
        super().__init__("ok")
        self.cap, self.proxy = cap, proxy
        self.in_flight = self.refused = 0

    async def _answer(self, method: str, path: str, body: dict, writer: Writer) -> bool:
        if not (path == "/v1/completions" and method == "POST" and body.get("stream")):
            return await super()._answer(method, path, body, writer)
        if self.in_flight >= self.cap:  # vLLM's rule: waiting + running + 1 > max_num_queued_reqs
            self.refused += 1
            refusal = {"error": {"message": "no healthy upstream", "code": 503}} if self.proxy else \
                admission.error_body("max_num_queued_reqs")
            writer.write(json_reply("503 Service Unavailable", refusal))
            await writer.drain()
            return True
        self.in_flight += 1
        try:
            writer.write(STREAM_HEAD)
            for _ in range(OUTPUT):
                await asyncio.sleep(TOKEN_STEP_S)
                writer.write(event(token()))
                await writer.drain()
            writer.write(event(usage(len(body.get("prompt") or []), OUTPUT)) + DONE)
            await writer.drain()
        finally:
            self.in_flight -= 1
        return True


def assert_balanced(result) -> None:
    summary = result.summary
    assert summary["balanced"] and summary["started"] == sum(summary["outcomes"].values()) == len(result.records)
    assert "Traceback" not in result.output


def test_a_closed_loop_over_the_cap_counts_each_rejection_and_pauses_only_the_user_refused(tmp_path):
    users, cap = 6, 2
    with CappedServer(cap) as server:
        result = run_load(tmp_path, {**BASE, "warmup_s": 0.5, "duration_s": 3,
                                     "load": {"mode": "concurrency", "concurrency": users}}, server.url)
    summary, records = result.summary, result.records
    assert result.returncode == 0, result.output[-3000:]
    assert_balanced(result)
    rejected = [r for r in records if r["outcome"] == "rejected_busy"]
    assert len(rejected) == summary["outcomes"]["rejected_busy"] == server.refused > 0
    assert {r["reject_reason"] for r in rejected} == {"max_num_queued_reqs"} and summary["failure"] is None
    assert summary["admission_rejections"]["max_num_queued_reqs"] > 0 and 0 < summary["rejected_share"] < 1
    assert set(summary["outcomes"]) >= {"ok"} and summary["outcomes"]["http_error"] == 0
    sends = np.sort([r["sent_s"] for r in records])
    # each user pauses ADMISSION_PAUSE_S (0.1 s) after its rejection: of any users + 1 sends in a row, two are one
    # user's, so they span at least that (a spinning user would send every round trip, ~1 ms)
    assert np.all(sends[users:] - sends[:-users] >= 0.1)
    # and no more: a sender-wide back-off (0.1 s doubling up to 5 s) would leave a few requests per user, where
    # a 0.1 s pause sends several a second (loose: 2 shared cores)
    per_user_per_s = len(records) / users / (sends[-1] - sends[0])
    assert 3 < per_user_per_s <= 10.5, per_user_per_s
    assert_shown_apart(result, server.refused)


def assert_shown_apart(result, refused: int) -> None:
    """The client /metrics and Locust's tables count the rejections on their own, not among the errors."""
    text = (result.out_dir / "metrics.prom").read_text()
    samples = {(s.name, s.labels.get("reason") or s.labels.get("outcome")): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("batchscope_client_admission_rejections_total", "max_num_queued_reqs")] == refused
    assert samples[("batchscope_client_requests_total", "rejected_busy")] == refused
    assert samples[("batchscope_client_prefill_backlog_tokens", None)] == 0  # nothing in flight at the end
    entries = {(e["method"], e["name"]): e for e in json.loads((result.out_dir / "locust_stats.json").read_text())}
    assert entries[("REJECTED", "default")]["num_requests"] == entries[("REJECTED", "default")]["num_failures"] \
        == refused
    assert entries[("REQUEST", "default")]["num_failures"] == 0
    with open(result.out_dir / "locust_failures.csv") as table:
        failures = {row["Error"]: int(row["Occurrences"]) for row in csv.DictReader(table)}
    assert failures == {"OutcomeError('rejected_busy max_num_queued_reqs')": refused}, failures


def schedule(rate: float, seed: int, span_s: float) -> np.ndarray:
    return poisson.before(span_s, rate, seed)


@pytest.mark.parametrize("proxy", [False, True], ids=["admission-503", "other-503"])
def test_an_open_loop_keeps_its_schedule_through_admission_rejections_and_backs_off_from_any_other_503(
        tmp_path, proxy):
    rate, seed, warmup, duration = 40.0, 5, 0.5, 5.0
    spec = {**BASE, "seed": seed, "warmup_s": warmup, "duration_s": duration,
            "load": {"mode": "poisson", "rate": rate}}
    with CappedServer(cap=3, proxy=proxy) as server:
        result = run_load(tmp_path, spec, server.url)
    summary, records = result.summary, result.records
    assert_balanced(result)
    assert server.refused > 0
    if proxy:  # the old rule: the sender backs off, dropping arrivals meanwhile
        assert summary["refused_arrivals"] > 0 and summary["outcomes"]["http_error"] == server.refused
        assert summary["outcomes"]["rejected_busy"] == 0
        return
    assert summary["outcomes"]["rejected_busy"] == server.refused and summary["refused_arrivals"] == 0
    # every arrival of the seeded schedule was sent, in order, none dropped: the offered load is the spec's
    scheduled = np.sort([r["scheduled_s"] for r in records])
    planned = schedule(rate, seed, warmup + duration)
    offsets = scheduled - scheduled[0] + planned[0]
    assert len(planned) - 2 <= len(offsets) <= len(planned)  # the run's stop may cut the last arrival or two
    assert offsets == pytest.approx(planned[:len(offsets)], abs=1e-5)  # Unix seconds: ~0.2 µs a step
    start = summary["window_start_s"]
    in_window = np.count_nonzero((scheduled >= start) & (scheduled < start + summary["effective_duration_s"]))
    sent_rate = in_window / summary["effective_duration_s"]
    assert sent_rate == pytest.approx(rate, rel=0.02), sent_rate
