"""The overview dashboard, rows in reading order: the configuration in force; is it healthy; where requests wait;
what admission refuses and which queue limit binds; why (the batch, the KV cache, preemption); what the client
sees (what each row answers: docs/dashboards.md)."""

from __future__ import annotations

from dashboard_parts import (
    MODEL,
    QUANTILES,
    QUEUE_LABELS,
    SCENARIO,
    SEED_LABELS,
    Layout,
    config_label_stat,
    dashboard_model,
    describe,
    heatmap_panel,
    instant_table,
    or_not_exposed,
    override,
    stat,
    table,
    target,
    thresholds,
    timeseries,
    with_config_line,
)
from grafana_foundation_sdk.builders import timeseries as timeseries_builders
from grafana_foundation_sdk.models import common, dashboard

from batchscope.vllm.catalogue import (
    ADMISSION_REJECTIONS,
    E2E_REQUEST_LATENCY,
    INTER_TOKEN_LATENCY,
    ITERATION_TOKENS,
    KV_CACHE_USAGE,
    NUM_PREEMPTIONS,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    NUM_REQUESTS_WAITING_BY_REASON,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    PROMPT_TOKENS_BY_SOURCE,
    REQUEST_GENERATION_TOKENS,
    REQUEST_NUM_PREEMPTIONS,
    REQUEST_PROMPT_TOKENS,
    REQUEST_QUEUE_TIME,
    REQUEST_SUCCESS,
    TIME_TO_FIRST_TOKEN,
)

# an SLO share below its objective (0.99) is a breach; between 0.95 and it a warning
ATTAINMENT_STEPS = thresholds((None, "red"), (0.95, "orange"), (0.99, "green"))
ERROR_STEPS = thresholds((None, "green"), (0.05, "red"))  # the error alerts' 5 %


def client_vs_server(title: str, client_rule: str, server_rule: str,
                     description: str) -> timeseries_builders.Panel:
    """Client and server quantiles of one quantity on one axis: the gap between the lines is outside vLLM."""
    return timeseries(title, [
        target(f"{client_rule}{{{SCENARIO}, {QUANTILES}}}", "client p{{quantile}} {{scenario}}"),
        target(f"{server_rule}{{{MODEL}, {QUANTILES}}}", "server p{{quantile}} {{model_name}}"),
    ], "s", description)


def right_axis(body: timeseries_builders.Panel, ref_id: str, unit: str) -> timeseries_builders.Panel:
    """Draw one query of a time series panel on a right-hand axis in its own unit."""
    return body.with_override(*override("byFrameRefID", ref_id, {"unit": unit, "custom.axisPlacement": "right"}))


def configuration_row(layout: Layout) -> None:
    layout.row("Which vLLM configuration produced the numbers below?")
    for label in SEED_LABELS:
        layout.add(config_label_stat(label), 3, 4)
    layout.add(stat("KV cache capacity", [target("batchscope_vllm_kv_cache_capacity_tokens", "tokens")], "none",
                    describe("Tokens the KV cache holds at once.",
                             "vLLM's 'GPU KV cache size' (num_gpu_blocks x block_size).",
                             "well below max_num_seqs x (prompt + output tokens) the cache preempts: raise "
                             "--gpu-memory-utilization.")), 4, 4)
    layout.add(stat("Max concurrency", [target("batchscope_vllm_kv_cache_max_concurrency", "requests")], "none",
                    describe("Requests of max_model_len tokens the KV cache holds at once.",
                             "vLLM's 'Maximum concurrency' (KV tokens / max_model_len).",
                             "below max_num_seqs, full-length requests preempt each other: raise "
                             "--gpu-memory-utilization or lower --max-model-len.")), 4, 4)
    layout.add(stat("Targets up", [target("batchscope_up", "{{target}}")], "none",
                    describe("1 if the exporter read the target's /metrics at its last scrape.",
                             "the exporter's (batchscope_up per target).",
                             "0 for the vllm target: the server is down or unreachable (BatchscopeTargetDown); 0 for "
                             "loadgen is expected between load runs."),
                    text_mode=common.BigValueTextMode.VALUE_AND_NAME,
                    steps=thresholds((None, "red"), (1, "green"))), 4, 4)


