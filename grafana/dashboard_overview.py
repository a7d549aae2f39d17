"""The overview dashboard: the configuration in force, latency client vs server, throughput, the scheduler's
queues and batches, the KV cache, errors (what each row answers: docs/dashboards.md)."""

from __future__ import annotations

from dashboard_parts import (
    CONFIG_LABELS,
    MODEL,
    QUANTILES,
    SCENARIO,
    Layout,
    config_label_stat,
    dashboard,
    instant_table,
    panel,
    stat,
    target,
    timeseries,
    with_config_line,
)


def client_vs_server(title: str, client_rule: str, server_rule: str, description: str) -> dict:
    """Client and server quantiles of one quantity on one axis: the gap between the lines is outside vLLM."""
    return timeseries(title, [
        target(f"{client_rule}{{{SCENARIO}, {QUANTILES}}}", "client p{{quantile}} {{scenario}}"),
        target(f"{server_rule}{{{MODEL}, {QUANTILES}}}", "server p{{quantile}} {{model_name}}"),
    ], "s", description)


def overview() -> dict:
    layout = Layout()

    layout.row("Configuration in force", "Which vLLM configuration produced the numbers below?")
    for label in CONFIG_LABELS:
        layout.add(config_label_stat(label), 3, 4)
    layout.add(stat("KV cache capacity", [target("batchscope_vllm_kv_cache_capacity_tokens", "tokens")], "none",
                    "Tokens the KV cache holds at once (vLLM's 'GPU KV cache size')."), 4, 4)
    layout.add(stat("Max concurrency", [target("batchscope_vllm_kv_cache_max_concurrency", "requests")], "none",
                    "Requests of max_model_len tokens the KV cache holds at once (vLLM's 'Maximum concurrency')."),
               4, 4)
    layout.add(stat("Targets up", [target("batchscope_up", "{{target}}")], "none",
                    "1 if the exporter read the target's /metrics at its last scrape.", text_mode="value_and_name"),
               4, 4)

    layout.row("Latency: client vs server",
               "Is the latency users see spent inside vLLM (server) or before and around it (client minus server)?")
    layout.add(client_vs_server("TTFT", "scenario:batchscope_client_ttft_seconds:histogram_quantile1m",
                                "model:vllm_ttft_seconds:histogram_quantile1m",
                                "Client: first token chunk minus send. Server: first token minus the API "
                                "server's arrival."), 8)
    layout.add(client_vs_server("TPOT", "scenario:batchscope_client_tpot_seconds:histogram_quantile1m",
                                "model:vllm_tpot_seconds:histogram_quantile1m",
                                "Per request: (E2E - TTFT) / (output tokens - 1) on both sides."), 8)
    layout.add(client_vs_server("ITL", "scenario:batchscope_client_itl_seconds:histogram_quantile1m",
                                "model:vllm_itl_seconds:histogram_quantile1m",
                                "Client: every gap between token chunks. Server: one observation per engine step "
                                "per decoding request."), 8)

    layout.row("Throughput", "How many requests and tokens per second does this configuration complete?")
    layout.add(timeseries("Completion throughput", [
        target(f"scenario:batchscope_client_completions:rate1m{{{SCENARIO}}}", "client ok {{scenario}}"),
        target(f"model:vllm_request_success:rate1m{{{MODEL}}}", "server finished {{model_name}}"),
    ], "reqps", "Requests finished per second: the client counts outcome ok, the server every finish but abort."),
        12)
    layout.add(timeseries("Tokens per second", [
        target(f"scenario:batchscope_client_output_tokens:rate1m{{{SCENARIO}}}", "client output {{scenario}}"),
        target(f"model:vllm_generation_tokens:rate1m{{{MODEL}}}", "server generated {{model_name}}"),
        target(f"model:vllm_prompt_tokens:rate1m{{{MODEL}}}", "server prompt {{model_name}}"),
    ], "short", "Output tokens of finished requests (client) and tokens generated and prefilled (server).",
        axis_label="tokens/s"), 12)

    layout.row("Scheduler: where requests wait",
               "Is the queue growing, and is max_num_seqs, the token budget or the KV cache the limit?")
    layout.add(with_config_line(timeseries("Running vs waiting (red line: max_num_seqs)", [
        target(f"sum by (model_name) (vllm:num_requests_running{{{MODEL}}})", "running {{model_name}}"),
        target(f"sum by (model_name) (vllm:num_requests_waiting{{{MODEL}}})", "waiting {{model_name}}"),
        target(f"sum by (scenario) (batchscope_client_requests_in_flight{{{SCENARIO}}})",
               "client in flight {{scenario}}"),
    ], "none", "In flight at the client minus running minus waiting = requests not yet inside the scheduler."),
        "max_num_seqs"), 6)
    layout.add(timeseries("KV cache usage", [
        target(f"max by (model_name) (vllm:kv_cache_usage_perc{{{MODEL}}})", "{{model_name}}"),
    ], "percentunit", "Share of KV blocks in use (1 = full); near 1 the scheduler preempts.", max_value=1), 6)
    layout.add(timeseries("Prefix cache hit rate", [
        target(f"sum by (model_name) (rate(vllm:prefix_cache_hits_total{{{MODEL}}}[$__rate_interval]))"
               f" / sum by (model_name) (rate(vllm:prefix_cache_queries_total{{{MODEL}}}[$__rate_interval]))",
               "{{model_name}}"),
    ], "percentunit", "vLLM's definition: prompt tokens found in the prefix cache / prompt tokens looked up "
                      "(vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total, rates). Hit tokens skip "
                      "prefill; no line while nothing is looked up.", max_value=1), 6)
    layout.add(timeseries("Preemptions /s", [
        target(f"model:vllm_preemptions:rate1m{{{MODEL}}}", "{{model_name}}"),
    ], "short", "Running requests evicted for lack of KV blocks; each is recomputed later.",
        axis_label="preemptions/s"), 6)
    decomposition = timeseries("TTFT decomposition (means, stacked)", [
        target(f"model:vllm_queue_time_seconds:mean1m{{{MODEL}}}", "scheduler queue {{model_name}}"),
        target(f"model:vllm_prefill_time_seconds:mean1m{{{MODEL}}}", "prefill {{model_name}}"),
        target("instance:batchscope_ttft_gap_seconds:mean1m", "outside the scheduler (client - server TTFT)"),
        target(f"scenario:batchscope_client_ttft_seconds:mean1m{{{SCENARIO}}}", "client TTFT {{scenario}}"),
    ], "s", "Queue (arrival in the scheduler to first scheduled) + prefill (to first token) + the client-server "
            "gap (network, API wrapper, tokenization, load generator); the dashed line is the client mean TTFT.",
        stacked=True)
    # The client mean is the total the stack should reach, so it is drawn as a line on top, not stacked.
    decomposition["fieldConfig"]["overrides"] = [{
        "matcher": {"id": "byFrameRefID", "options": "D"},
        "properties": [{"id": "custom.stacking", "value": {"mode": "none", "group": "A"}},
                       {"id": "custom.fillOpacity", "value": 0},
                       {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}],
    }]
    layout.add(decomposition, 10)
    layout.add(stat("Load generator saturated", [
        target(f"max(batchscope_client_saturated{{{SCENARIO}}})", "saturated")], "none",
        "1 when the load generator is itself the bottleneck (a sender's CPU >= 90% of its core, or its dispatch "
        "or read lag above 5 ms): the client - server TTFT gap then includes the client's own delay, not "
        "only the network's and the API server's. Rerun with more processes (`--workers N`)."), 4)
    layout.add(with_config_line(timeseries("Tokens per step (red line: max_num_batched_tokens)", [
        target(f"model:vllm_iteration_tokens:mean1m{{{MODEL}}}", "mean tokens per step {{model_name}}"),
    ], "none", "Prompt + generation tokens of an engine step, against the step budget max_num_batched_tokens.",
        axis_label="tokens"), "max_num_batched_tokens"), 10)

    layout.row("Errors and alerts", "Are requests failing, and is any alert firing?")
    layout.add(timeseries("Client errors by outcome", [
        target(f'sum by (outcome) (scenario:batchscope_client_requests:rate1m{{{SCENARIO}, outcome!="ok"}})',
               "{{outcome}}"),
    ], "reqps", "Finished requests per second that did not end ok, by outcome."), 12)
    layout.add(stat("Alerts firing", [target('count(ALERTS{alertstate="firing"}) or vector(0)', "firing")], "none",
                    "Prometheus alerts firing now (0 when none)."), 4)
    layout.add(panel("table", "Firing alerts", [
        instant_table('sum by (alertname, severity) (ALERTS{alertstate="firing"})')], "none",
        "One row per firing alert (empty when none fires).",
        transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True}}}]), 8)

    return dashboard("batchscope-overview", "vLLM batching — overview",
                     "Where the waiting happens and what the last configuration change did.", layout.panels)
