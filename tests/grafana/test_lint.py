"""Rules the schema cannot express: a threshold line or area needs thresholds of its own (else Grafana draws its
default step at 80), and a link to the project's own dashboards keeps the time range and the variables."""

from __future__ import annotations

import json

import pytest

from tests.grafana.dashboard_queries import DASHBOARD_DIR

DASHBOARDS = {path.stem: json.loads(path.read_text()) for path in sorted(DASHBOARD_DIR.glob("*.json"))}
OWN_TAG = "batchscope"


def threshold_style_without_steps(dashboard: dict) -> list[str]:
    """Panels whose defaults draw thresholds (thresholdsStyle other than off) with no step beyond the base."""
    found = []
    for panel in dashboard.get("panels", []):
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        mode = defaults.get("custom", {}).get("thresholdsStyle", {}).get("mode", "off")
        if mode != "off" and len(defaults.get("thresholds", {}).get("steps", [])) < 2:
            found.append(f"{panel.get('title')}: thresholdsStyle {mode} without threshold steps")
    return found


def _own_links(dashboard: dict) -> list[tuple[str, dict]]:
    links = [("dashboard", link) for link in dashboard.get("links", [])]
    links += [(panel.get("title", ""), link)
              for panel in dashboard.get("panels", []) for link in panel.get("links", [])]
    return [(where, link) for where, link in links
            if link.get("type") == "dashboards" and OWN_TAG in link.get("tags", [])
            or link.get("type") == "link" and str(link.get("url", "")).startswith("/d/")]


def incomplete_links(dashboard: dict) -> list[str]:
    """Links to the project's own dashboards that drop the time range or the variables when followed."""
    return [f"{where}: link {link.get('title')!r} without keepTime and includeVars"
            for where, link in _own_links(dashboard) if not (link.get("keepTime") and link.get("includeVars"))]


@pytest.mark.parametrize("name", DASHBOARDS)
def test_threshold_lines_have_thresholds(name):
    assert not threshold_style_without_steps(DASHBOARDS[name])


@pytest.mark.parametrize("name", DASHBOARDS)
def test_links_keep_time_and_variables(name):
    assert _own_links(DASHBOARDS[name]), "no link to the other batchscope dashboards"
    assert not incomplete_links(DASHBOARDS[name])


def test_the_rules_catch_what_they_name():
    base_only = {"steps": [{"value": None, "color": "green"}]}
    panel = {"title": "knob",
             "fieldConfig": {"defaults": {"custom": {"thresholdsStyle": {"mode": "line"}}, "thresholds": base_only}},
             "links": [{"type": "link", "url": "/d/batchscope-overview", "title": "overview", "keepTime": True}]}
    dashboard = {"panels": [panel], "links": [{"type": "dashboards", "tags": [OWN_TAG], "title": "batchscope"}]}
    assert threshold_style_without_steps(dashboard) == ["knob: thresholdsStyle line without threshold steps"]
    assert incomplete_links(dashboard) == ["dashboard: link 'batchscope' without keepTime and includeVars",
                                           "knob: link 'overview' without keepTime and includeVars"]