def health_row(layout: Layout) -> None:
    layout.row("Is it healthy: are requests served within their targets, without errors?")
    layout.add(stat("Alerts firing", [target('count(ALERTS{alertstate="firing"}) or vector(0)', "firing")], "none",
                    describe("Prometheus alerts firing now (0 when none).", "Prometheus' ALERTS series.",
                             "open the alert's runbook link (docs/runbook.md) from the table beside."),
                    steps=thresholds((None, "green"), (1, "red"))), 4)
    layout.add(table("Firing alerts", [
        instant_table('sum by (alertname, severity) (ALERTS{alertstate="firing"})')], "none",
        describe("One row per firing alert (empty when none fires).", "Prometheus' ALERTS series.",
                 "each alert's runbook section (docs/runbook.md) lists the first three things to check."))
               .with_transformation(dashboard.DataTransformerConfig(
                   id_val="organize", options={"excludeByName": {"Time": True, "Value": True}})), 8)
    layout.add(timeseries("SLO attainment: share of requests within the TTFT / TPOT targets", [
        target(f"model:vllm_ttft_slo:attainment1m{{{MODEL}}}", "server TTFT {{model_name}}"),
        target(f"model:vllm_tpot_slo:attainment1m{{{MODEL}}}", "server TPOT {{model_name}}"),
        target(f"scenario:batchscope_client_ttft_slo:attainment1m{{{SCENARIO}}}", "client TTFT {{scenario}}"),
        target(f"scenario:batchscope_client_tpot_slo:attainment1m{{{SCENARIO}}}", "client TPOT {{scenario}}"),
        target(f"scenario:batchscope_client_slo:attainment1m{{{SCENARIO}}}", "client both {{scenario}}"),
    ], "percentunit", describe(
        "Share of the requests finished in the last minute whose TTFT (or TPOT) is within the target "
        "(batchscope:slo_ttft_seconds, batchscope:slo_tpot_seconds: the load spec's slo, else the exporter's "
        "--slo-*-seconds, else 2.5 s / 0.2 s), and whose TTFT and TPOT both are (client both: goodput's share); "
        "the objective is 0.99 (green line).",
        "server lines vLLM's histograms (TTFT from arrival at the API server), client lines the load "
        "generator's (as vllm bench serve); the per-target lines count whole buckets, a target between two "
        "bounds at the next bound up, while client both judges each request by the exact targets.",
        "below 0.99, VllmTtftSloBurn / VllmTpotSloBurn follow: for TTFT look at the queue row below, for TPOT at "
        "steps/s and the batch size (max_num_seqs)."), max_value=1, steps=ATTAINMENT_STEPS), 12)
    layout.add(timeseries("Goodput: requests within both SLO targets", [
        target(f"scenario:batchscope_client_goodput:rate1m{{{SCENARIO}}}", "goodput {{scenario}}"),
        target(f"sum without (run_id) (rate(batchscope_client_time_to_first_token_seconds_count{{{SCENARIO}}}"
               f"[$__rate_interval]))", "completed in the window {{scenario}}"),
    ], "reqps", describe(
        "Requests per second completed ok in the measurement window whose own TTFT and own TPOT both met the "
        "targets (goodput), beside all those completed (the gap: requests served too late).",
        "the client's, vllm bench serve's goodput rule: per request TTFT <= target and TPOT <= target (a one-token "
        "request passes TPOT), against the load spec's exact targets (batchscope_client_slo_target_seconds); 0 "
        "during warm-up.",
        "goodput below completions: the SLO attainment panel says which target is missed (TTFT: the queue row; "
        "TPOT: batch size and steps/s); both flat while the load rises: the server is saturated.")), 12)
    layout.add(timeseries("Completion throughput", [
        target(f"scenario:batchscope_client_completions:rate1m{{{SCENARIO}}}", "client ok {{scenario}}"),
        target(f"model:vllm_request_success:rate1m{{{MODEL}}}", "server finished {{model_name}}"),
    ], "reqps", describe(
        "Requests finished per second.",
        "client = the load generator's outcome ok; server = vLLM's finishes but abort.",
        "flat while the load rises: the server is saturated, see the queue row; client below server: "
        "the client lost answers (errors panel).")), 12)
    layout.add(timeseries("Finished requests by reason", [
        target(f"sum by (finished_reason) (model:vllm_requests_finished:rate1m{{{MODEL}}})", "{{finished_reason}}"),
    ], "reqps", describe(
        "Requests vLLM finished per second, stacked by finished_reason: stop (EOS or a stop string), length "
        "(max_tokens or max_model_len), abort, error, repetition.",
        f"vLLM's ({REQUEST_SUCCESS.exposed_name}; 0.32 counts no client disconnect as abort).",
        "abort or error above a few % (VllmRequestErrorSpike): read vLLM's log; mostly length where stop was "
        "expected: max_tokens or --max-model-len cut the answers."), stacked=True), 8)
    layout.add(timeseries("HTTP error ratio", [
        target("instance:batchscope_vllm_http_errors:ratio_rate1m", "server 5xx {{instance}}"),
        target(f"scenario:batchscope_client_errors:ratio_rate1m{{{SCENARIO}}}", "client not ok {{scenario}}"),
    ], "percentunit", describe(
        "Share of requests failed over the last minute (red line: the error alerts' 5 %).",
        "server = vLLM's API server, 5xx answers to /v1/* but the pollers' /v1/models (http_requests_total), "
        "the admission check's 503s taken out (admission_rejections_total); client = the load generator's "
        "requests that failed (any outcome but ok and rejected_busy).",
        "server 5xx: vLLM's log has the exception (VllmRequestErrorSpike); client only: timeouts or the "
        "network (BatchscopeClientErrorRate)."), max_value=1, steps=ERROR_STEPS), 8)
    layout.add(timeseries("Tokens per second", [
        target(f"scenario:batchscope_client_output_tokens:rate1m{{{SCENARIO}}}", "client output {{scenario}}"),
        target(f"model:vllm_generation_tokens:rate1m{{{MODEL}}}", "server generated {{model_name}}"),
        target(f"model:vllm_prompt_tokens:rate1m{{{MODEL}}}", "server prompt {{model_name}}"),
    ], "short", describe(
        "Output tokens of finished requests and tokens generated and prefilled.",
        "client = usage.completion_tokens of finished requests; server = vLLM's generation and prompt tokens.",
        "generated tokens at 0 with requests running: the engine is stalled (VllmEngineStalled)."),
        axis_label="tokens/s"), 8)
    steps = timeseries("Engine steps/s and mean step time", [
        target(f"model:vllm_engine_steps:rate1m{{{MODEL}}}", "steps/s {{model_name}}"),
        target(f"model:vllm_step_time_seconds:mean1m{{{MODEL}}}", "mean step time {{model_name}} (right)"),
    ], "short", describe(
        "Engine steps per second (left) and the mean time between two steps a decoding request sees (right).",
        f"vLLM's: steps = observations of {ITERATION_TOKENS.name}; step time = mean of "
        f"{INTER_TOKEN_LATENCY.name} (one per step per decoding request).",
        "steps/s at 0 with work queued: the engine is hung (VllmEngineStalled); step time rising with the "
        "batch: TPOT follows it, lower --max-num-seqs or --max-num-batched-tokens."), axis_label="steps/s")
    layout.add(right_axis(steps, "B", "s"), 12)
    layout.add(timeseries("API-server CPU", [
        target(or_not_exposed("instance:batchscope_vllm_api_server_cpu:rate1m",
                              "batchscope_vllm_process_cpu_seconds_total", "instance"), "{{instance}}"),
    ], "short", describe(
        "CPU cores vLLM's API server process uses (1 = one core all the time; red line 0.9).",
        "vLLM's process_cpu_seconds_total of the API server (with --api-server-count > 1 it is not exposed).",
        "near 1 its event loop is saturated and requests wait before vLLM's clock starts (VllmApiServerCpuSaturated):"
        " --api-server-count, --stream-interval."), axis_label="cores", steps=thresholds((None, "green"), (0.9, "red")),
        not_exposed=True), 12)


