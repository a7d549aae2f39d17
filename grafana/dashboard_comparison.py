"""The run comparison dashboard: one row per vLLM configuration seen in the time range, each figure over only
the steps when that configuration was in force."""

from __future__ import annotations

from dashboard_parts import (
    CONFIG_BY,
    CONFIG_INFO,
    CONFIG_LABELS,
    MODEL,
    SCENARIO,
    Layout,
    dashboard_model,
    describe,
    instant_table,
    override,
    table,
    target,
    thresholds,
    timeseries,
)
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import table as table_builders
from grafana_foundation_sdk.models import dashboard

from batchscope.vllm.catalogue import REQUEST_QUEUE_TIME


def per_config(expr: str) -> str:
    """Tag each series with the configuration in force at that instant (the info metric has one series per
    exporter target at a time, so the many-to-one join is safe)."""
    return f"({expr}) * on (job, instance) group_left ({CONFIG_BY}) {CONFIG_INFO}"


def over_range(function: str, expr: str) -> str:
    """`function` over the dashboard range of a per-configuration series, evaluated step by step."""
    return f"{function}(({per_config(expr)})[$__range:$__interval])"


def config_quantile(q: float, histogram: str, selector: str = SCENARIO) -> str:
    """Quantile per configuration from the bucket rates summed over that configuration's steps (exact up to
    bucket resolution; averaging 1 m quantiles would not be)."""
    buckets = over_range("sum_over_time", f"rate({histogram}_bucket{{{selector}}}[$__rate_interval])")
    return f"histogram_quantile({q}, sum by (le, {CONFIG_BY}) ({buckets}))"


def config_total(rates: str) -> str:
    """Per-second rates summed over each configuration's steps in force: a count per configuration."""
    return f"sum by ({CONFIG_BY}) ({over_range('sum_over_time', rates)})"


def config_attainment(histogram: str, target_rule: str) -> str:
    """Share of a configuration's requests within the SLO target (the bucket whose `le` the target rule names for
    that exporter), over the steps it was in force."""
    within = f"rate({histogram}_bucket{{{SCENARIO}}}[$__rate_interval]) and on (job, instance, le) {target_rule}"
    return f"{config_total(within)} / {config_total(f'rate({histogram}_count{{{SCENARIO}}}[$__rate_interval])')}"


def config_goodput_share() -> str:
    """Share of a configuration's completed requests within both targets, each by its own TTFT and TPOT: the load
    generator's goodput count over its TTFT count (one population)."""
    good = config_total(f"rate(batchscope_client_goodput_requests_total{{{SCENARIO}}}[$__rate_interval])")
    every = config_total(f"rate(batchscope_client_time_to_first_token_seconds_count{{{SCENARIO}}}[$__rate_interval])")
    return f"{good} / {every}"


def config_mean(recorded: str) -> str:
    """Mean of a recorded rate over the steps each configuration was in force, summed over scenarios/models."""
    return f"sum by ({CONFIG_BY}) ({over_range('avg_over_time', recorded)})"


def config_outcome_share(outcome: str) -> str:
    """Share of the requests that ended whose outcome the matcher ``outcome`` selects, per configuration (0 when
    none did)."""
    def ended(selector: str) -> str:
        return config_total(f"rate(batchscope_client_requests_total{{{selector}}}[$__rate_interval])")

    return f"{ended(f'{SCENARIO}, {outcome}')} / {ended(SCENARIO)}"


REJECTED = 'outcome="rejected_busy"'  # vLLM's admission check refused it: not good, and not a failure either
FAILED = 'outcome!~"ok|rejected_busy"'  # every outcome that is a failure
COMPARISON_COLUMNS = [
    # (column title, expression, unit); client figures unless the title says vLLM
    ("TTFT p50", config_quantile(0.5, "batchscope_client_time_to_first_token_seconds"), "s"),
    ("TTFT p99", config_quantile(0.99, "batchscope_client_time_to_first_token_seconds"), "s"),
    ("TPOT p50", config_quantile(0.5, "batchscope_client_time_per_output_token_seconds"), "s"),
    ("TPOT p99", config_quantile(0.99, "batchscope_client_time_per_output_token_seconds"), "s"),
    ("E2E p99", config_quantile(0.99, "batchscope_client_e2e_request_latency_seconds"), "s"),
    ("TTFT within SLO", config_attainment("batchscope_client_time_to_first_token_seconds",
                                          "batchscope:slo_ttft_seconds"), "percentunit"),
    ("TPOT within SLO", config_attainment("batchscope_client_time_per_output_token_seconds",
                                          "batchscope:slo_tpot_seconds"), "percentunit"),
    ("Within both SLOs", config_goodput_share(), "percentunit"),
    ("Goodput /s", config_mean(f"scenario:batchscope_client_goodput:rate1m{{{SCENARIO}}}"), "reqps"),
    ("Queue p99 (vLLM)", config_quantile(0.99, REQUEST_QUEUE_TIME.name, MODEL), "s"),
    ("Completions /s", config_mean(f"scenario:batchscope_client_completions:rate1m{{{SCENARIO}}}"), "reqps"),
    ("Steps /s (vLLM)", config_mean(f"model:vllm_engine_steps:rate1m{{{MODEL}}}"), "short"),
    ("Preemptions /s", config_mean(f"model:vllm_preemptions:rate1m{{{MODEL}}}"), "short"),
    ("Preemptions / request (vLLM)", config_mean(f"model:vllm_request_preemptions:mean1m{{{MODEL}}}"), "short"),
    ("Recomputed tokens /s (vLLM)", config_mean(f"model:vllm_recomputed_prompt_tokens:rate1m{{{MODEL}}}"),
     "short"),
    ("Rejected", config_outcome_share(REJECTED), "percentunit"),
    ("Rejections /s (vLLM)", config_mean(f"model:vllm_admission_rejections:rate1m{{{MODEL}}}"), "reqps"),
    ("Errors", config_outcome_share(FAILED), "percentunit"),
]


