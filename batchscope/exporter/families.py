"""Re-exposing scraped families: parse Prometheus text, keep one namespace, and map vLLM's renamed metrics.

Old vLLM names (batchscope.vllm.catalogue.RENAMES) are exposed under today's, the API server's own families as
batchscope_vllm_* (API_SERVER); docs/exporter.md says which and why.
"""

from __future__ import annotations

import math
import threading
from typing import Final

from prometheus_client.metrics_core import Metric

from batchscope.vllm import catalogue
from batchscope.vllm.catalogue import RENAMES
from batchscope.vllm.scrape import families as parse  # the full parse the incremental one falls back to


class IncrementalParser:
    """prometheus_client's parser, run again only when the exposition's shape changes.

    Between scrapes a server's /metrics keeps the same series in the same order and only the numbers move.
    The full parse of 2,000 series costs ~40 ms of CPU, so the parsed families are kept and, while every line
    up to its value is the same as last time, only the values are read. A new series, a new family or any
    line that doesn't split cleanly sends the text through the full parser again. One instance per upstream.
    """

    def __init__(self) -> None:
        self._shape: list[str] | None = None
        self._families: list[Metric] = []
        self._lock = threading.Lock()  # concurrent scrapes share the cache

    def parse(self, text: str) -> list[Metric]:
        shape, values = _split(text)
        with self._lock:
            if shape == self._shape:
                return _with_values(self._families, values)
            families = parse(text)
            self._shape, self._families = (shape, families) if _aligned(families, values) else (None, [])
            return families


def _split(text: str) -> tuple[list[str], list[str]]:
    """Each line up to its value (comments whole), and the sample values in order."""
    shape, values = [], []
    for line in text.splitlines():
        if not line or line[0] == "#":
            shape.append(line)
            continue
        key, _, value = line.rpartition(" ")
        shape.append(key)
        values.append(value)
    return shape, values


def _aligned(families: list[Metric], values: list[str]) -> bool:
    """Whether the parsed samples are the sample lines in order (so values can be swapped in by position)."""
    samples = [sample for family in families for sample in family.samples]
    if len(samples) != len(values):
        return False
    try:
        return all(sample.value == float(value) or (math.isnan(sample.value) and math.isnan(float(value)))
                   for sample, value in zip(samples, values, strict=True))
    except ValueError:
        return False


def _with_values(families: list[Metric], values: list[str]) -> list[Metric]:
    position = iter(values)
    fresh = []
    for family in families:
        copy = Metric(family.name, family.documentation, family.type, family.unit)
        copy.samples = [sample._replace(value=float(next(position))) for sample in family.samples]
        fresh.append(copy)
    return fresh


# vLLM API server family (prometheus_client's name, without _total) -> the name the exporter gives it
API_SERVER: Final = {
    "http_requests": "batchscope_vllm_http_requests",
    "process_cpu_seconds": "batchscope_vllm_process_cpu_seconds",
}


def contributed(parsed: list[Metric], prefix: str) -> list[Metric]:
    """The families a target contributes: those under its prefix and, for vLLM's ("vllm:"), its API server's
    HTTP and CPU counters under batchscope_vllm_ names."""
    own = [family for family in parsed if family.name.startswith(prefix)]
    if prefix != catalogue.PREFIX:
        return own
    return own + [_rename(family, family.name, API_SERVER[family.name]) for family in parsed
                  if family.name in API_SERVER]


def _renamed_base(name: str) -> str | None:
    """The old base name ``name`` belongs to (the family itself or its ``_created`` twin)."""
    for old in RENAMES:
        if name in (old, old + "_created"):
            return old
    return None


def map_renamed(families: list[Metric]) -> tuple[list[Metric], dict[str, str]]:
    """Expose old vLLM names under today's; return the families and the mappings applied (old -> new)."""
    present = {family.name for family in families}
    result: list[Metric] = []
    applied: dict[str, str] = {}
    for family in families:
        old = _renamed_base(family.name)
        if old is None:
            result.append(family)
            continue
        new_name = RENAMES[old] + family.name[len(old):]
        if new_name in present:
            continue  # the server already exposes the new name: keep only that
        result.append(_rename(family, old, RENAMES[old]))
        applied[old] = RENAMES[old]
    return result, applied


def _rename(family: Metric, old: str, new: str) -> Metric:
    renamed = Metric(new + family.name[len(old):], f"{family.documentation} (batchscope: exposed from {old})",
                     family.type, family.unit)
    renamed.samples = [sample._replace(name=new + sample.name[len(old):]) for sample in family.samples]
    return renamed