def waiting_row(layout: Layout) -> None:
    layout.row("Where do requests wait: at admission, in the queue, or in prefill and decode?")
    layout.add(with_config_line(timeseries("Running vs waiting (red line: max_num_seqs)", [
        target(f"sum by (model_name) ({NUM_REQUESTS_RUNNING.name}{{{MODEL}}})", "running {{model_name}}"),
        target(f"sum by (model_name) ({NUM_REQUESTS_WAITING.name}{{{MODEL}}})", "waiting {{model_name}}"),
        target(f"sum by (scenario) (batchscope_client_requests_in_flight{{{SCENARIO}}})",
               "client in flight {{scenario}}"),
    ], "none", describe(
        "Requests running in the batch and waiting in the scheduler's queue; client in flight minus both = "
        "requests not yet inside the scheduler.",
        "vLLM's gauges; in flight is the load generator's.",
        "running at the red line with requests waiting and the KV cache low: max_num_seqs binds "
        "(VllmAdmissionLimited), raise it.")), "max_num_seqs"), 8)
    layout.add(timeseries("Waiting by reason", [
        target(or_not_exposed(f"sum by (model_name, reason) ({NUM_REQUESTS_WAITING_BY_REASON.name}{{{MODEL}}})",
                              f"{NUM_REQUESTS_WAITING_BY_REASON.name}{{{MODEL}}}"), "{{reason}} {{model_name}}"),
    ], "none", describe(
        "Waiting requests by why they wait: capacity (a batch slot, the token budget or KV room) or deferred "
        "(LoRA slots, a KV transfer, a blocked request), stacked; 0.32 and later.",
        f"vLLM's {NUM_REQUESTS_WAITING_BY_REASON.name} (the reasons sum to {NUM_REQUESTS_WAITING.name}).",
        "capacity: see running vs waiting and the KV cache; deferred: LoRA (--max-loras) or the KV connector."),
        stacked=True, not_exposed=True), 8)
    layout.add(timeseries("Queue time percentiles", [
        target(f"model:vllm_queue_time_seconds:histogram_quantile1m{{{MODEL}}}", "p{{quantile}} {{model_name}}"),
    ], "s", describe(
        "p50, p90 and p99 of the time requests spent waiting to be scheduled, over the last minute.",
        f"vLLM's ({REQUEST_QUEUE_TIME.name}: first scheduled minus queued; a preempted request's second "
        "wait is not counted here).",
        "p99 far above p50: bursts queue behind a full batch; all rising: capacity, see running vs waiting."),
        axis_label="seconds"), 8)
    breakdown = timeseries("Request time in vLLM: queue, prefill, decode (means, stacked)", [
        target(f"model:vllm_queue_time_seconds:mean1m{{{MODEL}}}", "queue {{model_name}}"),
        target(f"model:vllm_prefill_time_seconds:mean1m{{{MODEL}}}", "prefill {{model_name}}"),
        target(f"model:vllm_decode_time_seconds:mean1m{{{MODEL}}}", "decode {{model_name}}"),
        target(f"model:vllm_e2e_seconds:mean1m{{{MODEL}}}", "E2E {{model_name}}"),
    ], "s", describe(
        "Where a request's time in vLLM goes: queue (waiting to be scheduled), prefill (to the first token), "
        "decode (to the last); the dashed line is the E2E mean (the parts plus tokenization before the queue).",
        f"vLLM's ({REQUEST_QUEUE_TIME.name} / prefill_time / decode_time / e2e_request_latency, means over 1 m).",
        "queue dominant: admission (max_num_seqs, KV cache); prefill: long prompts or a small "
        "--max-num-batched-tokens; decode: large batches or preemptions."), stacked=True)
    layout.add(total_as_dashed_line(breakdown, "D"), 12)
    decomposition = timeseries("TTFT decomposition (means, stacked)", [
        target(f"model:vllm_queue_time_seconds:mean1m{{{MODEL}}}", "scheduler queue {{model_name}}"),
        target(f"model:vllm_prefill_time_seconds:mean1m{{{MODEL}}}", "prefill {{model_name}}"),
        target("instance:batchscope_ttft_gap_seconds:mean1m", "outside the scheduler (client - server TTFT)"),
        target(f"scenario:batchscope_client_ttft_seconds:mean1m{{{SCENARIO}}}", "client TTFT {{scenario}}"),
    ], "s", describe(
        "Queue (arrival in the scheduler to first scheduled) + prefill (to first token) + the client-server gap "
        "(network, API wrapper, tokenization, load generator); the dashed line is the client mean TTFT.",
        "queue and prefill vLLM's, the gap client minus vLLM's TTFT, the total the client's.",
        "the gap dominant: the API server or the client (API-server CPU, load generator saturated); else the "
        "largest part says which knob."), stacked=True)
    layout.add(total_as_dashed_line(decomposition, "D"), 12)


