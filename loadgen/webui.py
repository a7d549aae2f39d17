"""The "LLM" tab of Locust's web UI: live client-side LLM figures and the workload spec of the run in progress.

Locust's React UI shows extra tabs declared in ``web_ui.template_args`` (``extended_tabs``, and per tab the
columns of its table in ``extended_tables``) and fills each from the ``extended_stats`` list of the
``/stats/requests`` JSON, which it polls every 2 s while a run goes on; an ``after_request`` hook adds that list.
Only the controller (master or local runner) has a web UI, so the tab shows the merged view of every worker.

The figures follow the end-of-run summary (loadgen/summary.py): latencies of the completed requests of the
measurement window (warm-up excluded) with exact percentiles, in ms; throughputs over the window so far. The
live output tokens/s counts the tokens of completed requests (cheap to keep up to date); the end-of-run summary
counts every token that arrived in the window, so it reads a little higher while long requests are streaming.
"""

from __future__ import annotations

import json
import time
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING

from flask import Response, request

from loadgen.control import RunControl
from loadgen.request import OUTCOMES
from loadgen.spec import WorkloadSpec
from loadgen.summary import Distribution

if TYPE_CHECKING:
    from locust.web import WebUI

TAB = "llm"
LATENCIES = ("ttft", "tpot", "itl", "e2e")
PERCENTILES = ("p50", "p90", "p99")
# column keys without "_" or "name": the UI camel-cases keys and sorts rows by a "name" column by default
COLUMNS = [{"key": "figure", "title": "Figure"}, {"key": "value", "title": "Value"}]
LOAD_LEVEL = {"concurrency": ("concurrency", "users"), "poisson": ("rate", "req/s"), "offline": ("requests", "total")}


class Window:
    """The completed requests of the measurement window seen so far: their latencies and output tokens.

    RunControl.records only grows, so each update reads just the records added since the last one. The values
    sit in float arrays, which Distribution.of turns into numpy arrays without a Python-level copy.
    """

    def __init__(self) -> None:
        self.seen = 0
        self.completed = 0
        self.output_tokens = 0
        self.values = {name: array("d") for name in LATENCIES}
        self.latency = {name: Distribution.of([]) for name in LATENCIES}

    def update(self, ctl: RunControl) -> None:
        start = ctl.start_s + ctl.spec.warmup_s
        ok = [r for r in ctl.records[self.seen:] if r.outcome == "ok" and r.scheduled_s >= start]
        self.seen = len(ctl.records)
        if not ok:
            return  # nothing new: the percentiles stand
        self.completed += len(ok)
        self.output_tokens += sum(r.output_tokens or 0 for r in ok)
        self.values["ttft"].extend(r.ttft_s for r in ok)
        self.values["tpot"].extend(r.tpot_s for r in ok if r.tpot_s)
        self.values["itl"].extend(gap for r in ok for gap in r.itl_s)
        self.values["e2e"].extend(r.e2e_s for r in ok)
        self.latency = {name: Distribution.of(values) for name, values in self.values.items()}


def install(web_ui: WebUI, get_control: Callable[[], RunControl | None]) -> None:
    """Declare the LLM tab and add its rows to every /stats/requests answer."""
    web_ui.template_args["extended_tabs"] = [{"title": "LLM", "key": TAB}]
    web_ui.template_args["extended_tables"] = [{"key": TAB, "structure": COLUMNS}]
    window = Window()

    @web_ui.app.after_request
    def add_llm_stats(response: Response) -> Response:
        if request.endpoint != "locust.request_stats" or response.status_code != 200:
            return response
        # Locust memoizes this response object for 2 s, so the key is set (not appended to) on each pass
        data = response.get_json()
        data["extended_stats"] = [{"key": TAB, "data": rows(get_control(), window)}]
        response.set_data(json.dumps(data))
        return response


def rows(ctl: RunControl | None, window: Window) -> list[dict[str, str]]:
    """The tab's table: latencies, throughput, requests, spec (or a note before the run starts)."""
    if ctl is None or ctl.start_s is None:
        return [row("run", "not started")]
    ctl.refresh()
    window.update(ctl)
    return latency_rows(window) + throughput_rows(ctl, window) + request_rows(ctl) + spec_rows(ctl.spec)


def row(figure: str, value: object) -> dict[str, str]:
    return {"figure": figure, "value": str(value)}


def latency_rows(window: Window) -> list[dict[str, str]]:
    return [row(f"{name.upper()} {p} (ms)", milliseconds(getattr(window.latency[name], p)))
            for name in LATENCIES for p in PERCENTILES]


def milliseconds(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f}"


def throughput_rows(ctl: RunControl, window: Window) -> list[dict[str, str]]:
    measured = (ctl.stop_s or time.time()) - (ctl.start_s + ctl.spec.warmup_s)
    if measured <= 0:
        return [row("measured (s)", "warming up")]
    return [
        row("measured (s)", f"{measured:.1f}"),
        row("completed (ok, in window)", window.completed),
        row("completion throughput (req/s)", f"{window.completed / measured:.3f}"),
        row("output tokens/s (completed requests)", f"{window.output_tokens / measured:.1f}"),
    ]


def request_rows(ctl: RunControl) -> list[dict[str, str]]:
    """Counts since the start, warm-up included (as the summary's outcomes)."""
    outcomes = [row(f"outcome {outcome}", ctl.stats.outcomes[outcome]) for outcome in OUTCOMES]
    return [row("started", ctl.stats.started), *outcomes, row("in flight", ctl.in_flight)]


def spec_rows(spec: WorkloadSpec) -> list[dict[str, str]]:
    load = spec.load
    level, unit = LOAD_LEVEL[load.mode]
    return [
        row("spec scenario", spec.scenario),
        row("spec mode", load.mode),
        row("spec endpoint", spec.endpoint),
        row("spec input tokens", spec.input_tokens),
        row("spec output tokens", spec.output_tokens),
        row(f"spec {level} ({unit})", getattr(load, level)),
        row("spec stream", str(spec.stream).lower()),
    ]
