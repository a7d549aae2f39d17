"""What a sender (worker or local runner) reports to the controller: a typed delta.

A worker sends one with each of Locust's periodic reports (``report_to_master`` → ``worker_report``, under the
key ``batchscope``) and a last one in the ``batchscope_final`` message; a local runner hands the object over
directly. Over the wire it is a plain dict (Locust's messages are msgpack), built and read only here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from batchscope.loadgen.stream import RequestRecord

WIRE_KEY = "batchscope"  # where a worker's report rides in Locust's own report dict


@dataclass
class SenderReport:
    """Records finished since the sender's last report, and its cumulative counts."""

    records: list[RequestRecord] = field(default_factory=list)
    started: int = 0  # requests started since the run began (cumulative)
    refused: int = 0  # open-loop arrivals not sent (cumulative)
    not_sent: dict[str, int] = field(default_factory=dict)  # the same by reason (sender.NOT_SENT), cumulative
    refused_s: list[float] = field(default_factory=list)  # scheduled times of arrivals refused since the last one
    in_flight: int = 0  # requests in flight now
    prefill_backlog_tokens: int = 0  # prompt tokens of the requests sent and not answered a first token yet, now
    final: bool = False  # the sender has stopped: nothing follows this report
    at_s: float = 0.0  # when the report was made (Unix seconds)
    cpu_s: float = 0.0  # the sender process's CPU seconds so far (batchscope/loadgen/figures/saturation.py)

    def to_wire(self) -> dict[str, Any]:
        return {"records": [record.to_dict() for record in self.records], "started": self.started,
                "refused": self.refused, "not_sent": self.not_sent, "refused_s": self.refused_s,
                "in_flight": self.in_flight, "prefill_backlog_tokens": self.prefill_backlog_tokens,
                "final": self.final, "at_s": self.at_s, "cpu_s": self.cpu_s}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> SenderReport:
        return cls(records=[RequestRecord(**record) for record in data["records"]], started=data["started"],
                   refused=data["refused"], not_sent=dict(data["not_sent"]), refused_s=list(data["refused_s"]),
                   in_flight=data["in_flight"],
                   prefill_backlog_tokens=data["prefill_backlog_tokens"],
                   final=bool(data.get("final", False)), at_s=data["at_s"], cpu_s=data["cpu_s"])
