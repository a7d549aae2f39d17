"""The state of the "LLM" tab of Locust's web UI, on the controller: the run's client figures, the server's
queue as vLLM's /metrics reports it, the serving configuration and knobs in effect (serving_knobs.py), charts
of these over the run, links to the Grafana dashboards, the workload spec and where the summary is written.

``LlmTab.state()`` is what ``<base>/llm/state`` answers (webui.py serves it, static/llm_tab.js draws it). The
server is read at most once per MIN_READ_INTERVAL_S, bounded in time and bytes (batchscope/vllm/scrape.py), and
not again once the run stops. What each figure counts, the preemption baseline and the charts' bound:
docs/loadgen.md, "The LLM tab".
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gevent
import requests

from batchscope.loadgen.adapter.serving_knobs import KnobView
from batchscope.loadgen.figures import Distribution, generator_line, latencies
from batchscope.loadgen.run import RunControl
from batchscope.loadgen.spec import WorkloadSpec
from batchscope.loadgen.stream import OUTCOMES
from batchscope.vllm import scrape
from batchscope.vllm.catalogue import (
    ADMISSION_REJECTION_REASONS,
    CACHE_CONFIG_INFO,
    KV_CACHE_USAGE,
    NUM_PREEMPTIONS,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    sample_aliases,
)
from batchscope.wire.bounded_read import METRICS_MAX_BYTES

LATENCIES = ("ttft", "tpot", "itl", "e2e")
CHARTED_LATENCIES = ("ttft", "tpot", "itl")
PERCENTILES = ("p50", "p90", "p99")
MS_DECIMALS = 2  # the table's and the charts' latencies alike: a legend's p99 is the table's to the digit
LOAD_LEVEL = {"concurrency": ("concurrency", "users"), "poisson": ("rate", "req/s"), "offline": ("requests", "total")}
DASHBOARDS = {"overview": "batchscope-overview", "comparison": "batchscope-comparison"}  # fixed Grafana uids

SERVER_TIMEOUT_S = 1.0
# a little under the UI's 2 s poll, so one browser gets a fresh reading on every poll while several browsers
# don't multiply the reads
MIN_READ_INTERVAL_S = 1.5
SAMPLE_INTERVAL_S = 2.0  # the charts' step (Locust's own charts poll every 2 s too)
MAX_POINTS = 600  # per series: 20 minutes at 2 s, then thinned (a long run keeps its whole span)
CONFIG_METRIC = CACHE_CONFIG_INFO.exposed_name
# sample names as the text format spells them (a counter's samples end in _total), today's first, then older
# releases' (vLLM 0.8 named the KV gauge gpu_cache_usage_perc); a server exposing both is in its deprecation
# window: the new name wins
SERVER_SAMPLES = {key: sample_aliases(metric.exposed_name) for key, metric in (
    ("running", NUM_REQUESTS_RUNNING), ("waiting", NUM_REQUESTS_WAITING), ("kv", KV_CACHE_USAGE),
    ("preemptions", NUM_PREEMPTIONS))}
SAMPLE_PREFIXES = tuple(f"{name}{end}" for names in (*SERVER_SAMPLES.values(), (CONFIG_METRIC,))
                        for name in names for end in "{ ")


class Window:
    """The LLM tab's window figures, recomputed from the controller's RunFigures at each chart point, only when a
    request completed since the last one (exact percentiles of a long run's TTFT take a few ms)."""

    def __init__(self) -> None:
        self.completed = 0
        self.output_tokens = 0
        self.latency = {name: Distribution.of([]) for name in LATENCIES}
        self.at_s = -math.inf  # when last updated

    def update(self, ctl: RunControl) -> None:
        self.at_s = time.time()
        figures = ctl.figures
        if figures.completed == self.completed:
            return  # nothing new: the percentiles stand
        self.completed, self.output_tokens = figures.completed, figures.completed_output_tokens
        self.latency = latencies(figures)


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
    config: dict[str, str] = field(default_factory=dict)  # CONFIG_METRIC's labels, engine 0's


def parse_server_metrics(text: str, at_s: float) -> ServerReading:
    """The figures of a text exposition: counts summed over their series (one per engine), the KV cache usage
    averaged (each engine has its own pool of the same size, so a sum could pass 100%), the cache config of the
    first engine listed (engines of one server share it).

    Only the few wanted sample lines are parsed (scrape.picked_samples): a vLLM /metrics carries thousands of
    histogram lines, whose full parse (~40 ms for 2,000 series) would stall this gevent loop; the line filter
    costs ~1.5 µs a line (measured: 3.6 ms for 2,500 lines).
    """
    values: dict[str, list[float]] = {}
    config: dict[str, str] = {}
    for sample in scrape.picked_samples(text, SAMPLE_PREFIXES):
        values.setdefault(sample.name, []).append(sample.value)
        if sample.name == CONFIG_METRIC and not config:
            config = {k: v for k, v in sorted(sample.labels.items()) if k != "engine"}
    found = {key: next((values[n] for n in names if n in values), None) for key, names in SERVER_SAMPLES.items()}
    figures = {key: None if v is None else sum(v) / (len(v) if key == "kv" else 1) for key, v in found.items()}
    return ServerReading(at_s=at_s, config=config, **figures)


class ServerMetrics:
    """vLLM's /metrics at ``host``, read at most every MIN_READ_INTERVAL_S, plus the preemption baseline.

    ``fetch`` returns the exposition text or raises; the default is a GET bounded by SERVER_TIMEOUT_S and
    METRICS_MAX_BYTES (scrape.read_text: an endless or dripping answer is a failed read, not a stalled tab),
    which under Locust's gevent monkey-patching waits without blocking the load's greenlets.
    """

    def __init__(self, host: str, fetch: Callable[[str], str] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.url = host.rstrip("/") + "/metrics"
        self.session = requests.Session()  # one connection kept alive across the reads
        self.fetch = fetch or self.get_text
        self.clock = clock
        self.latest: ServerReading | None = None
        self.reachable: bool | None = None  # None until the first read ends
        self.baseline: ServerReading | None = None
        self.last_read_s = -math.inf

    def read(self, window_start_s: float, force: bool = False, keep: Callable[[], bool] = lambda: True) -> None:
        """Read unless one started less than MIN_READ_INTERVAL_S ago (or forced); keep the window's first baseline.
        A reading is dropped when ``keep()`` says no once it is in (the run stopped while it was on its way)."""
        now = self.clock()
        if now - self.last_read_s < MIN_READ_INTERVAL_S and not force:
            return
        self.last_read_s = now  # before the fetch: a poll arriving meanwhile must not start a second one
        try:
            reading = parse_server_metrics(self.fetch(self.url), now)
        # refused, timed out, too large, cut, an HTTP error (scrape.Unreadable), not an exposition (ValueError), or
        # whatever an injected fetch raises: all mean "unreachable", and none may end the Locust master's loop
        except Exception:
            reading = None
        if not keep():
            return
        if reading is None:
            self.reachable = False
            return
        self.latest, self.reachable = reading, True
        if self.baseline is None and now >= window_start_s and reading.preemptions is not None:
            self.baseline = reading

    def get_text(self, url: str) -> str:
        return scrape.read_text(self.session, url, SERVER_TIMEOUT_S, METRICS_MAX_BYTES)

    def preempted(self) -> float | None:
        """Preemptions since the baseline, as of the latest reading."""
        latest, baseline = self.latest, self.baseline
        if latest is None or baseline is None or latest.preemptions is None or baseline.preemptions is None:
            return None
        return latest.preemptions - baseline.preemptions


class History:
    """The charts' series: one point per sample, bounded by MAX_POINTS (thinned by half, the step doubled)."""

    def __init__(self) -> None:
        self.points: list[dict[str, float | None]] = []
        self.stride = 1  # samples per kept point
        self.seen = 0

    def add(self, point: dict[str, float | None], last: bool = False) -> None:
        """Keep ``point`` when its turn comes in the stride, or always when it is the run's ``last``."""
        self.seen += 1
        if (self.seen - 1) % self.stride and not last:
            return
        self.points.append(point)
        if len(self.points) > MAX_POINTS:
            self.points = self.points[::2]
            self.stride *= 2

    def series(self) -> dict[str, list[float | None]]:
        keys = self.points[0].keys() if self.points else ()
        return {key: [point[key] for point in self.points] for key in keys}


class CounterRate:
    """Counters the controller keeps over the whole run (``counts``), per second since the previous chart point."""

    def __init__(self) -> None:
        self.last: tuple[float, dict[str, int]] | None = None  # (when, the counts then)

    def counts(self, ctl: RunControl) -> dict[str, int]:
        raise NotImplementedError

    def per_s(self, ctl: RunControl, now: float) -> dict[str, float | None]:
        assert ctl.start_s is not None
        counts = self.counts(ctl)
        since, before = self.last or (ctl.start_s, dict.fromkeys(counts, 0))
        self.last = (now, counts)
        span = now - since
        return {key: round((count - before[key]) / span, 3) if span > 0 else None for key, count in counts.items()}


class RejectionRate(CounterRate):
    """vLLM's admission rejections by reason: the requests the client counted rejected_busy (the whole run's, as
    the server's queue beside them)."""

    def counts(self, ctl: RunControl) -> dict[str, int]:
        return {f"rejected_{reason}": ctl.stats.admission_rejections.get(reason, 0)
                for reason in ADMISSION_REJECTION_REASONS}


class ThroughputRate(CounterRate):
    """Requests completed ok and output tokens of the finished requests (the whole run's, warm-up included)."""

    def counts(self, ctl: RunControl) -> dict[str, int]:
        return {"completed_per_s": ctl.stats.outcomes["ok"], "output_tokens_per_s": ctl.stats.output_tokens}


def chart_point(ctl: RunControl, window: Window, server: ServerMetrics,
                rates: tuple[CounterRate, ...]) -> dict[str, float | None]:
    """The charts' values now: elapsed seconds, the window's latency percentiles (ms), the server's figures, the
    counters' rates per second (admission rejections, throughput)."""
    assert ctl.start_s is not None
    now = time.time()
    point: dict[str, float | None] = {"t": round(now - ctl.start_s, 2)}
    for rate in rates:
        point.update(rate.per_s(ctl, now))
    for name in CHARTED_LATENCIES:
        for p in PERCENTILES:
            value = getattr(window.latency[name], p)
            point[f"{name}_{p}"] = None if value is None else charted_milliseconds(value)
    latest = server.latest if server.reachable else None
    point["running"] = None if latest is None else latest.running
    point["waiting"] = None if latest is None else latest.waiting
    point["kv"] = None if latest is None or latest.kv is None else round(latest.kv * 100, 2)
    point["preemptions"] = server.preempted() if server.reachable else None
    return point


@dataclass
class LlmTab:
    """The tab's state on the controller: the window's figures, the server's readings, the charts' history."""

    get_control: Callable[[], RunControl | None]
    stopped_outside: Callable[[], bool]  # the run was stopped by other means than its controller (Locust's button)
    grafana_url: str = ""
    knobs: KnobView = field(default_factory=KnobView)
    summary_path: Callable[[], str] = lambda: ""  # where summary.json is, once the run stopped and it is written
    window: Window = field(default_factory=Window)
    history: History = field(default_factory=History)
    rates: tuple[CounterRate, ...] = field(default_factory=lambda: (RejectionRate(), ThroughputRate()))
    servers: dict[str, ServerMetrics] = field(default_factory=dict)
    generator: str = "-"  # the load generator's verdict at the last point (frozen at the stop)
    closed: bool = False  # the charts' last point is in

    def server(self, ctl: RunControl) -> ServerMetrics:
        return self.servers.setdefault(ctl.host, ServerMetrics(ctl.host))

    def over(self, ctl: RunControl) -> bool:
        """The run stopped: its end, a stop asked for, or Locust's Stop button (``stopped_outside``)."""
        return ctl.stopping or self.stopped_outside()

    def sample(self, ctl: RunControl) -> None:
        """Add a point to the charts (while the run is on). The cards' latencies are the window as of this point
        (one computation for both, no yield between it and the point): a legend's p99 is the table's."""
        if self.over(ctl):
            return
        server = self.server(ctl)
        server.read(window_start(ctl), keep=lambda: not self.over(ctl))
        self.knobs.read()
        if not self.over(ctl):
            self.take_point(ctl)

    def take_point(self, ctl: RunControl, last: bool = False) -> None:
        ctl.refresh()
        self.window.update(ctl)
        self.generator = generator_line(ctl.saturation.live())
        self.history.add(chart_point(ctl, self.window, self.server(ctl), self.rates), last=last)

    def close(self, ctl: RunControl) -> None:
        """End the charts on the figures the cards freeze at (the last reading taken while the run was on), once."""
        if not self.closed:
            self.closed = True
            generator = self.generator
            self.take_point(ctl, last=True)
            self.generator = generator  # the verdict while the run went on: after it no request reads a stream

    def state(self) -> dict[str, Any]:
        """What /llm/state answers: the run's state, the cards' rows, the charts' series, the start form's load."""
        ctl = self.get_control()
        load = [] if ctl is None else load_lines(ctl.spec)
        if ctl is None or ctl.start_s is None:
            return {"state": "not started", "frozen": False, "rows": rows(None, self.window), "series": {},
                    "load": load}
        frozen = self.over(ctl)
        if frozen:
            self.close(ctl)
        table = [*rows(ctl, self.window, self.server(ctl), self.grafana_url, self.generator),
                 *knob_rows(self.knobs), *summary_rows(self.summary_path(), frozen)]
        return {"state": "stopped" if frozen else "running", "frozen": frozen, "rows": table,
                "series": self.history.series(), "load": load}


def knob_rows(view: KnobView) -> list[dict[str, str]]:
    source, values = view.values()
    return [row("knobs", "source", source), *(row("knobs", name, value) for name, value in values.items())]


def summary_rows(path: str, frozen: bool) -> list[dict[str, str]]:
    if path:
        return [row("run", "summary.json", path)]
    return [row("run", "summary.json", "being written" if frozen else "written when the run stops")]


def load_lines(spec: WorkloadSpec) -> list[tuple[str, str]]:
    """The spec's load as the start form shows it instead of Locust's users and ramp-up."""
    load = spec.load
    level, unit = LOAD_LEVEL[load.mode]
    lines = [("mode", load.mode), (f"{level} ({unit})", str(getattr(load, level)))]
    if load.mode != "offline":
        lines += [("warm-up (s)", f"{spec.warmup_s:g}"), ("duration (s)", f"{spec.duration_s:g}")]
    return [*lines, ("input / output tokens", f"{spec.input_tokens} / {spec.output_tokens}"),
            ("stream", str(spec.stream).lower())]


def read_at_window_start(get_control: Callable[[], RunControl | None],
                         server: Callable[[RunControl], ServerMetrics]) -> None:
    """Take the preemption baseline at the window start even when no browser is polling then."""
    while (ctl := get_control()) is None or ctl.start_s is None:
        gevent.sleep(0.5)
    gevent.sleep(max(0.0, window_start(ctl) - time.time()))
    server(ctl).read(window_start(ctl), force=True)


def sample_while_running(tab: LlmTab) -> None:
    """Sample the charts every SAMPLE_INTERVAL_S from the run's start to its stop, then once more."""
    while (ctl := tab.get_control()) is None or ctl.start_s is None:
        gevent.sleep(0.5)
    while not tab.over(ctl):
        tab.sample(ctl)
        gevent.sleep(SAMPLE_INTERVAL_S)
    tab.close(ctl)


def rows(ctl: RunControl | None, window: Window, server: ServerMetrics | None = None,
         grafana_url: str = "", generator: str = "-") -> list[dict[str, str]]:
    """The cards' rows (each names its card): latencies and throughput as of the window's last update,
    requests, the generator's verdict, server and serving config (when a server is given), Grafana links,
    spec. The window is updated and the server read by the caller, not here."""
    if ctl is None or ctl.start_s is None:
        return [row("run", "run", "not started")]
    server_part = [] if server is None else server_rows(server, window_start(ctl)) + config_rows(ctl, server)
    return (latency_rows(window) + throughput_rows(ctl, window) + request_rows(ctl)
            + [row("generator", "load generator", generator)] + server_part + grafana_rows(grafana_url)
            + spec_rows(ctl.spec))


def row(card: str, figure: str, value: object, **percentiles: str) -> dict[str, str]:
    return {"card": card, "figure": figure, "value": str(value), **percentiles}


def latency_rows(window: Window) -> list[dict[str, str]]:
    return [latency_row(f"{name.upper()} (ms)", window.latency[name]) for name in LATENCIES]


def latency_row(figure: str, dist: Distribution) -> dict[str, str]:
    return row("latency", figure, milliseconds(dist.mean), **{p: milliseconds(getattr(dist, p)) for p in PERCENTILES})


def charted_milliseconds(seconds: float) -> float:
    """A latency as the charts carry it: rounded as the table shows it (round and format are both correctly
    rounded), so the browser's toFixed draws the table's digits; a finer value re-rounded there gave 1.09 beside
    the table's 1.10."""
    return round(seconds * 1000, MS_DECIMALS)


def milliseconds(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.{MS_DECIMALS}f}"


def throughput_rows(ctl: RunControl, window: Window) -> list[dict[str, str]]:
    span = ctl.window()
    measured = min(window.at_s, span.end_s) - span.start_s
    if measured <= 0:
        return [row("throughput", "measured (s)", "warming up")]
    return [
        row("throughput", "measured (s)", f"{measured:.1f}"),
        row("throughput", "completed (ok, in window)", window.completed),
        row("throughput", "completion throughput (req/s)", f"{window.completed / measured:.3f}"),
        row("throughput", "output tokens/s (completed requests)", f"{window.output_tokens / measured:.1f}"),
        *rejection_rows(ctl, measured),
    ]


def rejection_rows(ctl: RunControl, measured: float) -> list[dict[str, str]]:
    """vLLM's admission rejections that ended in the window (the summary's admission_rejections), their rate and
    their share of the requests that ended there (rejected_share)."""
    figures = ctl.figures
    rejected, share = sum(figures.rejected.values()), figures.rejected_share()
    reasons = ", ".join(f"{reason} {count}" for reason, count in figures.rejected.items() if count)
    return [row("throughput", "rejected by admission (in window)", f"{rejected} ({reasons})" if reasons else "0"),
            row("throughput", "rejection rate (req/s)", f"{rejected / measured:.3f}"),
            row("throughput", "rejected share (of ended in window)", "-" if share is None else f"{share:.1%}")]


def request_rows(ctl: RunControl) -> list[dict[str, str]]:
    """Counts since the start, warm-up included (as the summary's outcomes)."""
    outcomes = [row("requests", f"outcome {outcome}", ctl.stats.outcomes[outcome]) for outcome in OUTCOMES]
    return [row("requests", "started", ctl.stats.started), *outcomes, row("requests", "in flight", ctl.in_flight)]


def server_rows(server: ServerMetrics, window_start_s: float) -> list[dict[str, str]]:
    figures = ["server running (requests)", "server waiting (requests)", "server KV cache usage (%)",
               preemptions_figure(server.baseline, window_start_s)]
    if server.reachable is None:
        return [row("server", figure, "-") for figure in figures]
    if not server.reachable:
        return [row("server", figure, "unreachable") for figure in figures]
    latest = server.latest
    assert latest is not None  # reachable: read at least once
    values = [count(latest.running), count(latest.waiting),
              "-" if latest.kv is None else f"{latest.kv * 100:.1f}", count(server.preempted())]
    return [row("server", figure, value) for figure, value in zip(figures, values, strict=True)]


def config_rows(ctl: RunControl, server: ServerMetrics) -> list[dict[str, str]]:
    """The serving configuration in effect: the model asked for and what the server's cache_config_info says."""
    model = ctl.target.body.get("model", "") if ctl.target is not None else ctl.spec.model
    labels = server.latest.config if server.latest is not None else {}
    told = labels or {"cache_config_info": "not exposed" if server.reachable else "-"}
    return [row("config", "model", model), *(row("config", key, value) for key, value in told.items())]


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
    return [row("links", f"Grafana {title}", f"{base}/d/{uid}") for title, uid in DASHBOARDS.items()]


def spec_rows(spec: WorkloadSpec) -> list[dict[str, str]]:
    load = spec.load
    level, unit = LOAD_LEVEL[load.mode]
    return [row("spec", figure, value) for figure, value in (
        ("scenario", spec.scenario), ("mode", load.mode), ("endpoint", spec.endpoint),
        ("input tokens", spec.input_tokens), ("output tokens", spec.output_tokens),
        (f"{level} ({unit})", getattr(load, level)), ("stream", str(spec.stream).lower()))]
