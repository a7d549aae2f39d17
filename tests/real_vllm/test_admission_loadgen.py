"""The load generator against a real vLLM whose admission check is on (`--max-num-queued-reqs`): an open loop
above the cap gets vLLM's 503s as rejected_busy, exactly as many as vLLM counts in its rejection counter, every
request has one outcome, and the arrival schedule is kept (no back-off: the offered load is the spec's).

The tier's queue-knob server (conftest's queue_knobs_vllm: four running, at most 8 waiting + running; its token
limit is out of reach of 8 prompts of 96 tokens), about 10 s of load.
"""

from __future__ import annotations

import numpy as np
import pytest

from batchscope.vllm.catalogue import ADMISSION_REJECTIONS
from batchscope.vllm.scrape import sample_sums
from tests.conftest import run_load

RATE, SEED, WARMUP_S, DURATION_S = 8.0, 25, 1.0, 10.0  # the seed's schedule has 80 arrivals in the window: 8.0/s
LOAD = {"model": "auto", "endpoint": "completions", "input_tokens": 96, "output_tokens": 64, "stream": True,
        "timeout_s": 60, "seed": SEED, "warmup_s": WARMUP_S, "duration_s": DURATION_S,
        "load": {"mode": "poisson", "rate": RATE}}


def rejections(metrics_text: str) -> float:
    return sample_sums(metrics_text).get(ADMISSION_REJECTIONS.name + "_total", 0.0)


def test_an_open_loop_above_the_cap_counts_vllms_rejections_exactly_and_keeps_its_rate(queue_knobs_vllm, tmp_path):
    before = rejections(queue_knobs_vllm.metrics())
    result = run_load(tmp_path, LOAD, queue_knobs_vllm.url)
    rejected_by_vllm = rejections(queue_knobs_vllm.metrics()) - before
    summary, records = result.summary, result.records
    assert "Traceback" not in result.output and summary, result.output[-3000:]
    assert summary["balanced"] and summary["started"] == sum(summary["outcomes"].values()) == len(records)
    rejected = [r for r in records if r["outcome"] == "rejected_busy"]
    assert rejected and {r["reject_reason"] for r in rejected} == {"max_num_queued_reqs"}
    assert len(rejected) == rejected_by_vllm, (len(rejected), rejected_by_vllm)
    assert summary["outcomes"]["http_error"] == 0 and summary["refused_arrivals"] == 0
    start, span = summary["window_start_s"], summary["effective_duration_s"]
    scheduled = np.array([r["scheduled_s"] for r in records])
    sent_rate = np.count_nonzero((scheduled >= start) & (scheduled < start + span)) / span
    print(f"rejections: load generator {len(rejected)}, vLLM {rejected_by_vllm:.0f}; of {len(records)} requests; "
          f"sent {sent_rate:.3f}/s, spec {RATE}/s; share in window {summary['rejected_share']:.3f}")
    assert sent_rate == pytest.approx(RATE, rel=0.02)
