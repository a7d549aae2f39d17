"""The simulator of the capacity bench: alone on SERVER_CORE, writing its ground-truth log, asked for its stats."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import requests

from batchscope.testkit.processes import Child, wait_until
from batchscope.testkit.simulator import SimProcess, start_simulator
from capacity.settings import DRAIN_TIMEOUT_S, HTTP_TIMEOUT_S, SERVER_CORE, SERVER_FLAGS, STARTUP_TIMEOUT_S


@dataclass
class Server:
    """The simulator on SERVER_CORE (started by the testkit launcher), with its ground-truth log."""

    sim: SimProcess
    truth_path: Path

    @classmethod
    def start(cls, workdir: Path, profile: str) -> Server:
        truth_path = workdir / "ground_truth.jsonl"
        sim = start_simulator(workdir, "--profile", profile, *SERVER_FLAGS, "--ground-truth-log", str(truth_path),
                              model="bench-model", deadline_s=STARTUP_TIMEOUT_S, core=SERVER_CORE, new_session=True,
                              log_name="simulator.log")
        return cls(sim, truth_path)

    @property
    def url(self) -> str:
        return self.sim.url

    @property
    def child(self) -> Child:
        return self.sim.child

    def stats(self) -> dict:
        reply = requests.get(self.url + "/sim/stats", timeout=HTTP_TIMEOUT_S)
        reply.raise_for_status()
        return reply.json()

    def open_requests(self) -> int:
        stats = self.stats()
        return stats["num_requests_running"] + stats["num_requests_waiting"]

    def wait_idle(self) -> None:
        """Until the previous phase's streams are gone, so phases never overlap."""
        wait_until(lambda: self.open_requests() == 0, DRAIN_TIMEOUT_S, interval_s=0.05, message="the server to drain",
                   alive=self.child.check_alive)

    def truth_offset(self) -> int:
        return self.truth_path.stat().st_size if self.truth_path.exists() else 0

    def truth_since(self, offset: int) -> dict[str, dict]:
        """Ground-truth lines written since ``offset``, by request id (completed requests only)."""
        with open(self.truth_path, "rb") as log:
            log.seek(offset)
            lines = log.read().splitlines()
        rows = (json.loads(line) for line in lines if line.endswith(b"}"))
        return {r["request_id"]: r for r in rows if r.get("outcome") == "ok" and r.get("request_id")}
