"""Writes the batchscope Grafana dashboards (grafana/dashboards/*.json) from plain Python dicts.

    python grafana/generate.py          # rewrite the committed JSON
    python grafana/generate.py --check  # exit 1 if the committed JSON differs from what this file generates

Every query reads the one Prometheus target, the batchscope exporter. Latency and throughput panels reuse the
recording rules in prometheus/rules/batchscope.rules.yml (fixed 1 m windows); a query on raw counters or buckets
uses `rate(...[$__rate_interval])`. Windows over the whole dashboard range are subqueries
`[$__range:$__interval]` so that each step can be joined to the configuration in force at that step.
What each row answers is written in docs/dashboards.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DASHBOARD_DIR = Path(__file__).resolve().parent / "dashboards"

PROMETHEUS = {"type": "prometheus", "uid": "prometheus"}  # fixed uid, see provisioning/datasources
GRAFANA = {"type": "grafana", "uid": "-- Grafana --"}

MODEL = 'model_name=~"$model"'
SCENARIO = 'scenario=~"$scenario"'
# The exporter's info metric names the model `served_model_name`, the value vLLM puts in `model_name`.
CONFIG_INFO = 'batchscope_vllm_config_info{served_model_name=~"$model"}'
# The knobs a run comparison is keyed on; every other label of the info metric is left out of the rows.
CONFIG_LABELS = ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization", "max_model_len")
CONFIG_BY = ", ".join(CONFIG_LABELS)

QUOTED_OK = '"ok"'
QUANTILES = 'quantile=~"0.5|0.99"'  # two of the three recorded quantiles keep client-vs-server panels readable


# --- building blocks -------------------------------------------------------------------------------------------


def target(expr: str, legend: str = "", **extra) -> dict:
    """One Prometheus query; refIds are filled in by the panel."""
    return {"datasource": PROMETHEUS, "expr": expr, "legendFormat": legend, **extra}


def instant(expr: str, legend: str = "", **extra) -> dict:
    """The value now only: a configuration that has since changed does not show up as a second series."""
    return target(expr, legend, instant=True, range=False, **extra)


def instant_table(expr: str, **extra) -> dict:
    """An instant query returned as a table: labels become columns, the value becomes `Value #<refId>`."""
    return instant(expr, format="table", **extra)


def panel(kind: str, title: str, targets: list[dict], unit: str, description: str = "", **fields) -> dict:
    """A data panel. Units are Grafana's names for base units: s, reqps, percentunit, short, none."""
    for index, query in enumerate(targets):
        query.setdefault("refId", chr(ord("A") + index))
    body = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": PROMETHEUS,
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {},
    }
    for key, value in fields.items():
        if isinstance(value, dict) and isinstance(body.get(key), dict):
            body[key] = {**body[key], **value}
        else:
            body[key] = value
    return body


def timeseries(title: str, targets: list[dict], unit: str, description: str = "", *, stacked: bool = False,
               axis_label: str = "", min_value: float | None = 0, max_value: float | None = None) -> dict:
    custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10 if stacked else 0, "showPoints": "never",
              "axisLabel": axis_label, "stacking": {"mode": "normal" if stacked else "none", "group": "A"},
              "thresholdsStyle": {"mode": "off"}}
    defaults = {"unit": unit, "color": {"mode": "palette-classic"}, "custom": custom}
    if min_value is not None:
        defaults["min"] = min_value
    if max_value is not None:
        defaults["max"] = max_value
    return panel("timeseries", title, targets, unit, description,
                 fieldConfig={"defaults": defaults, "overrides": []},
                 options={"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
                          "tooltip": {"mode": "multi", "sort": "desc"}})


def stat(title: str, targets: list[dict], unit: str, description: str = "", *, text_mode: str = "value") -> dict:
    return panel("stat", title, targets, unit, description,
                 options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                          "textMode": text_mode, "colorMode": "none", "graphMode": "none"})


