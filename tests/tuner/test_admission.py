"""A run under vLLM's admission limits: its rejections (the client's by reason and share, the server's counter
increase), its prefill throughput as the server and the client see it, and what the comparison, the report and
MLPerf's server scenario make of them."""

from __future__ import annotations

from batchscope.loadgen import MeasurementWindow, RequestRecord
from batchscope.tuner.results.signals import MetricsPoint, first_answered_tokens, server_signals
from batchscope.vllm.catalogue import ADMISSION_REJECTIONS, PROMPT_TOKENS


def _record(n: int, first_token_s: float | None, prompt_tokens: int | None, outcome: str = "ok") -> RequestRecord:
    return RequestRecord(request_id=f"r{n}", worker=0, scheduled_s=0.0, first_token_s=first_token_s,
                         prompt_tokens=prompt_tokens, outcome=outcome)


def test_the_clients_prefill_tokens_are_the_prompts_first_answered_in_the_window():
    # a request cut at the run's end counts: its prompt was prefilled in the window; a rejected one never was
    records = [_record(0, 9.0, 100), _record(1, 10.0, 100), _record(2, 15.0, None, "aborted"),
               _record(3, None, None, "rejected_busy"), _record(4, 20.5, 100)]
    assert first_answered_tokens(records, MeasurementWindow(10.0, 20.0), input_tokens=64) == 164.0


def test_the_server_signals_carry_the_admission_counters_increase_and_none_when_not_exposed():
    def point(t: float, rejected: float | None) -> MetricsPoint:
        values = {PROMPT_TOKENS.exposed_name: 1000.0 * t}
        if rejected is not None:
            values[ADMISSION_REJECTIONS.exposed_name] = rejected
        return MetricsPoint(t=t, values=values)

    signals = server_signals([point(0, 3), point(5, 10), point(10, 21)], 0.0, 10.0, None)
    assert (signals.admission_rejections, signals.prompt_tokens) == (18.0, 10_000.0)
    assert server_signals([point(0, None), point(10, None)], 0.0, 10.0, None).admission_rejections is None
