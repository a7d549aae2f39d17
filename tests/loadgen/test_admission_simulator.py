"""`batchscope load` against the simulator's admission limits (`sim serve --max-num-queued-reqs / -tokens`): the
client's rejections are the increase of vLLM's rejection counter by reason, a closed-loop user pauses without
backing its sender off, the open loop keeps its seeded schedule, and the client's prefill backlog stays within the
token limit (docs/loadgen.md, "Back-off" and "Admission metrics")."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import requests

from batchscope.loadgen.run.sender import ADMISSION_PAUSE_S
from batchscope.vllm.catalogue import ADMISSION_REJECTION_REASONS, ADMISSION_REJECTIONS
from batchscope.vllm.scrape import families, read_text
from batchscope.wire.listen import free_port
from batchscope.workload import poisson
from tests.conftest import run_load

pytestmark = pytest.mark.e2e

BACKLOG = "batchscope_client_prefill_backlog_tokens"


def rejections(url: str) -> dict[str, float]:
    """vLLM's admission counter by reason, read from the server's /metrics."""
    text = read_text(requests.Session(), url + "/metrics", timeout_s=5)
    found = dict.fromkeys(ADMISSION_REJECTION_REASONS, 0.0)
    for family in families(text):
        for sample in family.samples:
            if sample.name == ADMISSION_REJECTIONS.exposed_name:
                found[sample.labels["reason"]] += sample.value
    return found


def counted(sim, tmp_path: Path, spec: dict, *extra: str):
    """Run the load; return its result and the increase of the simulator's counter over it, by reason."""
    before = rejections(sim.url)
    result = run_load(tmp_path, spec, sim.url, *extra)
    after = rejections(sim.url)
    return result, {reason: after[reason] - before[reason] for reason in after}


def unknown_at_the_stop(records: list[dict], truth: Path) -> int:
    """Requests the run's end aborted that the simulator never took in (absent from its ground-truth log): its
    pre-flight check may have refused, and counted, one whose 503 the client had not read yet. The only
    rejections the client cannot know of."""
    admitted = {json.loads(line)["request_id"] for line in truth.read_text().splitlines()}
    return sum(1 for r in records if r["outcome"] == "aborted" and r["sent_s"] is not None
               and r["request_id"] not in admitted)


def assert_counted_as_vllm_counts(result, increase: dict[str, float], truth: Path, reason: str) -> int:
    """Every request ends in one outcome; the client's rejections by reason are the counter's increase, exactly
    but for a refusal still unread at the stop; the summary's window figure is its records'. Returns the count."""
    summary, records = result.summary, result.records
    assert result.returncode == 0 and "Traceback" not in result.output, result.output[-3000:]
    assert summary["balanced"] and summary["started"] == sum(summary["outcomes"].values()) == len(records)
    assert summary["outcomes"]["http_error"] == 0 and summary["failure"] is None
    rejected = [r for r in records if r["outcome"] == "rejected_busy"]
    assert rejected and {r["reject_reason"] for r in rejected} == {reason}
    assert summary["outcomes"]["rejected_busy"] == len(rejected)
    unknown = unknown_at_the_stop(records, truth)
    other = next(r for r in ADMISSION_REJECTION_REASONS if r != reason)
    assert increase[other] == 0
    assert len(rejected) <= increase[reason] <= len(rejected) + unknown, (len(rejected), increase, unknown)
    start, end = summary["window_start_s"], summary["window_start_s"] + summary["effective_duration_s"]
    in_window = sum(1 for r in rejected if start <= r["end_s"] <= end)
    assert summary["admission_rejections"] == {reason: in_window, other: 0}
    print(f"{reason}: client {len(rejected)} (window {in_window}), simulator +{increase[reason]:.0f}, "
          f"unknown at the stop {unknown}; {len(records)} requests, share {summary['rejected_share']:.3f}")
    return len(rejected)


def test_a_closed_loop_over_max_num_queued_reqs_counts_vllms_rejections_and_pauses_only_the_user(
        simulator, tmp_path):
    users, cap, duration = 8, 3, 3.0
    truth = tmp_path / "truth.jsonl"
    sim = simulator("--profile", "tiny", "--max-num-queued-reqs", str(cap), "--ground-truth-log", str(truth))
    spec = {"input_tokens": 64, "output_tokens": 32, "timeout_s": 10, "seed": 3, "warmup_s": 0.5,
            "duration_s": duration, "load": {"mode": "concurrency", "concurrency": users}}
    result, increase = counted(sim, tmp_path, spec)
    count = assert_counted_as_vllm_counts(result, increase, truth, "max_num_queued_reqs")
    records = result.records
    refused = np.sort([r["sent_s"] for r in records if r["outcome"] == "rejected_busy"])
    # a turned-away user waits ADMISSION_PAUSE_S before its next try: of any users + 1 rejections in a row, two are
    # one user's, so they span at least that (at most 10 tries a user a second; a spinning user: ~1 ms apart)
    assert np.all(refused[users:] - refused[:-users] >= ADMISSION_PAUSE_S)
    # and no more: with no sender-wide back-off (0.1 s doubling to 5 s) the users over the cap keep trying at
    # about their pause's pace, (users - cap) / 0.1 s = 50/s (loosely: 2 shared cores)
    span = refused[-1] - refused[0]
    assert count / span > 0.5 * (users - cap) / ADMISSION_PAUSE_S, count / span
    sends = np.sort([r["sent_s"] for r in records if r["sent_s"] is not None])
    assert np.diff(sends).max() < 0.1  # the admitted keep flowing: nobody held the whole sender back


