"""The join with the server's ground truth: client minus server latency of the same requests (bias), and how
bursty the sends were."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p99: float
    max: float

    @classmethod
    def of_ms(cls, values: list[float]) -> Percentiles:
        if not values:
            return cls(float("nan"), float("nan"), float("nan"))
        array = np.asarray(values) * 1e3
        p50, p99 = np.percentile(array, [50, 99])
        return cls(float(p50), float(p99), float(array.max()))


@dataclass(frozen=True)
class Bias:
    """Client minus server latency for requests that both sides saw complete."""

    label: str
    matched: int
    unmatched: int
    burst: int  # most arrivals at the server within BURST_S
    ttft: Percentiles
    e2e: Percentiles
    send: Percentiles  # server arrival - client send
    first_read: Percentiles  # client first token - server first token written


BURST_S = 0.010


def bias_of(label: str, pairs: list[tuple[dict, dict]], unmatched: int) -> Bias:
    """From (client record, server ground-truth line) pairs of the same requests."""
    ttft, e2e, send, first_read = [], [], [], []
    for client, server in pairs:
        sent, arrival = client["sent_s"], server["arrival_s"]
        ttft.append((client["first_token_s"] - sent) - (server["first_token_s"] - arrival))
        e2e.append((client["last_token_s"] - sent) - (server["last_token_s"] - arrival))
        send.append(arrival - sent)
        first_read.append(client["first_token_s"] - server["first_token_s"])
    return Bias(label, len(pairs), unmatched, largest_burst(sorted(s["arrival_s"] for _, s in pairs)),
                Percentiles.of_ms(ttft), Percentiles.of_ms(e2e), Percentiles.of_ms(send), Percentiles.of_ms(first_read))


def largest_burst(arrivals: list[float]) -> int:
    """Most arrivals within any BURST_S (sorted input): how synchronised the sends were."""
    if not arrivals:
        return 0
    times = np.asarray(arrivals)
    return int((np.searchsorted(times, times + BURST_S, side="right") - np.arange(times.size)).max())


def match(timed: list[dict], truth: dict[str, dict]) -> list[tuple[dict, dict]]:
    return [(record, truth[record["request_id"]]) for record in timed
            if record["request_id"] in truth and truth[record["request_id"]]["first_token_s"] is not None]
