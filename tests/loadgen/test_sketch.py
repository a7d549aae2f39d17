"""The ITL sketch (batchscope/loadgen/figures/sketch.py) against exact percentiles of recorded gaps, and its memory
bound."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from batchscope.loadgen.figures.sketch import ALPHA, ExactGaps, GapSketch
from batchscope.loadgen.figures.summary import Distribution

# per-request ITL gaps recorded by the load generator against the simulator (tiny profile, 256 streams, on a busy
# machine): 32 requests of a capacity bench run and 16 of a run slowed down by a profiler, with the zeros of
# chunks read together and the long gaps of stalled streams
RECORDED = Path(__file__).with_name("recorded_gaps.json")


def recorded() -> list[np.ndarray]:
    return [np.asarray(gaps) for gaps in json.loads(RECORDED.read_text())]


def assert_within_error(sketch: GapSketch, gaps: np.ndarray) -> None:
    exact = np.percentile(gaps, [50, 90, 99])
    estimates = sketch.quantiles([0.5, 0.9, 0.99])
    for estimate, truth in zip(estimates, exact, strict=True):
        assert estimate == pytest.approx(truth, rel=ALPHA, abs=1e-12)


def test_recorded_gaps_p50_p90_p99_within_the_stated_error():
    requests = recorded()
    sketch = GapSketch()
    for gaps in requests:
        sketch.add(gaps)
    everything = np.concatenate(requests)
    assert sketch.count == everything.size > 10_000
    assert_within_error(sketch, everything)
    dist = Distribution.of_sketch(sketch)
    assert dist.count == everything.size and dist.mean == pytest.approx(everything.mean())


@pytest.mark.parametrize("seed", range(5))
def test_heavy_tails_zeros_and_extremes_stay_within_the_error(seed):
    rng = np.random.default_rng(seed)
    gaps = np.concatenate((rng.lognormal(np.log(0.02), 1.5, 20_000), np.zeros(rng.integers(0, 12_000)),
                           rng.uniform(1e-6, 1e-5, 500), [5e-7, 2e3]))
    sketch = GapSketch()
    for part in np.array_split(rng.permutation(gaps), 97):
        sketch.add(part)
    assert_within_error(sketch, gaps)


def test_merged_sketches_answer_as_one_and_memory_is_fixed():
    rng = np.random.default_rng(7)
    parts = [rng.exponential(0.01, 5_000) for _ in range(4)]
    merged, whole = GapSketch(), GapSketch()
    for part in parts:
        one = GapSketch()
        one.add(part)
        merged.merge(one)
        whole.add(part)
    assert np.array_equal(merged.counts, whole.counts) and merged.count == whole.count
    size = whole.counts.nbytes
    whole.add(rng.exponential(0.01, 1_000_000))
    assert whole.counts.nbytes == size < 40_000


def test_exact_gaps_answer_what_the_exact_distribution_does():
    requests = recorded()
    pool = ExactGaps()
    assert Distribution.of_sketch(pool) == Distribution.of([])
    for gaps in requests:
        pool.add(gaps)
    assert Distribution.of_sketch(pool) == Distribution.of(np.concatenate(requests))  # to the last bit