def admission_row(layout: Layout) -> None:
    layout.row("Admission and queue limits: what does vLLM refuse, and which limit binds?")
    for label, width in zip(QUEUE_LABELS, (5, 5, 5, 5, 4), strict=True):
        layout.add(config_label_stat(label), width, 4)
    rejections = ADMISSION_REJECTIONS.exposed_name
    layout.add(timeseries("Admission rejections /s by reason", [
        target(or_not_exposed(f"sum by (model_name, reason) (model:vllm_admission_rejections:rate1m{{{MODEL}}})",
                              f"{rejections}{{{MODEL}}}"), "{{reason}} {{model_name}}"),
        target(f"sum by (scenario, reason) (rate(batchscope_client_admission_rejections_total{{{SCENARIO}}}"
               f"[$__rate_interval]))", "client: {{reason}} {{scenario}}"),
    ], "reqps", describe(
        "Requests per second vLLM's API server refused with HTTP 503 before they reached the engine, by the limit "
        "that refused them (max_num_queued_reqs, max_num_queued_tokens), beside what the load generator counted "
        "as rejected_busy; vLLM 0.32 and later.",
        f"vLLM's {rejections} (one per refused request); the client's from the 503's body.",
        "sustained (VllmAdmissionRejections): the panels below say which limit binds; raise it and requests wait "
        "instead (TTFT), or add capacity. Client above vLLM: a proxy answers 503 with vLLM's body; below: other "
        "clients."), not_exposed=True), 12)
    layout.add(timeseries("Share of arrivals refused", [
        target(f"sum by (model_name, reason) (model:vllm_admission_rejections:ratio_rate1m{{{MODEL}}})",
               "server {{reason}} {{model_name}}"),
        target(f"scenario:batchscope_client_rejected:ratio_rate1m{{{SCENARIO}}}", "client rejected share {{scenario}}"),
    ], "percentunit", describe(
        "Share of the requests arriving that a limit refused, over the last minute (red line: the alert's 5 %).",
        "server = vLLM's refused / (refused + finished); client = rejected_busy over every request that ended "
        "(the summary's rejected_share).",
        "above the line for minutes: the offered load is above what these limits admit (runbook "
        "VllmAdmissionRejections: rejected now vs late later)."), max_value=1,
        steps=thresholds((None, "green"), (0.05, "red"))), 12)
    layout.add(with_config_line(timeseries("In flight at the server (red line: max_num_queued_reqs)", [
        target(f"sum by (model_name) ({NUM_REQUESTS_RUNNING.name}{{{MODEL}}}) + sum by (model_name) "
               f"({NUM_REQUESTS_WAITING.name}{{{MODEL}}})", "running + waiting {{model_name}}"),
    ], "none", describe(
        "Requests vLLM holds, running plus waiting: what --max-num-queued-reqs counts (a request with n > 1 "
        "takes n slots). No red line: no limit set.",
        "vLLM's gauges (the admission check counts the API server's own tally of the same requests).",
        "flat at the red line while rejections rise: this limit refuses; raise it to queue more (TTFT grows) or "
        "raise capacity so the queue drains faster."), axis_label="requests"), "max_num_queued_reqs"), 8)
    layout.add(with_config_line(timeseries("Prefill backlog (red line: max_num_queued_tokens)", [
        target(f"sum by (scenario) (batchscope_client_prefill_backlog_tokens{{{SCENARIO}}})",
               "prompt tokens awaiting a first token {{scenario}}"),
    ], "none", describe(
        "Prompt tokens of the requests sent that have no first token yet, whole prompts: what "
        "--max-num-queued-tokens caps (vLLM refuses once it is reached). No red line: no limit set.",
        "the client's count (vLLM exposes no gauge of it; it counts a prompt until its prefill ends, the client "
        "until its first token, a step later).",
        "at the red line with max_num_queued_tokens rejections: long prompts fill the backlog; size the limit as "
        "TTFT target x prefill tokens/s (vLLM's guidance), or raise --max-num-batched-tokens to prefill faster."),
        axis_label="tokens"), "max_num_queued_tokens"), 8)
    layout.add(with_config_line(timeseries("Running vs max_num_active_seqs (red line)", [
        target(f"sum by (model_name) ({NUM_REQUESTS_RUNNING.name}{{{MODEL}}})", "running {{model_name}}"),
        target(f"sum by (model_name) ({NUM_REQUESTS_WAITING.name}{{{MODEL}}})", "waiting {{model_name}}"),
    ], "none", describe(
        "Requests in the running batch against --max-num-active-seqs, the cap on RUNNING below max_num_seqs. No "
        "red line: not set (max_num_seqs caps alone, see running vs waiting).",
        "vLLM's gauges.",
        "running at the red line with requests waiting and the KV cache low: the active cap holds the batch; "
        "raise it toward max_num_seqs (TPOT rises as the batch grows)."), axis_label="requests"),
        "max_num_active_seqs"), 8)


