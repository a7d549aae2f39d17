"""The dashboards as TypeScript typed by Grafana's published schema (@grafana/schema, pinned in
tests/grafana/schema-check/package.json), and tsc's verdict on them, each error named by its panel.

Each dashboard becomes one object literal typed as the schema's Dashboard (plus the annotation fields it leaves
to the datasource plugins, listed in PRELUDE); each panel's `options` and
`fieldConfig.defaults.custom` are checked (`satisfies`) against that panel plugin's own Options / FieldConfig, so
a key the plugin does not have, a missing required key or a wrong value is an error. The schema's string enums are
read as their values (JSON holds "absolute", not ThresholdsMode.Absolute); nothing else is loosened.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

SCHEMA_DIR = Path(__file__).resolve().parent / "schema-check"
ENV_VAR = "BATCHSCOPE_GRAFANA_SCHEMA"  # the folder holding node_modules (scripts/grafana-schema-setup prints it)
TSC_TIMEOUT_S = 300
TSC_OUTPUT_LIMIT = 1_000_000

_COMPOSABLE = "@grafana/schema/dist/types/raw/composable"
# panel type -> (its module in @grafana/schema, whether the plugin has a custom FieldConfig)
PLUGINS = {
    "timeseries": ("timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen", True),
    "stat": ("stat/panelcfg/x/StatPanelCfg_types.gen", False),
    "table": ("table/panelcfg/x/TablePanelCfg_types.gen", True),
    "heatmap": ("heatmap/panelcfg/x/HeatmapPanelCfg_types.gen", True),
    "bargauge": ("bargauge/panelcfg/x/BarGaugePanelCfg_types.gen", False),
    "text": ("text/panelcfg/x/TextPanelCfg_types.gen", False),
}

PRELUDE = """\
import type { AnnotationQuery, Dashboard } from "@grafana/schema";
IMPORTS

// A string enum as the JSON spells it: its values. Objects keep their keys, optionality and excess-key checks.
type Json<T> = T extends string ? `${T}`
  : T extends (infer U)[] ? Json<U>[]
  : T extends object ? { [K in keyof T]: Json<T[K]> }
  : T;

// What Grafana reads beyond the dashboard schema, which leaves these to the datasource plugins: the Grafana
// datasource's annotation target and a Prometheus annotation query's own fields. Nothing else is added.
type GrafanaAnnotationTarget = { limit?: number; matchAny?: boolean; tags?: string[]; type?: string };
type PrometheusAnnotation = {
  expr?: string; step?: string; useValueForTime?: boolean; titleFormat?: string; textFormat?: string; tagKeys?: string;
};
type Annotation = Omit<Json<AnnotationQuery>, "target"> & PrometheusAnnotation & {
  target?: Json<NonNullable<AnnotationQuery["target"]>> & GrafanaAnnotationTarget;
};
type Checked = Omit<Json<Dashboard>, "annotations"> & { annotations?: { list?: Annotation[] } };
"""

TSCONFIG = {"compilerOptions": {"strict": True, "noEmit": True, "target": "ES2022", "module": "ES2022",
                                "moduleResolution": "node", "skipLibCheck": True, "types": []}}

_MARKER = re.compile(r"^\s*// panel (?P<id>\d+) (?P<title>.*)$")
_ERROR = re.compile(r"^(?P<file>[^()\s]+\.ts)\((?P<line>\d+),(?P<col>\d+)\): error (?P<code>TS\d+): (?P<text>.*)$")


@dataclass(frozen=True)
class SchemaError:
    dashboard: str  # file stem
    panel: str  # 'panel <id> "<title>"', or "dashboard" outside any panel
    message: str  # tsc's, first line and the lines that follow it


def _literal(value: object, indent: int) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False).replace("\n", "\n" + " " * indent)


def _panel_source(panel: dict, indent: int) -> str:
    """One panel as an object literal; its options and custom field config checked against its plugin's types."""
    pad = " " * indent
    kind = panel.get("type")
    plugin = PLUGINS.get(kind) if isinstance(kind, str) else None
    lines = [f"{pad}// panel {panel.get('id')} {json.dumps(panel.get('title', ''), ensure_ascii=False)}", f"{pad}{{"]
    for key, value in panel.items():
        if plugin and key == "options":
            text = f"{_literal(value, indent + 2)} satisfies Json<{kind}.Options>"
        elif plugin and plugin[1] and key == "fieldConfig" and isinstance(value, dict):
            text = _field_config_source(value, kind, indent + 2)
        else:
            text = _literal(value, indent + 2)
        lines.append(f"{pad}  {json.dumps(key)}: {text},")
    lines.append(f"{pad}}},")
    return "\n".join(lines)


