"""Median and spread of each figure over the repeated runs of the capacity bench (targets are judged on medians)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from batchscope.testkit.report import table
from capacity.phases import Results

CLIENT_PAIRS = (("ref", "gen"), ("ref_poisson", "gen_poisson"))


@dataclass(frozen=True)
class Spread:
    """One figure over the runs: median, smallest, largest."""

    median: float
    low: float
    high: float
    runs: int

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        array = np.asarray(values, dtype=float)
        return cls(float(np.median(array)), float(array.min()), float(array.max()), int(array.size))

    def text(self, fmt: str, unit: str = "") -> str:
        return f"{self.median:{fmt}}{unit} ({self.low:{fmt}}-{self.high:{fmt}})"


def figures(results: Results) -> dict[str, dict[str, Spread]]:
    """Per client key: tokens/s, tokens per CPU-second, client CPU, TTFT and E2E bias; per pair: the ratio."""
    out: dict[str, dict[str, Spread]] = {}
    for key, runs in results.runs.items():
        biases = results.run_biases(key)
        out[key] = {
            "tokens_per_s": Spread.of([w.tokens_per_s for w in runs]),
            "tokens_per_cpu_s": Spread.of([w.tokens_per_cpu_s for w in runs]),
            "client_cpu": Spread.of([w.client_cpu for w in runs]),
            "ttft_bias_p50_ms": Spread.of([b.ttft.p50 for b in biases]),
            "ttft_bias_p99_ms": Spread.of([b.ttft.p99 for b in biases]),
            "e2e_bias_p99_ms": Spread.of([b.e2e.p99 for b in biases]),
        }
    for ref, gen in CLIENT_PAIRS:
        if ref in results.runs and gen in results.runs:
            ratios = [g.tokens_per_cpu_s / r.tokens_per_cpu_s
                      for r, g in zip(results.runs[ref], results.runs[gen], strict=False)]
            out[gen]["ratio_to_reference"] = Spread.of(ratios)
    return out


def spread_table(results: Results) -> str:
    header = ["client, load", "runs", "tok/s", "tok/s per core", "client CPU", "ratio to ref", "TTFT bias p50 ms",
              "TTFT bias p99 ms", "E2E bias p99 ms"]
    rows = []
    for key, spread in figures(results).items():
        ratio = spread.get("ratio_to_reference")
        rows.append([results.window(key).label, str(spread["tokens_per_s"].runs), spread["tokens_per_s"].text(",.0f"),
                     spread["tokens_per_cpu_s"].text(",.0f"), spread["client_cpu"].text(".0%"),
                     ratio.text(".2f", "x") if ratio else "-", spread["ttft_bias_p50_ms"].text(".2f"),
                     spread["ttft_bias_p99_ms"].text(".2f"), spread["e2e_bias_p99_ms"].text(".2f")])
    return table(header, rows)