def config_label_stat(label: str) -> dict:
    """The value of one label of the info metric, shown as the series name (a label is text, not a number)."""
    return stat(label, [instant(CONFIG_INFO, f"{{{{{label}}}}}")],
                "none", f"--{label.replace('_', '-')} of the vLLM server in force now.", text_mode="name")


def with_config_line(body: dict, label: str, applies_to: str = "A") -> dict:
    """Draw a red line at the value of one info-metric label (e.g. max_num_seqs) on a time series panel.

    PromQL cannot turn a label into a sample value, so the line comes from Grafana: an instant table query of
    the info metric (refId "config") is reduced by the "Config from query results" transformation, which
    parses the label's text as a number and sets it as a threshold of the `applies_to` query's fields. Grafana
    always rewrites the first threshold step to -Infinity (the base colour), so the table's first column,
    Time, is mapped first as that transparent base and the label second, as the visible line. The line is the
    configuration in force at the end of the range; the config-change annotations mark where it changed.
    """
    body["targets"].append(instant_table(CONFIG_INFO, refId="config"))
    body["transformations"] = [{
        "id": "configFromData",
        "options": {
            "configRefId": "config",
            "applyTo": {"id": "byFrameRefID", "options": applies_to},
            "mappings": [
                {"fieldName": "Time", "handlerKey": "threshold1",
                 "handlerArguments": {"threshold": {"color": "transparent"}}},
                {"fieldName": label, "handlerKey": "threshold1",
                 "handlerArguments": {"threshold": {"color": "red"}}},
            ],
        },
    }]
    body["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"] = {"mode": "line"}
    return body


class Layout:
    """Places panels left to right in 24-column rows and numbers them, so gridPos never overlaps."""

    def __init__(self) -> None:
        self.panels: list[dict] = []
        self._x = 0
        self._y = 0
        self._row_height = 0

    def row(self, title: str, question: str) -> None:
        self._newline()
        self._place({"type": "row", "title": title, "description": question, "collapsed": False, "panels": []},
                    24, 1)
        self._newline()

    def add(self, body: dict, width: int, height: int = 8) -> None:
        if self._x + width > 24:
            self._newline()
        self._place(body, width, height)

    def _place(self, body: dict, width: int, height: int) -> None:
        body["id"] = len(self.panels) + 1
        body["gridPos"] = {"x": self._x, "y": self._y, "w": width, "h": height}
        self.panels.append(body)
        self._x += width
        self._row_height = max(self._row_height, height)

    def _newline(self) -> None:
        self._y += self._row_height
        self._x = 0
        self._row_height = 0


# --- dashboard-wide parts --------------------------------------------------------------------------------------


