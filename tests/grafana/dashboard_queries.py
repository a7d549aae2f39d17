"""Every Prometheus expression of the committed dashboards, and Grafana's variable substitution for them.

Imported by the dashboard tests and by the end-to-end test that runs each query against a live Prometheus:

    for query in dashboard_queries():
        prometheus_query(substitute(query.expr))
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DASHBOARD_DIR = Path(__file__).resolve().parents[2] / "grafana" / "dashboards"

_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?P<selector>.+?)\s*,\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$")
# $__name and ${__name}; Grafana's own variables before the dashboard's so `$__range` is never read as `$__r...`.
_GRAFANA_INTERVALS = "rate_interval|range|interval"
_BUILTIN = re.compile(rf"\$(?:__(?P<bare>{_GRAFANA_INTERVALS})\b|\{{__(?P<braced>{_GRAFANA_INTERVALS})\}})")
# $name, ${name} and ${name:format}
_VARIABLE = re.compile(r"\$(?:(?P<bare>[A-Za-z_][A-Za-z0-9_]*)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?::[a-z]+)?\})")


@dataclass(frozen=True)
class Query:
    dashboard: str  # dashboard uid
    where: str  # panel title, "annotation: <name>" or "variable: <name>"
    expr: str  # PromQL as written in the JSON


def _is_prometheus(datasource: dict | str | None) -> bool:
    return isinstance(datasource, dict) and datasource.get("type") == "prometheus"


def _panels(panels: list[dict]) -> Iterator[dict]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # panels folded into a collapsed row


def _queries(dashboard: dict) -> Iterator[Query]:
    uid = dashboard["uid"]
    for panel in _panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            if _is_prometheus(target.get("datasource", panel.get("datasource"))) and target.get("expr"):
                yield Query(uid, panel["title"], target["expr"])
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if _is_prometheus(annotation.get("datasource")) and annotation.get("expr"):
            yield Query(uid, f"annotation: {annotation['name']}", annotation["expr"])
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query" and _is_prometheus(variable.get("datasource")):
            query = variable["query"]
            text = query.get("query", "") if isinstance(query, dict) else query
            match = _LABEL_VALUES.match(text)
            yield Query(uid, f"variable: {variable['name']}", match.group("selector") if match else text)


def dashboard_queries() -> list[Query]:
    """Panel targets, Prometheus annotations and query variables (label_values(m, l) gives m) of every dashboard."""
    queries: list[Query] = []
    for path in sorted(DASHBOARD_DIR.glob("*.json")):
        queries.extend(_queries(json.loads(path.read_text())))
    return queries


def substitute(expr: str, *, rate_interval: str = "1m", range_: str = "5m", interval: str = "15s",
               variables: dict[str, str] | None = None) -> str:
    """What Grafana sends: its interval variables replaced by durations, dashboard variables (default: every
    value, ".*", as the dashboards' allValue) by regex text."""
    durations = {"rate_interval": rate_interval, "range": range_, "interval": interval}
    expr = _BUILTIN.sub(lambda m: durations[m.group("bare") or m.group("braced")], expr)
    values = variables or {}
    return _VARIABLE.sub(lambda m: values.get(m.group("bare") or m.group("braced"), ".*"), expr)
