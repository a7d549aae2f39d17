"""Prometheus and Alertmanager configuration: promtool/amtool validation, the promtool unit tests, and the house
rules for alerts (labels, annotations, runbook links) and for test coverage of every alert and recording rule.

promtool and amtool come from Debian's `prometheus` and `prometheus-alertmanager` packages, which `make test`
installs; a missing binary fails these tests rather than skipping them, so the checks cannot silently vanish.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.utils import floatToGoString

from batchscope.exporter import slo
from batchscope.loadgen.spec import DEFAULT_SLO_TPOT_S, DEFAULT_SLO_TTFT_S

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = REPO / "prometheus"
CONFIG = PROMETHEUS / "prometheus.yml"
ALERTMANAGER_CONFIG = PROMETHEUS / "alertmanager" / "alertmanager.yml"
RULE_FILES = sorted((PROMETHEUS / "rules").glob("*.rules.yml")) + sorted((PROMETHEUS / "alerts").glob("*.alerts.yml"))
TEST_FILES = sorted(Path(__file__).parent.glob("*_test.yaml"))
RUNBOOK = REPO / "docs" / "runbook.md"
RUNBOOK_URL = "https://github.com/batchscope/batchscope/blob/main/docs/runbook.md#"
SEVERITIES = {"critical", "warning", "info"}
SERIES = re.compile(r"^\s*([^{\s]+)\s*(?:\{(.*)\})?\s*$")
LABEL = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


def tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: install Debian's {package} package (`make test` does)")
    return path


def run(*argv: str) -> subprocess.CompletedProcess:
    """Run a checker from the repo root, where the paths in the configs and tests are relative to."""
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)


def rules(kind: str) -> list[dict]:
    """Every rule of that kind ('alert' or 'record') in the committed rule files."""
    return [rule for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"] if kind in rule]


def promtool_cases() -> list[dict]:
    """Every test case of every promtool test file."""
    return [case for path in TEST_FILES for case in yaml.safe_load(path.read_text())["tests"]]


def series(text: str) -> tuple[str, dict[str, str]]:
    """('name', labels) of a series written as in promtool tests, e.g. 'up{job="x"}'."""
    name, labels = SERIES.match(text).groups()
    return name, dict(LABEL.findall(labels or ""))


def test_prometheus_config_is_valid():
    result = run(tool("promtool", "prometheus"), "check", "config", str(CONFIG.relative_to(REPO)))
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_config_scrapes_only_the_exporter_prometheus_and_alertmanager():
    """One static target per job (tests rewrite them by job name); vLLM and the load generator only through the
    exporter, since scraping them as well would double every series."""
    config = yaml.safe_load(CONFIG.read_text())
    targets = {job["job_name"]: [t for sc in job["static_configs"] for t in sc["targets"]]
               for job in config["scrape_configs"]}
    assert targets == {"batchscope": ["exporter:9648"], "prometheus": ["localhost:9090"],
                       "alertmanager": ["alertmanager:9093"]}
    assert config["global"]["scrape_interval"] == config["global"]["evaluation_interval"] == "5s"
    assert config["rule_files"] == ["rules/*.rules.yml", "alerts/*.alerts.yml"]
    assert config["alerting"]["alertmanagers"] == [{"static_configs": [{"targets": ["alertmanager:9093"]}]}]


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_rule_file_is_valid(path):
    result = run(tool("promtool", "prometheus"), "check", "rules", str(path.relative_to(REPO)))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: p.name)
def test_promtool_unit_tests_pass(path):
    result = run(tool("promtool", "prometheus"), "test", "rules", str(path.relative_to(REPO)))
    assert result.returncode == 0, result.stdout + result.stderr


def test_alertmanager_config_is_valid():
    result = run(tool("amtool", "prometheus-alertmanager"), "check-config", str(ALERTMANAGER_CONFIG.relative_to(REPO)))
    assert result.returncode == 0, result.stdout + result.stderr


def test_alertmanager_default_receiver_is_one_webhook_that_sends_resolutions():
    """Tests swap this one URL for a local stub."""
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    receiver = next(r for r in config["receivers"] if r["name"] == config["route"]["receiver"])
    assert receiver.keys() - {"name"} == {"webhook_configs"}
    assert [(c["url"], c["send_resolved"]) for c in receiver["webhook_configs"]] == \
        [("http://webhook:5001/alerts", True)]


def test_rule_files_hold_alerts_and_recording_rules():
    assert rules("alert") and rules("record")


@pytest.mark.parametrize("rule", rules("alert"), ids=lambda r: f"{r['alert']}-{r['labels']['severity']}")
def test_alert_follows_house_rules(rule):
    anchors = {heading_anchor(line) for line in RUNBOOK.read_text().splitlines() if line.startswith("#")}
    annotations = rule["annotations"]
    assert rule["labels"]["severity"] in SEVERITIES
    assert rule.get("for"), "every alert needs a `for:`"
    assert annotations["summary"].endswith(".") and "{{" not in annotations["summary"], "summary: static sentence."
    assert "{{" in annotations["description"], "description: templated"
    assert annotations["runbook_url"] == RUNBOOK_URL + rule["alert"].lower()
    assert rule["alert"].lower() in anchors, f"docs/runbook.md has no heading for {rule['alert']}"


def heading_anchor(line: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = line.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@pytest.mark.parametrize("name", sorted({r["alert"] for r in rules("alert")}))
def test_every_alert_has_a_firing_and_a_silent_test_case(name):
    cases = [check for case in promtool_cases() for check in case.get("alert_rule_test", [])
             if check["alertname"] == name]
    assert any(check["exp_alerts"] for check in cases), f"no promtool case where {name} fires"
    assert any(not check["exp_alerts"] for check in cases), f"no promtool case where {name} stays silent"


@pytest.mark.parametrize("record, quantile",
                         sorted({(r["record"], r.get("labels", {}).get("quantile")) for r in rules("record")},
                                key=lambda key: (key[0], key[1] or "")))
def test_every_recording_rule_has_a_checked_value(record, quantile):
    """Each record name, and each quantile of the histogram_quantile ones, appears in some expected sample."""
    checked = [series(sample["labels"]) for case in promtool_cases() for expr in case.get("promql_expr_test", [])
               for sample in expr.get("exp_samples", [])]
    assert any(name == record and labels.get("quantile") == quantile for name, labels in checked), \
        f"no promql_expr_test checks {record}" + (f'{{quantile="{quantile}"}}' if quantile else "")


def group_alerts(group_name: str) -> list[dict]:
    return [rule for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"]
            if group["name"] == group_name for rule in group["rules"]]


@pytest.mark.parametrize("name", sorted({r["alert"] for r in group_alerts("batchscope-vllm-failure-modes")}))
def test_failure_mode_alert_is_tested_before_for_after_it_and_resolved(name):
    """In one case: silent before `for:` has elapsed, firing after, silent again once the state is over."""
    def fired_then(case: dict) -> bool:
        checks = sorted((check for check in case.get("alert_rule_test", []) if check["alertname"] == name),
                        key=lambda check: duration_s(check["eval_time"]))
        firing = [i for i, check in enumerate(checks) if check["exp_alerts"]]
        return bool(firing) and firing[0] > 0 and any(not c["exp_alerts"] for c in checks[firing[-1] + 1:])
    assert any(fired_then(case) for case in promtool_cases()), f"no case where {name} is pending, fires, resolves"


def duration_s(text: str) -> float:
    """A promtool duration such as 90s, 5m or 1h30m in seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    return sum(float(number) * units[unit] for number, unit in re.findall(r"(\d+(?:\.\d+)?)([smh])", text))


