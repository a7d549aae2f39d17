"""The optional observers of a plan's runs: Prometheus (its recording rules read over each window) and Grafana
(a region per run, by batchscope.runs.annotations). Both are read within a deadline and a byte cap.

PROMETHEUS_QUERIES name recording rules of prometheus/rules/ (tests/tuner/test_runner_parts.py checks each
exists there).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import requests

from batchscope.runs.annotations import GrafanaAnnotator
from batchscope.tuner.compare import changed_params
from batchscope.tuner.plan import Plan, PlannedRun, ServingParams
from batchscope.wire.bounded_read import JSON_MAX_BYTES, BodyTooLarge, FetchTimeout, fetch

QUERY_TIMEOUT_S = 10.0
# Recording rules read per run when a Prometheus is given: name -> PromQL over the window ({w} seconds).
PROMETHEUS_QUERIES = {
    "preemptions_rate_max": "max_over_time(sum(model:vllm_preemptions:rate1m)[{w}s:])",
    "generation_tokens_rate_mean": "avg_over_time(sum(model:vllm_generation_tokens:rate1m)[{w}s:])",
    "prompt_tokens_rate_mean": "avg_over_time(sum(model:vllm_prompt_tokens:rate1m)[{w}s:])",
    "queue_time_mean_max": "max_over_time(max(model:vllm_queue_time_seconds:mean1m)[{w}s:])",
    "client_completions_rate_mean": "avg_over_time(sum(scenario:batchscope_client_completions:rate1m)[{w}s:])",
}


def diff(baseline: ServingParams, params: ServingParams) -> list[str]:
    """What a setting changes, as 'field: old → new' (the exporter's change-log wording)."""
    return [f"{change.name}: {change.arrow()}" for change in changed_params(baseline, params)]


def query_prometheus(url: str | None, start: float, end: float) -> dict[str, float | None]:
    """The recording rules of PROMETHEUS_QUERIES over the window, evaluated at its end; None where empty."""
    if not url:
        return {}
    window = max(int(round(end - start)), 1)
    values: dict[str, float | None] = {}
    session = requests.Session()
    for name, query in PROMETHEUS_QUERIES.items():
        request = requests.Request("GET", url.rstrip("/") + "/api/v1/query",
                                   params={"query": query.format(w=window), "time": f"{end:.3f}"}).prepare()
        try:
            body = fetch(session, str(request.url), deadline=time.monotonic() + QUERY_TIMEOUT_S,
                         max_bytes=JSON_MAX_BYTES)
            result = json.loads(body.text())["data"]["result"]
            values[name] = float(result[0]["value"][1]) if result else None
        except (requests.RequestException, FetchTimeout, BodyTooLarge, ValueError, KeyError, IndexError, TypeError):
            values[name] = None
    return values


def grafana_annotator(plan: Plan) -> GrafanaAnnotator | None:
    """The plan's Grafana annotator (credentials from GRAFANA_TOKEN, or GRAFANA_USER and GRAFANA_PASSWORD), or None
    without a grafana_url. Its warnings print as the tuner's other lines do."""
    if not plan.grafana_url:
        return None
    user = os.environ.get("GRAFANA_USER")
    return GrafanaAnnotator(plan.grafana_url, token=os.environ.get("GRAFANA_TOKEN") or None,
                            basic_auth=(user, os.environ.get("GRAFANA_PASSWORD", "")) if user else None,
                            max_attempts=4, log=_LOG)


def annotate(annotator: GrafanaAnnotator | None, plan: Plan, run: PlannedRun, start: float, stop: float) -> None:
    """One Grafana region over the window, tagged with the setting, its text the change from the baseline."""
    if annotator is None:
        return
    changes = diff(plan.baseline, run.params) or ["baseline"]
    annotator.post(f"{plan.name} {run.name}: " + ", ".join(changes), start, ["batchscope", "tuner", run.setting],
                   end_s=stop)


def _tuner_log() -> logging.Logger:
    log = logging.getLogger("batchscope.tuner")
    if not log.handlers:  # printed like the tuner's other lines, whatever the root logger does
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("tune: %(message)s"))
        log.addHandler(handler)
        log.propagate = False
    return log


_LOG = _tuner_log()
