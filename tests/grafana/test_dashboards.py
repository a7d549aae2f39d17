"""Offline checks of the generated dashboards and the provisioning files (there is no Grafana to load them).

Grafana's own schema, pinned: every dashboard is read into grafana-foundation-sdk's models (generated from
Grafana's schemas, the panel plugins' options and field configs included) and written back; a key the schema
does not know is dropped and an invalid enum value raises, so the round trip must give the JSON back. The rules
dashboard-linter would enforce, reimplemented: units set (and Grafana's), one datasource uid, `$__rate_interval`
in every rate, valid PromQL, and every metric a name the project records or exports. Every panel's description
says whose definition it uses and what to do when it looks bad; a panel of a newer vLLM family says "not exposed
by this vLLM" instead of an empty graph.

Range rule: `rate`/`irate`/`increase` always take `[$__rate_interval]`; a window over the whole dashboard range
is a subquery `[$__range:$__interval]` around them (never `rate(x[$__range])`, which would blur the
configurations in force during the range into one figure).
"""

from __future__ import annotations

import importlib.util
import json
import re
from datetime import timedelta
from pathlib import Path

import promql_parser
import pytest
import yaml
from grafana_foundation_sdk.cog import plugins
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import units
from grafana_foundation_sdk.models.dashboard import Dashboard

from batchscope.vllm.catalogue import CATALOGUE
from tests.grafana.dashboard_queries import DASHBOARD_DIR, dashboard_queries, substitute

ROOT = Path(__file__).resolve().parents[2]
PROVISIONING = ROOT / "grafana" / "provisioning"
DASHBOARDS = {path.stem: json.loads(path.read_text()) for path in sorted(DASHBOARD_DIR.glob("*.json"))}
QUERIES = dashboard_queries()
PROMETHEUS_UID = "prometheus"

# Durations nothing else uses, so the AST tells which Grafana variable a range came from.
RATE_INTERVAL, RANGE, INTERVAL = timedelta(minutes=7, seconds=7), timedelta(minutes=9, seconds=9), timedelta(seconds=11)
SENTINELS = {"rate_interval": "7m7s", "range_": "9m9s", "interval": "11s"}

# Where each exported family is defined (vLLM's in batchscope.vllm.catalogue); prometheus_client adds these
# suffixes to counters and histograms.
METRIC_SOURCES = ["batchscope/loadgen/figures/metrics.py", "batchscope/exporter/collector.py",
                  "batchscope/exporter/families.py"]
SAMPLE_SUFFIXES = ("", "_total", "_bucket", "_sum", "_count")
PROMETHEUS_BUILTINS = {"ALERTS", "ALERTS_FOR_STATE", "up"}
# Keys Grafana reads that the SDK's models leave out: a Prometheus annotation's own fields (the datasource plugin
# reads them, the dashboard schema does not model them) and the refId Grafana 12 wants of an annotation's target
OUTSIDE_SCHEMA = {"annotations": {"step", "tagKeys", "textFormat", "titleFormat", "useValueForTime", "refId"}}
GRAFANA_UNITS = {value for name, value in vars(units).items() if not name.startswith("_") and isinstance(value, str)}
NOT_EXPOSED = "not exposed by this vLLM"


