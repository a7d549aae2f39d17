"""The "LLM" tab of Locust's web UI: one grid of the run's client-side figures, the server's own queue as vLLM's
/metrics reports it, links to the Grafana dashboards, and the workload spec.

Locust's React UI shows extra tabs declared in ``web_ui.template_args`` (``extended_tabs``, and per tab the
columns of its table in ``extended_tables``) and fills each from the ``extended_stats`` list of the
``/stats/requests`` JSON, which it polls every 2 s while a run goes on; an ``after_request`` hook adds that list.
Only the controller (master or local runner) has a web UI, so the tab shows the merged view of every worker.
A tab has one column structure, so the grid is Figure | Mean / value | p50 | p90 | p99: latency rows fill all
four, every other row puts its single value in the second column. Cells are rendered as plain text.

Client figures follow the end-of-run summary (loadgen/summary.py): latencies of the requests completed ok in the
measurement window (loadgen/window.py: ended after warm-up and within duration_s) with exact percentiles, in ms;
throughputs over the window so far. The live output tokens/s counts the tokens of completed requests (cheap to
keep up to date); the end-of-run summary counts every token that arrived in the window, so it reads a little
higher while long requests are streaming.

Server figures come from ``<host>/metrics`` (no API key: vLLM serves /metrics without one), read with a 1 s
timeout at most once per UI poll, over every ``engine``: requests running and waiting (summed), KV cache usage
(averaged), and preemptions in the window (summed) = the counter now minus its value at the first successful
read at or after the window start. A read is made at the window start, so that is the start unless the server
did not answer then; the figure names the baseline's time otherwise. A failed read shows "unreachable".
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import gevent
import requests
from flask import Response, request
from prometheus_client.parser import text_string_to_metric_families

from batchscope.vllm_catalogue import sample_aliases
from loadgen.control import RunControl
from loadgen.request import OUTCOMES
from loadgen.spec import WorkloadSpec
from loadgen.summary import Distribution, generator_line

if TYPE_CHECKING:
    from locust.web import WebUI

TAB = "llm"
LATENCIES = ("ttft", "tpot", "itl", "e2e")
PERCENTILES = ("p50", "p90", "p99")
# column keys without "_" or "name": the UI camel-cases keys and sorts rows by a "name" column by default
COLUMNS = [{"key": "figure", "title": "Figure"}, {"key": "value", "title": "Mean / value"},
           *({"key": p, "title": p} for p in PERCENTILES)]
LOAD_LEVEL = {"concurrency": ("concurrency", "users"), "poisson": ("rate", "req/s"), "offline": ("requests", "total")}
DASHBOARDS = {"overview": "batchscope-overview", "comparison": "batchscope-comparison"}  # fixed Grafana uids

SERVER_TIMEOUT_S = 1.0
# a little under the UI's 2 s poll, so one browser gets a fresh reading on every poll while several browsers
# (each poll runs the hook, even when Locust serves its memoized answer) don't multiply the reads
MIN_READ_INTERVAL_S = 1.5
# sample names as the text format spells them (a counter's samples end in _total), today's first, then older
# releases' (vLLM 0.8 named the KV gauge gpu_cache_usage_perc); a server exposing both is in its deprecation
# window: the new name wins
SERVER_SAMPLES = {key: sample_aliases(name) for key, name in (
    ("running", "vllm:num_requests_running"), ("waiting", "vllm:num_requests_waiting"),
    ("kv", "vllm:kv_cache_usage_perc"), ("preemptions", "vllm:num_preemptions_total"))}
SAMPLE_PREFIXES = tuple(f"{name}{end}" for names in SERVER_SAMPLES.values() for name in names for end in "{ ")


class Window:
    """The LLM tab's latency figures, recomputed from the controller's RunFigures only when a request completed
    since the last poll (exact percentiles of a long run's TTFT take a few ms)."""

    def __init__(self) -> None:
        self.completed = 0
        self.output_tokens = 0
        self.latency = {name: Distribution.of([]) for name in LATENCIES}

    def update(self, ctl: RunControl) -> None:
        figures = ctl.figures
        if figures.completed == self.completed:
            return  # nothing new: the percentiles stand
        self.completed, self.output_tokens = figures.completed, figures.completed_output_tokens
        self.latency = {"ttft": Distribution.of(figures.ttft), "tpot": Distribution.of(figures.tpot),
                        "itl": Distribution.of_sketch(figures.itl), "e2e": Distribution.of(figures.e2e)}


def window_start(ctl: RunControl) -> float:
    return ctl.window().start_s


@dataclass(frozen=True)
class ServerReading:
    """One read of the server's /metrics; a figure is None when the server doesn't expose it."""

    at_s: float
    running: float | None
    waiting: float | None
    kv: float | None
    preemptions: float | None


def parse_server_metrics(text: str, at_s: float) -> ServerReading:
    """The figures of a text exposition: counts summed over their series (one per engine), the KV cache usage
    averaged (each engine has its own pool of the same size, so a sum could pass 100%).

    Only the few wanted sample lines go through prometheus_client's parser: a vLLM /metrics carries thousands
    of histogram lines, whose full parse (~40 ms for 2,000 series, exporter/families.py) would stall this
    gevent loop; the line filter costs ~1.5 µs a line (measured: 3.6 ms for 2,500 lines).
    """
    wanted = "\n".join(line for line in text.splitlines() if line.startswith(SAMPLE_PREFIXES))
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(wanted + "\n"):
        for sample in family.samples:
            values.setdefault(sample.name, []).append(sample.value)
    found = {key: next((values[n] for n in names if n in values), None) for key, names in SERVER_SAMPLES.items()}
    figures = {key: None if v is None else sum(v) / (len(v) if key == "kv" else 1) for key, v in found.items()}
    return ServerReading(at_s=at_s, **figures)


class ServerMetrics:
    """vLLM's /metrics at ``host``, read at most every MIN_READ_INTERVAL_S, plus the preemption baseline.

    ``fetch`` returns the exposition text or raises; the default is a GET with a short timeout, which under
    Locust's gevent monkey-patching waits without blocking the load's greenlets.
    """

    def __init__(self, host: str, fetch: Callable[[str], str] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.url = host.rstrip("/") + "/metrics"
        self.fetch = fetch or get_text
        self.clock = clock
        self.latest: ServerReading | None = None
        self.reachable: bool | None = None  # None until the first read ends
        self.baseline: ServerReading | None = None
        self.last_read_s = -math.inf

    def read(self, window_start_s: float, force: bool = False) -> None:
        """Read unless one started less than MIN_READ_INTERVAL_S ago (or forced); keep the window's first baseline."""
        now = self.clock()
        if now - self.last_read_s < MIN_READ_INTERVAL_S and not force:
            return
        self.last_read_s = now  # before the fetch: a poll arriving meanwhile must not start a second one
        try:
            reading = parse_server_metrics(self.fetch(self.url), now)
        except Exception:  # refused, timed out, an HTTP error, not an exposition: all mean "unreachable"
            self.reachable = False
            return
        self.latest, self.reachable = reading, True
        if self.baseline is None and now >= window_start_s and reading.preemptions is not None:
            self.baseline = reading


def get_text(url: str) -> str:
    # text format asked for explicitly: prometheus_client >= 0.23 answers an OpenMetrics Accept with vllm_ names
    answer = requests.get(url, headers={"Accept": "text/plain"}, timeout=SERVER_TIMEOUT_S)
    answer.raise_for_status()
    return answer.text


def install(web_ui: WebUI, get_control: Callable[[], RunControl | None], grafana_url: str = "") -> None:
    """Declare the LLM tab and add its rows to every /stats/requests answer."""
    web_ui.template_args["extended_tabs"] = [{"title": "LLM", "key": TAB}]
    web_ui.template_args["extended_tables"] = [{"key": TAB, "structure": COLUMNS}]
    window = Window()
    servers: dict[str, ServerMetrics] = {}

    def server(ctl: RunControl) -> ServerMetrics:
        return servers.setdefault(ctl.host, ServerMetrics(ctl.host))

    gevent.spawn(read_at_window_start, get_control, server)

    assert web_ui.app is not None

    @web_ui.app.after_request
    def add_llm_stats(response: Response) -> Response:
        if request.endpoint != "locust.request_stats" or response.status_code != 200:
            return response
        ctl = get_control()
        # Locust memoizes this response object for 2 s, so the key is set (not appended to) on each pass
        data = response.get_json()
        data["extended_stats"] = [{"key": TAB, "data": rows(ctl, window, server(ctl) if ctl else None, grafana_url)}]
        response.set_data(json.dumps(data))
        return response


def read_at_window_start(get_control: Callable[[], RunControl | None],
                         server: Callable[[RunControl], ServerMetrics]) -> None:
    """Take the preemption baseline at the window start even when no browser is polling then."""
    while (ctl := get_control()) is None or ctl.start_s is None:
        gevent.sleep(0.5)
    gevent.sleep(max(0.0, window_start(ctl) - time.time()))
    server(ctl).read(window_start(ctl), force=True)


def rows(ctl: RunControl | None, window: Window, server: ServerMetrics | None = None,
         grafana_url: str = "") -> list[dict[str, str]]:
    """The tab's table: latencies, throughput, requests, server (when given), Grafana links, spec."""
    if ctl is None or ctl.start_s is None:
        return [row("run", "not started")]
    ctl.refresh()
    window.update(ctl)
    server_part = []
    if server is not None:
        server.read(window_start(ctl))
        server_part = server_rows(server, window_start(ctl))
    return (latency_rows(window) + throughput_rows(ctl, window) + request_rows(ctl) + generator_rows(ctl) + server_part
            + grafana_rows(grafana_url) + spec_rows(ctl.spec))


def row(figure: str, value: object, **percentiles: str) -> dict[str, str]:
    return {"figure": figure, "value": str(value), **percentiles}


def latency_rows(window: Window) -> list[dict[str, str]]:
    return [latency_row(f"{name.upper()} (ms)", window.latency[name]) for name in LATENCIES]


def latency_row(figure: str, dist: Distribution) -> dict[str, str]:
    return row(figure, milliseconds(dist.mean), **{p: milliseconds(getattr(dist, p)) for p in PERCENTILES})


def milliseconds(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f}"


def throughput_rows(ctl: RunControl, window: Window) -> list[dict[str, str]]:
    span = ctl.window()
    measured = min(time.time(), span.end_s) - span.start_s
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


def generator_rows(ctl: RunControl) -> list[dict[str, str]]:
    """The live saturation verdict (loadgen/saturation.py): the advice when the generator is the bottleneck."""
    return [row("load generator", generator_line(ctl.saturation.live()))]


def server_rows(server: ServerMetrics, window_start_s: float) -> list[dict[str, str]]:
    figures = ["server running (requests)", "server waiting (requests)", "server KV cache usage (%)",
               preemptions_figure(server.baseline, window_start_s)]
    if server.reachable is None:
        return [row(figure, "-") for figure in figures]
    if not server.reachable:
        return [row(figure, "unreachable") for figure in figures]
    latest, baseline = server.latest, server.baseline
    assert latest is not None  # reachable: read at least once
    preempted = None
    if baseline is not None and latest.preemptions is not None and baseline.preemptions is not None:
        preempted = latest.preemptions - baseline.preemptions
    values = [count(latest.running), count(latest.waiting),
              "-" if latest.kv is None else f"{latest.kv * 100:.1f}", count(preempted)]
    return [row(figure, value) for figure, value in zip(figures, values, strict=True)]


def preemptions_figure(baseline: ServerReading | None, window_start_s: float) -> str:
    # a baseline read well after the window start misses the preemptions before it: say from when it counts
    if baseline is None or baseline.at_s <= window_start_s + SERVER_TIMEOUT_S + MIN_READ_INTERVAL_S:
        return "server preemptions (in window)"
    return f"server preemptions (since {time.strftime('%H:%M:%S', time.localtime(baseline.at_s))})"


def count(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def grafana_rows(grafana_url: str) -> list[dict[str, str]]:
    if not grafana_url:
        return []
    base = grafana_url.rstrip("/")
    return [row(f"Grafana {title}", f"{base}/d/{uid}") for title, uid in DASHBOARDS.items()]


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
