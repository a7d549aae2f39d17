"""Deterministic loads for vLLM 0.32's queue knobs, run alike against the simulator and a real vLLM started with
QUEUE_FLAGS: the RUNNING cap held by long streams, then a burst over each admission limit, then a long prompt
beside a decode under the long-prefill cap. Each returns the figures both servers must agree on."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

import requests
from prometheus_client.parser import text_string_to_metric_families

from batchscope.testkit.burst import Answer, Burst
from batchscope.vllm import catalogue
from tests.conftest import wait_until

MAX_MODEL_LEN, BATCHED_TOKENS = 2048, 1024  # the tiny model's 2048 positions: holders decode as long as they can
ACTIVE, QUEUED_REQS, QUEUED_TOKENS, THRESHOLD = 2, 6, 2500, 64
LIMIT_FLAGS = ("--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "8", "--max-num-batched-tokens",
               str(BATCHED_TOKENS), "--max-num-active-seqs", str(ACTIVE), "--max-num-queued-reqs", str(QUEUED_REQS),
               "--max-num-queued-tokens", str(QUEUED_TOKENS))
QUEUE_FLAGS = (*LIMIT_FLAGS, "--long-prefill-token-threshold", str(THRESHOLD))
LONG_PROMPT = 1000
_LONG_IDS = itertools.count(2000, 10)  # a prompt of its own each time: a prefix cache hit would shorten the prefill
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


RUNS = 3  # a long prefill's runs: the median of their counts stands, so one read of a starved client does not


@dataclass
class PrefillFigures:
    """What a long prompt's prefill beside a decode showed."""

    decode_tokens: list[int]  # per run: the decode's token events from the long request's start to its first token
    iteration_tokens: dict[float, float]  # iteration_tokens observations above 8 tokens over the runs, by bound

    @property
    def median(self) -> int:
        return sorted(self.decode_tokens)[len(self.decode_tokens) // 2]


def long_prefills(url: str, model: str) -> PrefillFigures:
    """``prefill_beside_a_decode`` RUNS times."""
    runs = [prefill_beside_a_decode(url, model) for _ in range(RUNS)]
    bounds = runs[0].iteration_tokens
    return PrefillFigures([n for run in runs for n in run.decode_tokens],
                          {bound: sum(run.iteration_tokens[bound] for run in runs) for bound in bounds})


def prefill_beside_a_decode(url: str, model: str) -> PrefillFigures:
    """A decode stream running, then one LONG_PROMPT-token prompt: the decode yields one token a step, so its
    tokens received between the long request's response start (vLLM sends the 200, then adds the request to the
    engine) and the long request's first token count the steps its prefill took (see docs/simulator.md)."""
    idle(url)
    before = samples(url)
    with Burst(url) as burst:
        decode = burst.tally(body(model, 100, 4, MAX_MODEL_LEN - 4))
        wait_until(lambda: decode.count >= 3, DEADLINE_S, message=f"the decode stream's tokens at {url}")
        marks: list[int] = []
        answer = burst.open(body(model, next(_LONG_IDS), LONG_PROMPT, 1), on_start=lambda: marks.append(decode.count))
        marks.append(decode.count)
        assert answer.status == 200 and answer.reason is None and answer.text.startswith('data: {"id"'), answer
        after = samples(url)
    idle(url)
    name = catalogue.ITERATION_TOKENS.name + "_bucket"
    buckets = {float(dict(labels)["le"]): v - before.get((n, labels), 0.0)
               for (n, labels), v in after.items() if n == name}
    bounds = sorted(buckets)
    return PrefillFigures([marks[1] - marks[0]], {bound: buckets[bound] - buckets[previous] for previous, bound
                                                in zip(bounds, bounds[1:], strict=False) if previous >= 8})