def _load_generator(monkeypatch):
    # generate.py is a script; its dashboards are sibling modules, found as when it runs from its folder
    monkeypatch.syspath_prepend(str(ROOT / "grafana"))
    spec = importlib.util.spec_from_file_location("grafana_generate", ROOT / "grafana" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _data_panels(dashboard: dict) -> list[dict]:
    return [panel for panel in dashboard["panels"] if panel["type"] != "row" and panel.get("targets")]


def _nodes(expr: str) -> list:
    nodes: list = []
    promql_parser.walk(promql_parser.parse(expr), nodes.append)
    return nodes


def _datasource_refs(node, found: list[dict]) -> list[dict]:
    if isinstance(node, dict):
        if isinstance(node.get("datasource"), dict):
            found.append(node["datasource"])
        for value in node.values():
            _datasource_refs(value, found)
    elif isinstance(node, list):
        for value in node:
            _datasource_refs(value, found)
    return found


def _known_metrics() -> set[str]:
    names: set[str] = set()
    found = [metric.name for metric in CATALOGUE]
    for source in METRIC_SOURCES:
        found += re.findall(r'"((?:vllm:|batchscope_)[a-z0-9_:]+)"', (ROOT / source).read_text())
    names.update(name + suffix for name in found for suffix in SAMPLE_SUFFIXES)
    for rules in (ROOT / "prometheus" / "rules").glob("*.yml"):
        for group in yaml.safe_load(rules.read_text())["groups"]:
            names.update(rule["record"] for rule in group["rules"] if "record" in rule)
    return names | PROMETHEUS_BUILTINS


def test_committed_json_is_the_generators_output(monkeypatch):
    rendered = _load_generator(monkeypatch).render()
    assert sorted(rendered) == sorted(DASHBOARD_DIR.glob("*.json")), "a dashboard file without a generator"
    for path, text in rendered.items():
        assert path.read_text() == text, f"{path.name} is stale: run python grafana/generate.py"


def test_uids_titles_and_defaults():
    assert {d["uid"]: d["title"] for d in DASHBOARDS.values()} == {
        "batchscope-overview": "vLLM batching — overview",
        "batchscope-comparison": "vLLM batching — run comparison",
    }
    for dashboard in DASHBOARDS.values():
        assert dashboard["refresh"] == "5s"
        assert dashboard["time"] == {"from": "now-15m", "to": "now"}


@pytest.mark.parametrize("name", DASHBOARDS)
def test_panel_ids_are_unique(name):
    ids = [panel["id"] for panel in DASHBOARDS[name]["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("name", DASHBOARDS)
def test_every_data_panel_has_a_unit(name):
    missing = [p["title"] for p in _data_panels(DASHBOARDS[name]) if not p["fieldConfig"]["defaults"].get("unit")]
    assert not missing


@pytest.mark.parametrize("name", DASHBOARDS)
def test_every_row_is_the_question_it_answers(name):
    rows = [panel for panel in DASHBOARDS[name]["panels"] if panel["type"] == "row"]
    assert rows and all(row["title"].endswith("?") for row in rows)


def test_overview_rows_read_from_health_to_waiting_to_why_to_the_client():
    rows = [panel["title"] for panel in DASHBOARDS["overview"]["panels"] if panel["type"] == "row"]
    assert [row.split(":")[0].split(" ")[0:2] for row in rows] == [
        ["Which", "vLLM"], ["Is", "it"], ["Where", "do"], ["Admission", "and"], ["Why"], ["What", "does"]]



def test_the_admission_row_draws_each_queue_limit_against_what_it_counts():
    """In flight (running + waiting), the client's prefill backlog and running, each under its knob's dashed line
    (the info metric's label turned into a series); the knobs themselves as stats; vLLM's counter of refusals."""
    panels = DASHBOARDS["overview"]["panels"]
    start = next(i for i, panel in enumerate(panels) if panel["title"].startswith("Admission and queue limits"))
    end = next(i for i, panel in enumerate(panels) if i > start and panel["type"] == "row")
    row = panels[start + 1:end]
    stats = [panel["title"] for panel in row if panel["type"] == "stat"]
    assert stats == ["max_num_queued_reqs", "max_num_queued_tokens", "max_num_active_seqs",
                     "long_prefill_token_threshold", "long_prefill_token_threshold_adaptive"]
    drawn = {}
    for panel in row:
        knob = [t for t in panel.get("targets", []) if t["refId"] == "knob"]
        if knob:
            [override] = [o for o in panel["fieldConfig"]["overrides"] if o["matcher"]["options"] == "knob"]
            assert {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}} in override["properties"]
            drawn[knob[0]["legendFormat"]] = " ".join(t["expr"] for t in panel["targets"] if t["refId"] != "knob")
    assert set(drawn) == {"max_num_queued_reqs", "max_num_queued_tokens", "max_num_active_seqs"}
    assert "vllm:num_requests_running" in drawn["max_num_queued_reqs"]
    assert "+ sum by (model_name) (vllm:num_requests_waiting" in drawn["max_num_queued_reqs"]
    assert "batchscope_client_prefill_backlog_tokens" in drawn["max_num_queued_tokens"]
    assert drawn["max_num_active_seqs"].startswith("sum by (model_name) (vllm:num_requests_running")
    exprs = " ".join(t["expr"] for panel in row for t in panel.get("targets", []))
    assert "model:vllm_admission_rejections:rate1m" in exprs and "batchscope_client_rejected:ratio_rate1m" in exprs


def test_rejections_are_their_own_column_and_no_error_in_the_comparison():
    [table] = [p for p in DASHBOARDS["comparison"]["panels"] if p["type"] == "table"]
    renames = table["transformations"][1]["options"]["renameByName"]
    by_title = {title: next(t["expr"] for t in table["targets"] if f"Value #{t['refId']}" == ref)
                for ref, title in renames.items()}
    assert 'outcome="rejected_busy"' in by_title["Rejected"]
    assert 'outcome!~"ok|rejected_busy"' in by_title["Errors"]
    assert "model:vllm_admission_rejections:rate1m" in by_title["Rejections /s (vLLM)"]
    # the queue knobs key the rows too: configurations differing only in a queue limit are not merged
    assert "max_num_queued_reqs, max_num_queued_tokens" in by_title["Rejected"]

def _dropped(original, written, path: tuple[str, ...] = ()) -> list[str]:
    """Every key of ``original`` that ``written`` lacks or changed, as a path."""
    if isinstance(original, dict) and isinstance(written, dict):
        return [found for key, value in original.items()
                for found in ([f"{'/'.join(path)}/{key}"] if key not in written
                              else _dropped(value, written[key], (*path, key)))]
    if isinstance(original, list) and isinstance(written, list) and len(original) == len(written):
        return [found for index, (a, b) in enumerate(zip(original, written, strict=True))
                for found in _dropped(a, b, (*path, str(index)))]
    return [] if original == written else [f"{'/'.join(path)} changed"]


@pytest.mark.parametrize("name", DASHBOARDS)
def test_dashboard_is_valid_against_grafanas_schema(name):
    plugins.register_default_plugins()
    dashboard = DASHBOARDS[name]
    written = json.loads(json.dumps(Dashboard.from_json(dashboard), cls=JSONEncoder))
    outside = [path for path in _dropped(dashboard, written)
               if path.split("/")[-1] not in OUTSIDE_SCHEMA.get(path.split("/")[0], set())]
    assert not outside, f"not in Grafana's schema (or changed by it): {outside}"
    kinds = {panel["type"] for panel in dashboard["panels"]} - {"row"}
    assert kinds <= {"timeseries", "stat", "table", "heatmap"}, kinds  # each has its plugin model in the SDK


@pytest.mark.parametrize("name", DASHBOARDS)
def test_units_are_grafanas(name):
    for panel in _data_panels(DASHBOARDS[name]):
        found = [panel["fieldConfig"]["defaults"]["unit"], panel.get("options", {}).get("yAxis", {}).get("unit")]
        found += [p["value"] for o in panel["fieldConfig"]["overrides"] for p in o["properties"] if p["id"] == "unit"]
        assert {unit for unit in found if unit} <= GRAFANA_UNITS, panel["title"]


@pytest.mark.parametrize("name", DASHBOARDS)
def test_every_panel_says_whose_definition_and_what_to_do_when_bad(name):
    for panel in _data_panels(DASHBOARDS[name]):
        description = panel["description"]
        definition = description.partition(" Definition: ")[2].partition(" When it looks bad: ")
        assert definition[1] and definition[2], f"{panel['title']}: no 'Definition: ... When it looks bad: ...'"
        assert re.search(r"vLLM's|client|exporter's|Prometheus'", definition[0]), panel["title"]


@pytest.mark.parametrize("name", DASHBOARDS)
def test_newer_families_say_not_exposed_rather_than_draw_nothing(name):
    """A query with an absent() fallback labels it NOT_EXPOSED and its panel maps the fallback's -1 to that text."""
    for panel in _data_panels(DASHBOARDS[name]):
        fallbacks = [t["expr"] for t in panel["targets"] if "absent(" in t["expr"]]
        for expr in fallbacks:
            assert f'"{NOT_EXPOSED}"' in expr and "* -1" in expr, panel["title"]
        if fallbacks:
            defaults = panel["fieldConfig"]["defaults"]
            assert defaults["mappings"] == [{"type": "value", "options": {"-1": {"text": NOT_EXPOSED, "index": 0}}}]
            assert NOT_EXPOSED in defaults["noValue"]
    titles = {p["title"] for d in DASHBOARDS.values() for p in _data_panels(d)
              if any("absent(" in t["expr"] for t in p["targets"])}
    if name == "overview":
        assert {"Waiting by reason", "Preemptions per request", "Recomputed prompt tokens /s",
                "API-server CPU", "Admission rejections /s by reason"} <= titles


@pytest.mark.parametrize("name", DASHBOARDS)
def test_grid_fits_24_columns_without_overlap(name):
    taken: set[tuple[int, int]] = set()
    for panel in DASHBOARDS[name]["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def test_prometheus_references_use_the_provisioned_uid():
    provisioned = yaml.safe_load((PROVISIONING / "datasources" / "datasources.yaml").read_text())
    prometheus = [d for d in provisioned["datasources"] if d["type"] == "prometheus"]
    assert [d["uid"] for d in prometheus] == [PROMETHEUS_UID]
    for name, dashboard in DASHBOARDS.items():
        refs = _datasource_refs(dashboard, [])
        assert refs, name
        for ref in refs:
            assert ref in ({"type": "prometheus", "uid": PROMETHEUS_UID}, {"type": "grafana", "uid": "-- Grafana --"})
        for panel in _data_panels(dashboard):
            assert panel["datasource"]["uid"] == PROMETHEUS_UID
            assert all(target["datasource"]["uid"] == PROMETHEUS_UID for target in panel["targets"])


def test_provisioning_files():
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "datasources.yaml").read_text())
    assert datasources["apiVersion"] == 1
    by_uid = {d["uid"]: d for d in datasources["datasources"]}
    assert by_uid["prometheus"]["url"] == "http://prometheus:9090" and by_uid["prometheus"]["isDefault"] is True
    assert by_uid["prometheus"]["jsonData"]["timeInterval"] == "5s"
    assert by_uid["alertmanager"]["type"] == "alertmanager"
    assert by_uid["alertmanager"]["url"] == "http://alertmanager:9093"
    assert by_uid["alertmanager"]["jsonData"]["implementation"] == "prometheus"
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "dashboards.yaml").read_text())
    assert providers["apiVersion"] == 1
    [provider] = providers["providers"]
    assert provider["type"] == "file" and provider["folder"] == "batchscope"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"


