"""Shared fixtures: real simulator and exporter processes on loopback, started with the CLI and polled until ready.

The simulator comes from the one launcher (batchscope.testkit.simulator); ``free_port`` and ``wait_until`` are
the testkit's, importable from here as the tests always have.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from batchscope.testkit.processes import Child, wait_until
from batchscope.testkit.simulator import SimProcess, start_simulator
from batchscope.wire.listen import free_port

__all__ = ["Exporter", "LoadResult", "SimProcess", "free_port", "only", "run_load", "samples", "start_simulator",
           "wait_until"]

@pytest.fixture
def simulator(tmp_path):
    """Factory: ``simulator(*flags)`` starts a server; every one started is stopped after the test."""
    started: list[SimProcess] = []

    def factory(*flags: str, **kwargs) -> SimProcess:
        sim = start_simulator(tmp_path, *flags, **kwargs)
        started.append(sim)
        return sim

    yield factory
    for sim in started:
        sim.stop()


@dataclass
class LoadResult:
    """What `batchscope load` left behind."""

    returncode: int
    output: str
    summary: dict
    records: list[dict]
    out_dir: Path


def run_load(tmp_path: Path, spec: dict, host: str, *extra: str, workers: int = 0,
             timeout_s: float = 300) -> LoadResult:
    """Run `batchscope load` to the end (bounded) and read its summary and records."""
    spec_path = tmp_path / f"spec-{time.monotonic_ns()}.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    out_dir = tmp_path / f"out-{time.monotonic_ns()}"
    result = subprocess.run(
        [sys.executable, "-m", "batchscope.cli", "load", "--spec", str(spec_path), "--host", host,
         "--workers", str(workers), "--out", str(out_dir), "--metrics-port", str(free_port()), *extra],
        capture_output=True, text=True, timeout=timeout_s,
    )
    output = result.stdout + result.stderr
    summary_path, records_path = out_dir / "summary.json", out_dir / "records.jsonl"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    records = [json.loads(line) for line in records_path.read_text().splitlines()] if records_path.exists() else []
    return LoadResult(result.returncode, output, summary, records, out_dir)


class Exporter:
    """A running `batchscope exporter` on a free loopback port, answering /metrics."""

    def __init__(self, tmp_path: Path, *flags: str) -> None:
        self.port = free_port()
        self.log = tmp_path / f"exporter-{self.port}.log"
        self.child = Child("exporter", [sys.executable, "-m", "batchscope.cli", "exporter", "--port", str(self.port),
                                        *flags], self.log)
        self.process = self.child.process
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        wait_until(self._answers, timeout_s=20, message="exporter up")

    def _answers(self) -> bool:
        try:
            return requests.get(self.url, timeout=5).status_code == 200
        except requests.ConnectionError:
            return False

    def scrape(self, accept: str = "application/openmetrics-text;version=1.0.0") -> dict:
        reply = requests.get(self.url, timeout=10, headers={"Accept": accept})
        assert reply.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        return samples(reply.text)

    def stop(self) -> None:
        self.child.stop(timeout_s=10)


def samples(text: str) -> dict[tuple, float]:
    """A text exposition as {(sample name, sorted labels): value}."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def only(prefix: str, values: dict) -> dict:
    return {k: v for k, v in values.items() if k[0].startswith(prefix)}


@pytest.fixture
def exporters(tmp_path):
    """Factory: ``exporters(*flags)`` starts an exporter; every one started is stopped after the test."""
    started: list[Exporter] = []

    def start(*flags: str) -> Exporter:
        exporter = Exporter(tmp_path, *flags)
        started.append(exporter)
        return exporter

    yield start
    for exporter in started:
        exporter.stop()