def comparison_table() -> table_builders.Panel:
    targets = [instant_table(expr) for _, expr, _ in COMPARISON_COLUMNS]
    body = table("Configurations in the time range", targets, "s", describe(
                 "One row per configuration seen in the range (the seed's knobs, max_model_len and vLLM 0.32's "
                 "queue knobs); each figure covers only the steps when that configuration was in force. Select "
                 "one scenario so rows compare like with like.",
                 "the client's (as vllm bench serve) for latency, SLO shares, goodput, completions and errors; "
                 "vLLM's where the column says so, and for preemptions. Goodput: requests within both targets by "
                 "their own TTFT and TPOT (vllm bench serve's rule, the load spec's exact targets). Rejected: "
                 "requests vLLM's admission check refused (rejected_busy), not good and not errors.",
                 "a row with preemptions or recomputed tokens: its KV cache is too small for its max_num_seqs; "
                 "a row with a low TTFT p99 and a high Rejected share bought its latency by refusing load; the "
                 "best row meets both SLOs (within both 0.99) at the most goodput /s."))
    body.sort_by([common_builders.TableSortByFieldState().display_name("max_num_seqs").desc(False)])
    # Each instant query is a table whose value column is "Value #<refId>"; merge joins them on the config labels.
    refs = [query.build().ref_id for query in targets]
    renames = {f"Value #{ref}": title for ref, (title, _, _) in zip(refs, COMPARISON_COLUMNS, strict=True)}
    order = {name: index for index, name in enumerate([*CONFIG_LABELS, *renames])}
    body.with_transformation(dashboard.DataTransformerConfig(id_val="merge", options={}))
    body.with_transformation(dashboard.DataTransformerConfig(id_val="organize", options={
        "excludeByName": {"Time": True}, "indexByName": order, "renameByName": renames}))
    for title, _, unit in COMPARISON_COLUMNS:
        if unit != "s":
            body.with_override(*override("byName", title, {"unit": unit}))
    return body


def comparison() -> dashboard.Dashboard:
    layout = Layout()
    layout.row("What did each configuration seen in the range do to latency, SLOs, throughput, preemptions, "
               "rejections and errors?")
    layout.add(comparison_table(), 24, 10)
    layout.row("When was each configuration in force, and how did its latency and SLO share move?")
    legend = ("max_num_seqs={{max_num_seqs}} max_num_batched_tokens={{max_num_batched_tokens}} "
              "gpu_memory_utilization={{gpu_memory_utilization}} max_num_queued_reqs={{max_num_queued_reqs}} "
              "max_num_queued_tokens={{max_num_queued_tokens}} {{scenario}}")
    layout.add(timeseries("Client TTFT p99 by configuration", [
        target(per_config(f'scenario:batchscope_client_ttft_seconds:histogram_quantile1m{{{SCENARIO}, '
                          f'quantile="0.99"}}'), legend),
    ], "s", describe("The same p99 as the overview, one colour per configuration.", "the client's TTFT.",
                     "a step up at a configuration change: that change made admission or prefill slower.")), 8)
    layout.add(timeseries("Client TTFT SLO share by configuration", [
        target(per_config(f"scenario:batchscope_client_ttft_slo:attainment1m{{{SCENARIO}}}"), legend),
    ], "percentunit", describe("Share of requests within the TTFT target over the last minute, one colour per "
                               "configuration (green line: the 0.99 objective).",
                               "the client's TTFT against batchscope:slo_ttft_seconds.",
                               "below the line: that configuration misses the SLO; compare its queue p99."),
        max_value=1, steps=thresholds((None, "red"), (0.99, "green"))), 8)
    layout.add(timeseries("Goodput by configuration", [
        target(per_config(f"scenario:batchscope_client_goodput:rate1m{{{SCENARIO}}}"), legend),
    ], "reqps", describe("Requests per second within both SLO targets, one colour per configuration.",
                         "the client's goodput (vllm bench serve's rule, each request by its own TTFT and TPOT "
                         "against the load spec's exact targets).",
                         "a step down at a configuration change: that change costs requests served in time; "
                         "the TTFT share beside and the table's TPOT share say which target.")), 8)
    return dashboard_model("batchscope-comparison", "vLLM batching — run comparison",
                           "One row per vLLM configuration seen in the time range.", layout)
