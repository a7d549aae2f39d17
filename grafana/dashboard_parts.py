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

# A panel whose family only newer vLLM releases expose shows this instead of an empty graph: the query ends in
# `or` an absent() series of value -1 (a value no count, rate or share takes), mapped to this text.
NOT_EXPOSED = "not exposed by this vLLM"
NOT_EXPOSED_VALUE = -1


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


def describe(shows: str, definition: str, when_bad: str) -> str:
    """A panel's description: what it shows, whose definition it uses (vLLM's or the client's) and what to do when
    it looks bad, in that order and with these words, so every panel reads the same way (the tests check)."""
    return f"{shows} Definition: {definition} When it looks bad: {when_bad}"


def or_not_exposed(expr: str, family: str, legend_label: str = "model_name") -> str:
    """``expr``, or where the server exposes no ``family`` at all (an older vLLM) one series of value -1 whose
    ``legend_label`` reads NOT_EXPOSED, so the legend and the value mapping say why the graph is empty."""
    missing = f"absent({family}) * {NOT_EXPOSED_VALUE}"
    return f'({expr}) or on () label_replace({missing}, "{legend_label}", "{NOT_EXPOSED}", "", "")'


def not_exposed_mapping() -> list[dict]:
    """The value mapping that prints NOT_EXPOSED for the absent() series of or_not_exposed()."""
    return [{"type": "value", "options": {str(NOT_EXPOSED_VALUE): {"text": NOT_EXPOSED, "index": 0}}}]


def thresholds(*steps: tuple[float | None, str]) -> dict:
    """Grafana's absolute thresholds: (from value, colour) pairs, the first from None (-Infinity)."""
    return {"mode": "absolute", "steps": [{"value": value, "color": colour} for value, colour in steps]}


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
               axis_label: str = "", min_value: float | None = 0, max_value: float | None = None,
               steps: dict | None = None, not_exposed: bool = False) -> dict:
    """A time series panel; ``steps`` (thresholds()) are drawn as dashed lines, ``not_exposed`` maps
    or_not_exposed()'s series to its text (and the panel's no-data text says the same)."""
    custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10 if stacked else 0, "showPoints": "never",
              "axisLabel": axis_label, "stacking": {"mode": "normal" if stacked else "none", "group": "A"},
              "thresholdsStyle": {"mode": "dashed" if steps else "off"}}
    defaults: dict[str, Any] = {"unit": unit, "color": {"mode": "palette-classic"}, "custom": custom}
    if min_value is not None:
        defaults["min"] = min_value
    if max_value is not None:
        defaults["max"] = max_value
    if steps:
        defaults["thresholds"] = steps
    if not_exposed:
        defaults["mappings"] = not_exposed_mapping()
        defaults["noValue"] = f"no data (or {NOT_EXPOSED})"
    return panel("timeseries", title, targets, unit, description,
                 fieldConfig={"defaults": defaults, "overrides": []},
                 options={"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
                          "tooltip": {"mode": "multi", "sort": "desc"}})


def stat(title: str, targets: list[dict], unit: str, description: str = "", *, text_mode: str = "value",
         steps: dict | None = None) -> dict:
    """One number per series; with ``steps`` (thresholds()) its background takes the threshold's colour."""
    body = panel("stat", title, targets, unit, description,
                 options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                          "textMode": text_mode, "colorMode": "background" if steps else "none", "graphMode": "none"})
    if steps:
        body["fieldConfig"]["defaults"]["thresholds"] = steps
    return body


def heatmap(title: str, expr: str, unit: str, description: str) -> dict:
    """A histogram's buckets over time: ``expr`` gives one series per `le` (increase per interval), drawn as
    Grafana's heatmap of pre-bucketed data (no recalculation), the y axis in ``unit``."""
    return panel("heatmap", title, [target(expr, "{{le}}", format="heatmap")], unit, description,
                 options={"calculate": False, "cellGap": 1, "showValue": "never",
                          "color": {"mode": "scheme", "scheme": "Oranges", "scale": "exponential", "exponent": 0.5,
                                    "fill": "dark-orange", "reverse": False, "steps": 64},
                          "yAxis": {"axisPlacement": "left", "unit": unit, "reverse": False},
                          "rowsFrame": {"layout": "le"}, "filterValues": {"le": 1e-9},
                          "tooltip": {"show": True, "yHistogram": True}, "legend": {"show": True}})


def config_label_stat(label: str) -> dict:
    """The value of one label of the info metric, shown as the series name (a label is text, not a number)."""
    flag = f"--{label.replace('_', '-')}"
    return stat(label, [instant(CONFIG_INFO, f"{{{{{label}}}}}")], "none",
                describe(f"{flag} of the vLLM server in force now.",
                         "vLLM's flag, as the exporter reads it (docker command line, the given `vllm serve` "
                         "command, then what vLLM exposes).",
                         "empty: the exporter does not know it; give it --vllm-command or --vllm-command-file "
                         "(the alerts that compare against it stay silent meanwhile)."), text_mode="name")


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

    def row(self, question: str) -> None:
        """A row headed by the question its panels answer (a row has a title only in Grafana's schema)."""
        self._newline()
        self._place({"type": "row", "title": question, "collapsed": False, "panels": []}, 24, 1)
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