def total_as_dashed_line(body: timeseries_builders.Panel, ref_id: str) -> timeseries_builders.Panel:
    """The total a stack should reach is drawn as a dashed line on top, not stacked."""
    return body.with_override(*override("byFrameRefID", ref_id, {
        "custom.stacking": {"mode": "none", "group": "A"},
        "custom.fillOpacity": 0,
        "custom.lineStyle": {"fill": "dash", "dash": [10, 10]},
    }))


def why_row(layout: Layout) -> None:
    layout.row("Why: is the batch, the KV cache or preemption the limit?")
    layout.add(with_config_line(timeseries("Tokens per step (red line: max_num_batched_tokens)", [
        target(f"model:vllm_iteration_tokens:mean1m{{{MODEL}}}", "mean tokens per step {{model_name}}"),
    ], "none", describe(
        "Prompt + generation tokens of an engine step, against the step budget max_num_batched_tokens.",
        f"vLLM's ({ITERATION_TOKENS.name}, prompt tokens counted in the step of the first token).",
        "at the red line with long prompts waiting: raise --max-num-batched-tokens; far below it with requests "
        "waiting: the batch (max_num_seqs) or the KV cache binds."), axis_label="tokens"),
        "max_num_batched_tokens"), 8)
    layout.add(timeseries("KV cache usage", [
        target(f"max by (model_name) ({KV_CACHE_USAGE.name}{{{MODEL}}})", "{{model_name}}"),
    ], "percentunit", describe(
        "Share of KV blocks in use, the fullest engine (1 = full; orange line 0.9).",
        f"vLLM's {KV_CACHE_USAGE.name} (gpu_cache_usage_perc before 0.10, mapped by the exporter).",
        "near 1 with preemptions: raise --gpu-memory-utilization (never lower it for preemptions) or lower "
        "--max-num-seqs; low with requests waiting: max_num_seqs binds."), max_value=1,
        steps=thresholds((None, "green"), (0.9, "orange"))), 8)
    layout.add(timeseries("Prefix cache hit rate", [
        target(f"sum by (model_name) (rate({PREFIX_CACHE_HITS.exposed_name}{{{MODEL}}}[$__rate_interval]))"
               f" / sum by (model_name) (rate({PREFIX_CACHE_QUERIES.exposed_name}{{{MODEL}}}[$__rate_interval]))",
               "{{model_name}}"),
    ], "percentunit", describe(
        "Prompt tokens found in the prefix cache / prompt tokens looked up; hit tokens skip prefill. No line "
        "while nothing is looked up.",
        f"vLLM's ({PREFIX_CACHE_HITS.exposed_name} / {PREFIX_CACHE_QUERIES.exposed_name}, rates).",
        "lower than the workload's shared prefixes suggest: the cache evicts them (KV usage near 1), or "
        "prefix caching is off."), max_value=1), 8)
    layout.add(timeseries("Preemptions /s", [
        target(f"model:vllm_preemptions:rate1m{{{MODEL}}}", "{{model_name}}"),
    ], "short", describe(
        "Running requests evicted for lack of KV blocks per second; each is recomputed later (red line: the "
        "alert's 0.1/s).",
        f"vLLM's {NUM_PREEMPTIONS.exposed_name}.",
        "above 0 for long (VllmPreemptionSpike): raise --gpu-memory-utilization or lower --max-num-seqs; lowering "
        "gpu_memory_utilization makes it worse."), axis_label="preemptions/s",
        steps=thresholds((None, "green"), (0.1, "red"))), 8)
    layout.add(timeseries("Preemptions per request", [
        target(or_not_exposed(f"model:vllm_request_preemptions:mean1m{{{MODEL}}}",
                              f"{REQUEST_NUM_PREEMPTIONS.name}_count{{{MODEL}}}"), "mean {{model_name}}"),
        target(f"model:vllm_request_preemptions:histogram_quantile1m{{{MODEL}}}", "p99 {{model_name}}"),
    ], "short", describe(
        "How often the requests finished in the last minute were preempted: mean and p99 (0.30 and later).",
        f"vLLM's {REQUEST_NUM_PREEMPTIONS.name} (one observation per finished request, 0 included).",
        "p99 above 1: some requests are recomputed again and again and their latency explodes; give the "
        "cache room (--gpu-memory-utilization up, --max-num-seqs down)."), not_exposed=True), 8)
    layout.add(timeseries("Recomputed prompt tokens /s", [
        target(or_not_exposed(f"model:vllm_recomputed_prompt_tokens:rate1m{{{MODEL}}}",
                              f"{PROMPT_TOKENS_BY_SOURCE.exposed_name}{{{MODEL}}}"), "{{model_name}}"),
        target(f"sum by (model_name) (rate({PROMPT_TOKENS_BY_SOURCE.exposed_name}{{{MODEL}, source=\"local_compute\"}}"
               f"[$__rate_interval]))", "prompt tokens computed at first admission {{model_name}}"),
    ], "short", describe(
        "Tokens preempted requests had to prefill again per second, beside the prompt tokens computed once; an "
        "estimate (looked up minus found in the prefix cache, minus first admissions), needs prefix caching.",
        f"vLLM's counters ({PREFIX_CACHE_QUERIES.name}/hits, {PROMPT_TOKENS_BY_SOURCE.name}, 0.2x and later).",
        "a large share of the computed prompt tokens: preemption wastes the GPU on recomputation, see "
        "Preemptions /s."), axis_label="tokens/s", not_exposed=True), 8)
    layout.add(heatmap_panel("Prompt lengths (what the load sent)",
                       f"sum by (le) (increase({REQUEST_PROMPT_TOKENS.name}_bucket{{{MODEL}}}[$__rate_interval]))",
                       "short", describe(
                           "Prompt tokens per finished request, as a heatmap over time (buckets 1-2-5 up to "
                           "max_model_len).",
                           f"vLLM's {REQUEST_PROMPT_TOKENS.name} (what the server tokenized, not what the spec "
                           "asked for).",
                           "other than the workload spec says: the prompts are tokenized differently (chat "
                           "template, tokenizer); near max_model_len: requests are cut or refused.")), 12)
    layout.add(heatmap_panel("Output lengths (what was generated)",
                       f"sum by (le) (increase({REQUEST_GENERATION_TOKENS.name}_bucket{{{MODEL}}}[$__rate_interval]))",
                       "short", describe(
                           "Generated tokens per finished request, as a heatmap over time.",
                           f"vLLM's {REQUEST_GENERATION_TOKENS.name}.",
                           "shorter than max_tokens without ignore_eos: EOS ends answers early (Finished by "
                           "reason shows stop), so TPOT and throughput are measured on shorter outputs.")), 12)


