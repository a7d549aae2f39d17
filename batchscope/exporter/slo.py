"""The latency targets (SLOs) the recording rules and alerts measure attainment against: batchscope_slo_target_seconds.

Per metric, the load generator's target, else the exporter's flag, else none; ``le`` is the target rounded up to
a bound of vLLM's buckets. The rule and its reasons: docs/exporter.md, "SLO targets".
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from batchscope.vllm.buckets import ITL_BUCKETS, TTFT_BUCKETS

log = logging.getLogger("batchscope.exporter")
# vllm:time_to_first_token_seconds and vllm:request_time_per_output_token_seconds (whose bounds are ITL's)
BUCKETS = {"ttft": TTFT_BUCKETS, "tpot": ITL_BUCKETS}
CLIENT_TARGETS = "batchscope_client_slo_target_seconds"
MAX_TARGET_S = 86_400.0  # as the load spec's bound: a day
HELP = ("Latency target per metric (ttft, tpot), seconds, from the load generator's spec (source load_spec), else "
        "the exporter's --slo-*-seconds (source flag). le: the bound of vLLM's histogram buckets attainment counts "
        "against, the target rounded up to the next bound when it is none (+Inf beyond the largest).")


@dataclass(frozen=True)
class SloFlags:
    """The exporter's own targets, seconds (None: not given)."""

    ttft_s: float | None = None
    tpot_s: float | None = None


def bucket_bound(metric: str, target_s: float) -> float:
    """The smallest bound of vLLM's ``metric`` buckets at or above ``target_s`` (+Inf beyond the largest)."""
    bounds = BUCKETS[metric]
    index = bisect.bisect_left(bounds, target_s)
    return bounds[index] if index < len(bounds) else math.inf


def client_targets(loadgen_families: Iterable[Metric]) -> dict[str, float]:
    """metric -> the load generator's target at this scrape (its first run's, should several be exposed)."""
    found: dict[str, float] = {}
    for family in loadgen_families:
        if family.name == CLIENT_TARGETS:
            for sample in family.samples:
                if sample.labels.get("metric") in BUCKETS and not math.isnan(sample.value) and sample.value > 0:
                    found.setdefault(sample.labels["metric"], sample.value)
    return found


class SloGauge:
    """Builds batchscope_slo_target_seconds at each scrape; logs a flag the load generator overrides once per value."""

    def __init__(self, flags: SloFlags) -> None:
        self._flags = {"ttft": flags.ttft_s, "tpot": flags.tpot_s}
        self._logged: set[tuple[str, float]] = set()

    def family(self, loadgen_families: Iterable[Metric]) -> GaugeMetricFamily:
        family = GaugeMetricFamily("batchscope_slo_target_seconds", HELP, labels=["metric", "le", "source"])
        spec = client_targets(loadgen_families)
        for metric, flag in self._flags.items():
            given = spec.get(metric)
            if given is not None and flag is not None and flag != given:
                self._log_override(metric, flag, given)
            target, source = (given, "load_spec") if given is not None else (flag, "flag")
            if target is not None:
                family.add_metric([metric, floatToGoString(bucket_bound(metric, target)), source], target)
        return family

    def _log_override(self, metric: str, flag: float, given: float) -> None:
        if (metric, given) not in self._logged:
            self._logged.add((metric, given))
            log.warning("--slo-%s-seconds %g: the load generator's spec sets %g, which its goodput counter judges "
                        "by; using the spec's", metric, flag, given)