def slo_fallback(record: str) -> tuple[float, str]:
    """(value, le) of the constant a target rule falls back to: label_replace(V * group ..., "le", "LE", "", "")."""
    [rule] = [rule for rule in rules("record") if rule["record"] == record]
    value, le = re.search(r'label_replace\(([0-9.]+) \* group .*"le", "([^"]+)", "", ""\)', rule["expr"]).groups()
    return float(value), le


@pytest.mark.parametrize("record, metric, default", [("batchscope:slo_ttft_seconds", "ttft", DEFAULT_SLO_TTFT_S),
                                                     ("batchscope:slo_tpot_seconds", "tpot", DEFAULT_SLO_TPOT_S)])
def test_an_slo_fallback_is_the_defaults_bucket_bound_written_as_the_exposition_writes_it(record, metric, default):
    """The attainment rules select the target's bucket by its `le` text: a value that is no bound of vLLM's
    histogram, or an `le` spelt otherwise than prometheus_client spells it ("2.5", "1.0"), selects nothing. The
    constant is the bound the exporter gives the load spec's default target (batchscope/loadgen/spec.py, the one
    source)."""
    value, le = slo_fallback(record)
    assert value in slo.BUCKETS[metric], f"{record}: {value} is not a bound of vLLM's histogram"
    assert le == floatToGoString(value) == repr(value), f"{record}: le must be {floatToGoString(value)!r}"
    assert value == slo.bucket_bound(metric, default), f"{record}: {value} is not the default's bound"