def _field_config_source(field_config: dict, kind: str, indent: int) -> str:
    pad = " " * indent
    defaults = field_config.get("defaults", {})
    parts = []
    for key, value in defaults.items():
        text = _literal(value, indent + 4)
        if key == "custom":
            text += f" satisfies Json<{kind}.FieldConfig>"
        parts.append(f"{pad}    {json.dumps(key)}: {text},")
    rest = [f"{pad}  {json.dumps(key)}: {_literal(value, indent + 2)}," for key, value in field_config.items()
            if key != "defaults"]
    return "\n".join(["{", f'{pad}  "defaults": {{', *parts, f"{pad}  }},", *rest, f"{pad}}}"])


def typescript_source(name: str, dashboard: dict) -> str:
    """The dashboard as `export const <name>: Checked = {...}` (the schema's Dashboard), one marked block per
    panel."""
    kinds = sorted({p.get("type") for p in dashboard.get("panels", []) if p.get("type") in PLUGINS})
    imports = "\n".join(f'import type * as {kind} from "{_COMPOSABLE}/{PLUGINS[kind][0]}";' for kind in kinds)
    lines = [PRELUDE.replace("IMPORTS", imports), f"export const {name}: Checked = {{"]
    for key, value in dashboard.items():
        if key == "panels":
            lines.append('  "panels": [')
            lines.extend(_panel_source(panel, 4) for panel in value)
            lines.append("  ],")
        else:
            lines.append(f"  {json.dumps(key)}: {_literal(value, 2)},")
    lines.append("};")
    return "\n".join(lines) + "\n"


def _panel_at(source: str, line: int) -> str:
    """The panel whose block holds ``line`` (1-based): the last panel marker above it."""
    found = "dashboard"
    for text in source.splitlines()[:line]:
        marker = _MARKER.match(text)
        if marker:
            found = f"panel {marker['id']} {marker['title']}"
        elif text.startswith('  "') and not text.startswith('  "panels"'):
            found = "dashboard"
    return found


def check(dashboards: dict[str, dict], node_modules: Path, workdir: Path) -> list[SchemaError]:
    """tsc --strict over every dashboard (file stem -> JSON); [] when all conform."""
    sources = {name: typescript_source(re.sub(r"\W", "_", name), body) for name, body in dashboards.items()}
    for name, source in sources.items():
        (workdir / f"{name}.ts").write_text(source)
    (workdir / "tsconfig.json").write_text(json.dumps({**TSCONFIG, "files": [f"{n}.ts" for n in sources]}))
    link = workdir / "node_modules"
    if not link.exists():
        link.symlink_to(node_modules)
    done = subprocess.run([str(node_modules / ".bin" / "tsc"), "-p", str(workdir), "--pretty", "false"],
                          cwd=workdir, capture_output=True, text=True, timeout=TSC_TIMEOUT_S)
    output = done.stdout[:TSC_OUTPUT_LIMIT]
    errors: list[SchemaError] = []
    for text in output.splitlines():
        found = _ERROR.match(text)
        if found:
            name = Path(found["file"]).stem
            where = _panel_at(sources[name], int(found["line"])) if name in sources else "dashboard"
            errors.append(SchemaError(name, where, f"{found['code']}: {found['text']}"))
        elif errors and text.startswith(" "):
            last = errors[-1]
            errors[-1] = SchemaError(last.dashboard, last.panel, f"{last.message}\n{text.strip()}")
    if done.returncode != 0 and not errors:
        raise RuntimeError(f"tsc failed without a type error: {(done.stdout + done.stderr)[:2000]}")
    return errors