def test_queries_cover_panels_annotations_and_variables():
    wheres = {(q.dashboard, q.where) for q in QUERIES}
    for uid in ("batchscope-overview", "batchscope-comparison"):
        assert (uid, "variable: model") in wheres and (uid, "variable: scenario") in wheres
        assert (uid, "annotation: Config changes (Prometheus)") in wheres
        assert (uid, "annotation: Firing alerts") in wheres
    variables = {q.expr for q in QUERIES if q.where.startswith("variable: ")}
    assert variables == {"vllm:num_requests_running", "batchscope_client_workload_info"}


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: f"{q.dashboard}/{q.where}")
def test_expression_parses_after_substitution(query):
    promql_parser.parse(substitute(query.expr))


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: f"{q.dashboard}/{q.where}")
def test_ranges_follow_the_rule(query):
    for node in _nodes(substitute(query.expr, **SENTINELS)):
        if isinstance(node, promql_parser.Call) and node.func.name in ("rate", "irate", "increase"):
            assert node.args[0].range == RATE_INTERVAL, f"{node.func.name} without $__rate_interval"
        if isinstance(node, promql_parser.SubqueryExpr):
            assert (node.range, node.step) == (RANGE, INTERVAL), "subquery not [$__range:$__interval]"


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: f"{q.dashboard}/{q.where}")
def test_metric_names_exist(query):
    known = _known_metrics()
    used = {node.name for node in _nodes(substitute(query.expr)) if isinstance(node, promql_parser.VectorSelector)}
    assert used <= known, f"unknown metrics: {used - known}"