def variables() -> list[dict]:
    def query_variable(name: str, metric: str, label: str) -> dict:
        query = f"label_values({metric}, {label})"
        return {"type": "query", "name": name, "label": name, "datasource": PROMETHEUS, "definition": query,
                "query": query, "refresh": 2, "multi": True, "includeAll": True, "allValue": ".*",
                "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "sort": 1}

    return [query_variable("model", "vllm:num_requests_running", "model_name"),
            query_variable("scenario", "batchscope_client_workload_info", "scenario")]


CONFIG_TEXT = " ".join(f"{label}={{{{{label}}}}}" for label in CONFIG_LABELS)


def annotations() -> list[dict]:
    return [
        {"builtIn": 1, "datasource": GRAFANA, "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
         "name": "Annotations & Alerts", "type": "dashboard",
         "target": {"limit": 100, "matchAny": False, "tags": [], "type": "dashboard"}},
        # What the exporter posts to POST /api/annotations (organization annotations, tags batchscope, config-change).
        {"datasource": GRAFANA, "enable": True, "iconColor": "orange", "name": "Config changes (exporter posts)",
         "target": {"limit": 100, "matchAny": False, "tags": ["config-change"], "type": "tags"}},
        # The same events without Grafana API access: the gauge holds the unix time of the last change, so its
        # value (x 1000, Grafana wants ms) places each change at its exact moment whatever the query step; the
        # join adds the new configuration's labels for the title and text.
        {"datasource": PROMETHEUS, "enable": True, "iconColor": "purple", "name": "Config changes (Prometheus)",
         "expr": f"(batchscope_config_last_change_timestamp_seconds * 1000 > 0) * on (job, instance) "
                 f"group_left ({CONFIG_BY}) batchscope_vllm_config_info",
         "step": "15s", "useValueForTime": True, "titleFormat": "vLLM configuration changed",
         "textFormat": CONFIG_TEXT, "tagKeys": ""},
        {"datasource": PROMETHEUS, "enable": True, "iconColor": "red", "name": "Firing alerts",
         "expr": 'ALERTS{alertstate="firing"}', "step": "15s", "useValueForTime": False,
         "titleFormat": "{{alertname}}", "textFormat": "{{severity}}: {{alertname}} firing",
         "tagKeys": "alertname,severity"},
    ]


def dashboard(uid: str, title: str, description: str, panels: list[dict]) -> dict:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["batchscope", "vllm"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,  # shared crosshair: the same moment on every panel
        "schemaVersion": 39,
        "version": 1,
        "refresh": "5s",
        "time": {"from": "now-15m", "to": "now"},
        "timepicker": {},
        "templating": {"list": variables()},
        "annotations": {"list": annotations()},
        "links": [{"type": "dashboards", "tags": ["batchscope"], "title": "batchscope", "asDropdown": False}],
        "panels": panels,
    }


# --- overview --------------------------------------------------------------------------------------------------


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
        "max_num_seqs"), 8)
    layout.add(timeseries("KV cache usage", [
        target(f"max by (model_name) (vllm:kv_cache_usage_perc{{{MODEL}}})", "{{model_name}}"),
    ], "percentunit", "Share of KV blocks in use (1 = full); near 1 the scheduler preempts.", max_value=1), 8)
    layout.add(timeseries("Preemptions /s", [
        target(f"model:vllm_preemptions:rate1m{{{MODEL}}}", "{{model_name}}"),
    ], "short", "Running requests evicted for lack of KV blocks; each is recomputed later.",
        axis_label="preemptions/s"), 8)
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
    layout.add(decomposition, 12)
    layout.add(with_config_line(timeseries("Tokens per step (red line: max_num_batched_tokens)", [
        target(f"model:vllm_iteration_tokens:mean1m{{{MODEL}}}", "mean tokens per step {{model_name}}"),
    ], "none", "Prompt + generation tokens of an engine step, against the step budget max_num_batched_tokens.",
        axis_label="tokens"), "max_num_batched_tokens"), 12)

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


# --- run comparison --------------------------------------------------------------------------------------------


def per_config(expr: str) -> str:
    """Tag each series with the configuration in force at that instant (the info metric has one series per
    exporter target at a time, so the many-to-one join is safe)."""
    return f"({expr}) * on (job, instance) group_left ({CONFIG_BY}) {CONFIG_INFO}"


def over_range(function: str, expr: str) -> str:
    """`function` over the dashboard range of a per-configuration series, evaluated step by step."""
    return f"{function}(({per_config(expr)})[$__range:$__interval])"


def config_quantile(q: float, histogram: str) -> str:
    """Quantile per configuration from the bucket rates summed over that configuration's steps (exact up to
    bucket resolution; averaging 1 m quantiles would not be)."""
    buckets = over_range("sum_over_time", f"rate({histogram}_bucket{{{SCENARIO}}}[$__rate_interval])")
    return f"histogram_quantile({q}, sum by (le, {CONFIG_BY}) ({buckets}))"


def config_mean(recorded: str) -> str:
    """Mean of a recorded rate over the steps each configuration was in force, summed over scenarios/models."""
    return f"sum by ({CONFIG_BY}) ({over_range('avg_over_time', recorded)})"


def config_error_share() -> str:
    """Share of finished requests that did not end ok, per configuration (0 when every outcome was ok)."""
    def finished(selector: str) -> str:
        rates = f"rate(batchscope_client_requests_total{{{selector}}}[$__rate_interval])"
        return f"sum by ({CONFIG_BY}) ({over_range('sum_over_time', rates)})"

    return f'{finished(SCENARIO + ", outcome!=" + QUOTED_OK)} / {finished(SCENARIO)}'