def client_row(layout: Layout) -> None:
    layout.row("What does the client see: latency client vs server, its distribution and the client's errors?")
    layout.add(client_vs_server("TTFT", "scenario:batchscope_client_ttft_seconds:histogram_quantile1m",
                                "model:vllm_ttft_seconds:histogram_quantile1m", describe(
                                    "p50 and p99 of the time to first token, client and server on one axis.",
                                    "client = first token chunk minus send (vllm bench serve); server = vLLM's "
                                    "first token minus the API server's arrival.",
                                    "the client far above the server: time outside vLLM (BatchscopeTtftGapHigh);"
                                    " both high: the queue row says why.")), 6)
    layout.add(client_vs_server("TPOT", "scenario:batchscope_client_tpot_seconds:histogram_quantile1m",
                                "model:vllm_tpot_seconds:histogram_quantile1m", describe(
                                    "p50 and p99 of the time per output token after the first.",
                                    "per request (E2E - TTFT) / (output tokens - 1), the client's as vllm bench "
                                    "serve, the server's vLLM's.",
                                    "high: large batches make steps slow (steps/s panel), or preemptions.")), 6)
    layout.add(client_vs_server("ITL", "scenario:batchscope_client_itl_seconds:histogram_quantile1m",
                                "model:vllm_itl_seconds:histogram_quantile1m", describe(
                                    "p50 and p99 of the gap between tokens.",
                                    "client = every gap between token chunks; server = vLLM's, one per engine "
                                    "step per decoding request.",
                                    "p99 far above p50: prefill chunks or preemptions interrupt decoding.")), 6)
    layout.add(client_vs_server("E2E", "scenario:batchscope_client_e2e_seconds:histogram_quantile1m",
                                "model:vllm_e2e_seconds:histogram_quantile1m", describe(
                                    "p50 and p99 of the whole request.",
                                    "client = last token chunk minus send; server = vLLM's finish minus arrival.",
                                    "high with TTFT normal: long outputs or slow decoding (TPOT); both high: "
                                    "the queue.")), 6)
    for title, family, what in (
            ("TTFT distribution", TIME_TO_FIRST_TOKEN.name, "time to first token"),
            ("ITL distribution", INTER_TOKEN_LATENCY.name, "inter-token latency"),
            ("E2E distribution", E2E_REQUEST_LATENCY.name, "end-to-end latency")):
        layout.add(heatmap_panel(title, f"sum by (le) (increase({family}_bucket{{{MODEL}}}[$__rate_interval]))", "s",
                           describe(f"vLLM's {what} histogram as a heatmap over time: each column is the requests "
                                    "(or steps) of one interval by bucket.",
                                    f"vLLM's {family}.",
                                    "two bands: two kinds of requests (cache hits, preempted ones) or a queue "
                                    "that comes and goes; a band creeping up: load past capacity.")), 8)
    layout.add(timeseries("Client errors by outcome", [
        target(f'sum by (outcome) (scenario:batchscope_client_requests:rate1m{{{SCENARIO}, '
               f'outcome!~"ok|rejected_busy"}})', "{{outcome}}"),
    ], "reqps", describe(
        "Finished requests per second that failed, by outcome (http_error, timeout, ...); requests vLLM's "
        "admission check refused (rejected_busy) are in the admission row, not here.",
        "the client's (the load generator's outcomes).",
        "http_error: the server's 5xx (HTTP error ratio); timeout: the server is too slow for the client's "
        "timeout; connection_error: it is down.")), 16)
    layout.add(stat("Load generator saturated", [
        target(f"max(batchscope_client_saturated{{{SCENARIO}}})", "saturated")], "none", describe(
        "1 when the load generator is itself the bottleneck (a sender's CPU >= 90% of its core, or its dispatch "
        "or read lag above 5 ms): the client - server TTFT gap then includes the client's own delay.",
        "the client's (the load generator's own measurement).",
        "rerun with more processes (`--workers N`)."), steps=thresholds((None, "green"), (1, "red"))), 8)


def overview() -> dashboard.Dashboard:
    layout = Layout()
    configuration_row(layout)
    health_row(layout)
    waiting_row(layout)
    admission_row(layout)
    why_row(layout)
    client_row(layout)
    return dashboard_model("batchscope-overview", "vLLM batching — overview",
                           "Is it healthy, where the waiting happens, why, and what the client sees.", layout)