@pytest.mark.parametrize("name", DASHBOARDS)
def test_variables_used_are_defined(name):
    dashboard = DASHBOARDS[name]
    defined = {variable["name"] for variable in dashboard["templating"]["list"]}
    for query in (q for q in QUERIES if q.dashboard == dashboard["uid"]):
        used = set(re.findall(r"\$\{?([A-Za-z][A-Za-z0-9_]*)", query.expr))
        assert used <= defined, f"{query.where}: undefined {used - defined}"
    for variable in dashboard["templating"]["list"]:
        assert variable["multi"] and variable["includeAll"]


@pytest.mark.parametrize("name", DASHBOARDS)
def test_annotations(name):
    annotations = DASHBOARDS[name]["annotations"]["list"]
    assert annotations[0]["builtIn"] == 1 and annotations[0]["datasource"] == {"type": "grafana",
                                                                                 "uid": "-- Grafana --"}
    assert any(a.get("target", {}).get("tags") == ["config-change"] for a in annotations)
    [change] = [a for a in annotations if "batchscope_config_last_change_timestamp_seconds" in a.get("expr", "")]
    assert change["useValueForTime"] is True and "* 1000" in change["expr"]
    assert "{{max_num_seqs}}" in change["textFormat"]
    assert any("ALERTS" in a.get("expr", "") for a in annotations)


def test_substitute_replaces_grafana_and_dashboard_variables():
    expr = 'rate(x{m=~"$model", s=~"${scenario}", t=~"${model:regex}"}[$__rate_interval])[$__range:$__interval]'
    assert substitute(expr, variables={"model": "m"}) == 'rate(x{m=~"m", s=~".*", t=~"m"}[1m])[5m:15s]'