COMPARISON_COLUMNS = [
    # (column title, expression, unit)
    ("TTFT p50", config_quantile(0.5, "batchscope_client_time_to_first_token_seconds"), "s"),
    ("TTFT p99", config_quantile(0.99, "batchscope_client_time_to_first_token_seconds"), "s"),
    ("TPOT p50", config_quantile(0.5, "batchscope_client_time_per_output_token_seconds"), "s"),
    ("TPOT p99", config_quantile(0.99, "batchscope_client_time_per_output_token_seconds"), "s"),
    ("Completions /s", config_mean(f"scenario:batchscope_client_completions:rate1m{{{SCENARIO}}}"), "reqps"),
    ("Preemptions /s", config_mean(f"model:vllm_preemptions:rate1m{{{MODEL}}}"), "short"),
    ("Errors", config_error_share(), "percentunit"),
]


def comparison_table() -> dict:
    targets = [instant_table(expr) for _, expr, _ in COMPARISON_COLUMNS]
    body = panel("table", "Configurations in the time range", targets, "s",
                 "One row per (max_num_seqs, max_num_batched_tokens, gpu_memory_utilization, max_model_len) seen "
                 "in the range; each figure covers only the steps when that configuration was in force. Client "
                 "figures; select one scenario so rows compare like with like.",
                 options={"showHeader": True, "sortBy": [{"displayName": "max_num_seqs", "desc": False}]})
    # Each instant query is a table whose value column is "Value #<refId>"; merge joins them on the config labels.
    refs = [query["refId"] for query in targets]
    renames = {f"Value #{ref}": title for ref, (title, _, _) in zip(refs, COMPARISON_COLUMNS, strict=True)}
    order = {name: index for index, name in enumerate([*CONFIG_LABELS, *renames])}
    body["transformations"] = [
        {"id": "merge", "options": {}},
        {"id": "organize", "options": {"excludeByName": {"Time": True}, "indexByName": order,
                                       "renameByName": renames}},
    ]
    body["fieldConfig"]["overrides"] = [
        {"matcher": {"id": "byName", "options": title}, "properties": [{"id": "unit", "value": unit}]}
        for title, _, unit in COMPARISON_COLUMNS if unit != "s"
    ]
    return body


def comparison() -> dict:
    layout = Layout()
    layout.row("Run comparison", "What did each configuration seen in the range do to latency, throughput, "
                                 "preemptions and errors?")
    layout.add(comparison_table(), 24, 10)
    layout.row("Over time", "When was each configuration in force, and how did client TTFT p99 move with it?")
    layout.add(timeseries("Client TTFT p99 by configuration", [
        target(per_config(f'scenario:batchscope_client_ttft_seconds:histogram_quantile1m{{{SCENARIO}, '
                          f'quantile="0.99"}}'),
               "max_num_seqs={{max_num_seqs}} max_num_batched_tokens={{max_num_batched_tokens}} "
               "gpu_memory_utilization={{gpu_memory_utilization}} {{scenario}}"),
    ], "s", "The same p99 as the overview, one colour per configuration."), 24)
    return dashboard("batchscope-comparison", "vLLM batching — run comparison",
                     "One row per vLLM configuration seen in the time range.", layout.panels)


# --- files -----------------------------------------------------------------------------------------------------


def render() -> dict[Path, str]:
    """File name -> JSON text, exactly as committed."""
    return {DASHBOARD_DIR / f"{name}.json": json.dumps(build(), indent=2, ensure_ascii=False) + "\n"
            for name, build in (("overview", overview), ("comparison", comparison))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed JSON is out of date")
    args = parser.parse_args(argv)
    stale = [path for path, text in render().items() if not path.exists() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path} differs from grafana/generate.py; run: python grafana/generate.py", file=sys.stderr)
        return 1 if stale else 0
    DASHBOARD_DIR.mkdir(parents=True, exist_ok=True)
    for path, text in render().items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
