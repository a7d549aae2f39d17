"""The committed dashboards against Grafana's own published schema, @grafana/schema 12.3.1 (the Grafana
compose.yaml runs), type-checked by tsc --strict (tests/grafana/schema_check.py). node_modules is installed by
scripts/grafana-schema-setup, which `make test` runs and whose folder it passes on as BATCHSCOPE_GRAFANA_SCHEMA;
without it these tests are skipped."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from tests.grafana.dashboard_queries import DASHBOARD_DIR
from tests.grafana.schema_check import ENV_VAR, SCHEMA_DIR, check

DASHBOARDS = {path.stem: json.loads(path.read_text()) for path in sorted(DASHBOARD_DIR.glob("*.json"))}


@pytest.fixture(scope="module")
def node_modules() -> Path:
    folder = os.environ.get(ENV_VAR)
    if not folder:
        pytest.skip(f"{ENV_VAR} is not set: `make test` sets it ({ENV_VAR}=$(scripts/grafana-schema-setup))")
    return Path(folder) / "node_modules"


def test_the_pins_are_grafanas_release_the_stack_runs():
    package = json.loads((SCHEMA_DIR / "package.json").read_text())
    lock = json.loads((SCHEMA_DIR / "package-lock.json").read_text())
    assert package["devDependencies"]["@grafana/schema"] == "12.3.1"
    assert lock["packages"]["node_modules/@grafana/schema"]["version"] == "12.3.1"
    compose = (Path(__file__).resolve().parents[2] / "compose.yaml").read_text()
    assert "grafana/grafana:12.3.1" in compose


def test_dashboards_conform_to_grafanas_schema(node_modules, tmp_path):
    errors = check(DASHBOARDS, node_modules, tmp_path)
    assert not errors, "\n".join(f"{e.dashboard} {e.panel}: {e.message}" for e in errors)


def test_a_planted_excess_key_is_reported_with_its_panel(node_modules, tmp_path):
    """Grafana 10's heatmap tooltip `show` (Grafana 12 has `mode`) on one panel: tsc names that panel only."""
    planted = copy.deepcopy(DASHBOARDS["overview"])
    [heatmap, *_] = [panel for panel in planted["panels"] if panel["type"] == "heatmap"]
    heatmap["options"]["tooltip"]["show"] = True
    errors = check({"overview": planted}, node_modules, tmp_path)
    assert [(e.dashboard, e.panel) for e in errors] == [
        ("overview", f'panel {heatmap["id"]} {json.dumps(heatmap["title"])}')]
    assert "'\"show\"' does not exist" in errors[0].message


def test_a_missing_required_key_is_reported(node_modules, tmp_path):
    planted = copy.deepcopy(DASHBOARDS["overview"])
    del planted["links"][0]["keepTime"]
    errors = check({"overview": planted}, node_modules, tmp_path)
    assert [e.panel for e in errors] == ["dashboard"] and "keepTime" in errors[0].message
