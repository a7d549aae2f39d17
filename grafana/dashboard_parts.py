"""The building blocks of the batchscope dashboards: queries, panels, the grid layout, and the parts every
dashboard shares (variables, annotations, the dashboard frame). The dashboards: dashboard_overview.py and
dashboard_comparison.py; the files: generate.py.
"""

from __future__ import annotations

from typing import Any

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
    body: dict[str, Any] = {
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
    defaults: dict[str, Any] = {"unit": unit, "color": {"mode": "palette-classic"}, "custom": custom}
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


def annotation_list() -> list[dict]:
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
        "annotations": {"list": annotation_list()},
        "links": [{"type": "dashboards", "tags": ["batchscope"], "title": "batchscope", "asDropdown": False}],
        "panels": panels,
    }
