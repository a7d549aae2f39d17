"""The order of the capacity bench's runs on one simulator: the reference and the load generator alternating in a
closed loop, then at Poisson arrivals, then the memory run; each run's bias samples joined as it ends."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from capacity.loadgen_runs import MemoryResult, measure_loadgen, measure_memory
from capacity.reference_run import measure_reference
from capacity.server import Server
from capacity.truth import Bias, bias_of, match
from capacity.windows import Load, Window, pooled


@dataclass
class Results:
    """Runs by client key (ref, gen, ref_poisson, gen_poisson), their bias samples, and the memory run."""

    runs: dict[str, list[Window]] = field(default_factory=dict)
    pairs: dict[str, list[list[tuple[dict, dict]]]] = field(default_factory=dict)  # per run
    unmatched: dict[str, list[int]] = field(default_factory=dict)  # per run
    memory: MemoryResult | None = None

    def window(self, key: str) -> Window:
        return pooled(self.runs[key])

    def memory_run(self) -> MemoryResult:
        assert self.memory is not None, "the memory run is measured before any report"
        return self.memory

    def bias(self, key: str) -> Bias:
        """Over every run of the client pooled."""
        pooled_pairs = [pair for run in self.pairs[key] for pair in run]
        return bias_of(self.window(key).label, pooled_pairs, sum(self.unmatched[key]))

    def run_biases(self, key: str) -> list[Bias]:
        return [bias_of(self.window(key).label, pairs, unmatched)
                for pairs, unmatched in zip(self.pairs[key], self.unmatched[key], strict=True)]


def run_phase(server: Server, results: Results, key: str, measure: Callable[[], tuple[Window, list[dict]]]) -> None:
    """One client on an idle server; its bias samples from the ground-truth lines the phase wrote."""
    offset = server.truth_offset()
    window, timed = measure()
    server.wait_idle()
    pairs = match(timed, server.truth_since(offset))
    results.runs.setdefault(key, []).append(window)
    results.pairs.setdefault(key, []).append(pairs)
    results.unmatched.setdefault(key, []).append(len(timed) - len(pairs))


def run_phases(args: argparse.Namespace, workdir: Path) -> Results:
    results = Results()
    server = Server.start(workdir, args.profile)
    try:
        closed = Load(args.streams)
        for run in range(1, args.repeat + 1):  # alternating, so that drifting contention hits both clients
            run_phase(server, results, "ref", partial(measure_reference, server, args, workdir, closed, args.warmup,
                                                      run=run))
            request_s = args.streams * args.output_tokens / max(results.window("ref").tokens_per_s, 1.0)
            tail = args.tail if args.tail is not None else 1.5 * request_s + 2
            run_phase(server, results, "gen", partial(measure_loadgen, server, args, workdir, closed, args.warmup,
                                                      tail, run=run))
        if not args.no_poisson:  # at the closed loop's request rate (the reference's, pooled so far)
            poisson = Load(args.streams, results.window("ref").tokens_per_s / args.output_tokens)
            warmup = args.warmup + request_s
            for run in range(1, args.repeat + 1):
                run_phase(server, results, "ref_poisson", partial(measure_reference, server, args, workdir,
                                                                  poisson, warmup, run=run))
                run_phase(server, results, "gen_poisson", partial(measure_loadgen, server, args, workdir,
                                                                  poisson, warmup, tail, run=run))
        results.memory = measure_memory(server, args, workdir)
    finally:
        server.sim.stop()
    return results