def test_an_open_poisson_loop_over_max_num_queued_reqs_keeps_its_schedule_and_counts_exactly(simulator, tmp_path):
    # seed 24's schedule has 238-241 arrivals in the 4 s window (59.5-60.25/s) wherever the dispatcher starts in
    # the run's first 0.2 s: the schedule itself lands within 1% of the rate, the check allows 2%
    rate, seed, warmup, duration = 60.0, 24, 0.5, 4.0
    truth = tmp_path / "truth.jsonl"
    sim = simulator("--profile", "tiny", "--max-num-queued-reqs", "3", "--ground-truth-log", str(truth))
    spec = {"input_tokens": 64, "output_tokens": 64, "timeout_s": 10, "seed": seed, "warmup_s": warmup,
            "duration_s": duration, "load": {"mode": "poisson", "rate": rate}}
    result, increase = counted(sim, tmp_path, spec)
    assert_counted_as_vllm_counts(result, increase, truth, "max_num_queued_reqs")
    summary, records = result.summary, result.records
    assert summary["refused_arrivals"] == 0  # no arrival dropped for a back-off
    scheduled = np.sort([r["scheduled_s"] for r in records])
    planned = poisson.before(warmup + duration, rate, seed)
    offsets = scheduled - scheduled[0] + planned[0]
    assert len(planned) - 2 <= len(offsets) <= len(planned)  # the stop may cut the last arrival or two
    assert offsets == pytest.approx(planned[:len(offsets)], abs=1e-5)
    start = summary["window_start_s"]
    sent_rate = np.count_nonzero((scheduled >= start) & (scheduled < start + duration)) / duration
    print(f"sent {sent_rate:.2f}/s against the spec's {rate}/s")
    assert sent_rate == pytest.approx(rate, rel=0.02)


class BacklogReads:
    """Reads the load generator's client /metrics every ``interval_s`` while a run goes on: its prefill backlog."""

    def __init__(self, port: int, interval_s: float = 0.02) -> None:
        self.url, self.interval_s = f"http://127.0.0.1:{port}/metrics", interval_s
        self.values: list[float] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> BacklogReads:
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._done.set()
        self._thread.join(timeout=10)

    def _read(self) -> None:
        session = requests.Session()
        while not self._done.wait(self.interval_s):
            try:
                text = read_text(session, self.url, timeout_s=2)
            except Exception:  # noqa: BLE001 - not up yet, or gone: the reads taken are what counts
                continue
            self.values += [s.value for f in families(text) for s in f.samples if s.name == BACKLOG]


def test_max_num_queued_tokens_rejections_are_counted_and_the_clients_backlog_stays_within_it(simulator, tmp_path):
    # max_num_seqs 2 runs two, the rest wait in prefill: vLLM admits while the backlog is below T, so it holds at
    # most 3 prompts (768 = T); the client sees those and the one user turned away, whose fate it learns only from
    # the answer: 4 prompts, T + one prompt (6 users: 2 running, 3 waiting, 1 refused at a time). A read may also
    # catch a first token sent and not read yet, or a second user in transit: 1,280 in 1 of ~60 reads, once in 6 runs
    prompt, limit, users = 256, 768, 6
    truth, port = tmp_path / "truth.jsonl", free_port()
    sim = simulator("--profile", "tiny", "--max-num-seqs", "2", "--max-num-queued-tokens", str(limit),
                    "--ground-truth-log", str(truth))
    spec = {"input_tokens": prompt, "output_tokens": 32, "timeout_s": 10, "seed": 3, "warmup_s": 0.5,
            "duration_s": 3.0, "load": {"mode": "concurrency", "concurrency": users}}
    with BacklogReads(port) as reads:
        result, increase = counted(sim, tmp_path, spec, "--metrics-port", str(port))
    assert_counted_as_vllm_counts(result, increase, truth, "max_num_queued_tokens")
    values = np.array(reads.values)
    print(f"client backlog over {len(values)} reads: max {values.max():.0f}, median {np.median(values):.0f} "
          f"(limit {limit}, + one prompt {limit + prompt})")
    assert len(values) >= 20 and values.max() >= limit  # read live, at the limit while users wait
    assert np.median(values) <= limit and np.mean(values > limit + prompt) <= 0.1
