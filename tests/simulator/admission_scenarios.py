"""Deterministic loads for vLLM 0.32's queue knobs, run alike against the simulator and a real vLLM started with
QUEUE_FLAGS: the RUNNING cap held by long streams, then a burst over each admission limit, then two long prompts
beside a decode under the long-prefill cap. Each returns the figures both servers must agree on."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import requests
from prometheus_client.parser import text_string_to_metric_families

from batchscope.testkit.burst import Answer, Burst
from batchscope.vllm import catalogue
from tests.conftest import wait_until

MAX_MODEL_LEN = 1024
ACTIVE, QUEUED_REQS, QUEUED_TOKENS, THRESHOLD = 2, 6, 2500, 256
QUEUE_FLAGS = ("--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "8", "--max-num-batched-tokens", "1024",
               "--max-num-active-seqs", str(ACTIVE), "--max-num-queued-reqs", str(QUEUED_REQS),
               "--max-num-queued-tokens", str(QUEUED_TOKENS), "--long-prefill-token-threshold", str(THRESHOLD))
DEADLINE_S = 60.0


def body(model: str, first_id: int, prompt_len: int, max_tokens: int) -> dict:
    """A streamed completion of ``prompt_len`` token ids of its own (no prefix shared with another)."""
    return {"model": model, "prompt": [first_id + i % 7 for i in range(prompt_len)], "max_tokens": max_tokens,
            "ignore_eos": True}


def samples(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics: (name, sorted labels) -> value."""
    text = requests.get(url + "/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(figures: dict[tuple[str, tuple], float], name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in figures.items() if n == name and set(labels.items()) <= set(ls))


def rejections(figures: dict[tuple[str, tuple], float]) -> dict[str, float]:
    name = catalogue.ADMISSION_REJECTIONS.name + "_total"
    return {reason: value(figures, name, reason=reason) for reason in catalogue.ADMISSION_REJECTION_REASONS}


def idle(url: str) -> None:
    """Until nothing runs or waits (the streams just closed are aborted)."""
    def quiet() -> bool:
        figures = samples(url)
        return value(figures, catalogue.NUM_REQUESTS_RUNNING.name) + value(
            figures, catalogue.NUM_REQUESTS_WAITING.name) == 0
    wait_until(quiet, DEADLINE_S, message="the server to be idle")


@dataclass
class BurstFigures:
    """What a burst over a limit showed: who was refused and how, the queues meanwhile, the counter's increase."""

    refused: dict[str, int]  # reason -> requests refused
    bodies: set[str]  # the refused answers' error JSON, as sent (503 body or stream error event)
    running: float
    waiting: float
    counter_increase: dict[str, float]


def hold_running(burst: Burst, model: str) -> None:
    """ACTIVE long streams, opened one after another: RUNNING is full (their prompts are out of the backlog)."""
    for index in range(ACTIVE):
        answer = burst.open(body(model, 100 + index, 4, MAX_MODEL_LEN - 4))
        assert answer.status == 200 and answer.reason is None, answer


def burst_over(url: str, model: str, count: int, prompt_len: int) -> BurstFigures:
    """RUNNING held full, then ``count`` simultaneous requests of ``prompt_len`` tokens: they wait, or are refused."""
    idle(url)
    before = rejections(samples(url))
    with Burst(url) as burst:
        hold_running(burst, model)
        answers = burst.send([body(model, 1000 + 10 * i, prompt_len, 16) for i in range(count)])

        def settled() -> dict | None:
            """Every burst request refused or in the server (the admitted ones wait: RUNNING is full)."""
            refused = sum(1 for a in answers if a and a.reason)  # before the counter: it moves before an answer
            figures = samples(url)
            queued = value(figures, catalogue.NUM_REQUESTS_RUNNING.name) + value(
                figures, catalogue.NUM_REQUESTS_WAITING.name) - ACTIVE
            return figures if refused + queued == count else None
        figures = wait_until(settled, DEADLINE_S, message=f"every burst request refused or queued at {url}: {answers}")
    idle(url)
    refused = [a for a in answers if a and a.reason]
    return BurstFigures(refused=dict(Counter(a.reason for a in refused if a.reason)),
                        bodies={_error(a) for a in refused},
                        running=value(figures, catalogue.NUM_REQUESTS_RUNNING.name),
                        waiting=value(figures, catalogue.NUM_REQUESTS_WAITING.name),
                        counter_increase={k: v - before[k] for k, v in rejections(figures).items()})


def _error(answer: Answer) -> str:
    return answer.error_text or ""


def prefill_beside_a_decode(url: str, model: str) -> dict[float, float]:
    """RUNNING held full, two long prompts queued behind it, then one holder closed: the prompts run one after the
    other beside the other holder's decode, each capped at THRESHOLD a step (eligible > 1). The iteration_tokens
    observations above 8 tokens they made, per bucket bound (the decode's own steps observe 1 token each, as
    many as the wall clock allows; vLLM observes a prompt's tokens once, in the step its prefill ends)."""
    idle(url)
    name = catalogue.ITERATION_TOKENS.name + "_bucket"
    before = samples(url)
    with Burst(url) as burst, Burst(url) as closing:
        burst.open(body(model, 100, 4, MAX_MODEL_LEN - 4))
        closing.open(body(model, 110, 4, MAX_MODEL_LEN - 4))
        answers = burst.send([body(model, 2000 + 10 * i, 1000, 1) for i in range(2)])
        wait_until(lambda: value(samples(url), catalogue.NUM_REQUESTS_WAITING.name) == 2, DEADLINE_S,
                   message="both long prompts queued")
        closing.close()
        wait_until(lambda: all(answers), DEADLINE_S, message="both long prompts' token")
        assert all(a and a.status == 200 and a.reason is None for a in answers), answers
        after = samples(url)
    idle(url)
    buckets = {float(dict(labels)["le"]): v - before.get((n, labels), 0.0)
               for (n, labels), v in after.items() if n == name}
    bounds = sorted(buckets)
    return {bound: buckets[bound] - buckets[previous] for previous, bound in zip(bounds, bounds[1:], strict=False)
            if previous >= 8}
