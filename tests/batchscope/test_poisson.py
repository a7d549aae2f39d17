"""The one Poisson generator (batchscope/workload/poisson.py): every reader of a seed gets the same arrivals."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from batchscope.loadgen.run.sender import arrival_times
from batchscope.loadgen.spec import load_spec
from batchscope.simulator.config import Deployment, ServeConfig
from batchscope.simulator.virtual import poisson_workload
from batchscope.tuner.whatif import simulate
from batchscope.workload import poisson


def test_the_nth_arrival_does_not_depend_on_how_many_are_read() -> None:
    # across block edges: 700 arrivals span three blocks of 256
    stream = np.array(list(itertools.islice(poisson.times(8.0, 3), 700)))
    assert np.array_equal(poisson.first(700, 8.0, 3), stream)
    assert np.array_equal(poisson.first(300, 8.0, 3), stream[:300])
    end = float(stream[600])
    assert np.array_equal(poisson.before(end, 8.0, 3), stream[stream < end])
    assert np.all(np.diff(stream) > 0) and np.mean(np.diff(stream)) == pytest.approx(1 / 8.0, rel=0.1)


def test_the_load_generators_sender_the_simulators_workload_and_a_what_if_run_send_at_the_same_times() -> None:
    spec = load_spec(None, ["input_tokens=64", "output_tokens=4", "seed=11", "load.mode=poisson", "load.rate=20",
                            "warmup_s=0", "duration_s=5"])
    sender = np.array(list(itertools.takewhile(lambda t: t < 5.0, arrival_times(spec, 0.0, 0, 1))))
    workload = np.array([request.arrival for request in poisson_workload(20.0, sender.size, 64, 4, seed=11)])
    engine = Deployment(ServeConfig(model="m", profile="tiny", max_model_len=1024)).new_engine()
    run = simulate(spec, engine, repeat=0)
    assert sender.size > 50 and np.array_equal(workload, sender)
    assert run.issued + run.refused == sender.size and len(run.records) > 50
    assert {record.arrival for record in run.records} <= set(sender.tolist())  # the ones back before the stop


def test_a_shared_load_gives_each_sender_its_own_stream_at_its_share_of_the_rate() -> None:
    streams = [np.array(list(itertools.islice(poisson.times(50.0, 1, sender=s, senders=2, start=100.0), 2000)))
               for s in range(2)]
    for stream in streams:
        assert stream[0] > 100.0 and np.mean(np.diff(stream)) == pytest.approx(2 / 50.0, rel=0.1)
    assert not np.allclose(streams[0][:10], streams[1][:10])
