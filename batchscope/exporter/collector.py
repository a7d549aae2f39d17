"""The exporter's collector: at each scrape, fetch vLLM and the load generator concurrently and merge them.

Yields vLLM's ``vllm:*`` families unchanged (old names mapped, see families.py), the load generator's
``batchscope_client_*`` families, the SLO targets (slo.py), the serving configuration in effect, KV capacity,
change marks, and per target ``batchscope_up``, ``batchscope_scrape_duration_seconds`` and, while it is down,
``batchscope_scrape_error_info`` with the reason. A down, slow, huge, endless or malformed target gives up=0 and
everything else is still served: every upstream read ends by the scrape timeout and within a byte cap (fetch.py),
and scrapes arriving while one collects share its result. Nothing is polled between scrapes. With a live file to
follow (`--follow`, a tuner's `--live-file`), every scrape reads the targets of the run it names, so a plan's
every run is shown.
"""

from __future__ import annotations

import json
import logging
import shlex
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from batchscope.exporter import families
from batchscope.exporter.changes import RESTART_TOLERANCE_S, ChangeTracker
from batchscope.exporter.config import ServingConfig, from_exposed, parse_command
from batchscope.exporter.docker_source import ContainerView, DockerSource
from batchscope.exporter.fetch import Workers
from batchscope.exporter.health import REASONS, DownCause, DownReporter, down_cause
from batchscope.exporter.process_source import ProcessSource, ProcessView
from batchscope.exporter.slo import SloFlags, SloGauge
from batchscope.inputs.validation import read_input_text
from batchscope.runs.live_run import LiveFileError, LiveRun, read_live_file
from batchscope.vllm import catalogue
from batchscope.vllm.scrape import read_text
from batchscope.wire.bounded_read import JSON_MAX_BYTES, FetchTimeout, fetch

log = logging.getLogger("batchscope.exporter")
PREFIXES = {"vllm": catalogue.PREFIX, "loadgen": "batchscope_client_"}  # target -> the families it contributes
JSON_PATHS = ("/v1/models", "/version")
PROCESS_OFF = "reading vLLM's process is off, --vllm-process off"


@dataclass
class TargetScrape:
    """One target's answer at this scrape."""

    up: bool = False
    duration_s: float = 0.0
    families: list[Metric] = field(default_factory=list)
    start_time_s: float | None = None  # process_start_time_seconds: read to tell restarts apart, not re-exposed
    cause: DownCause | None = None  # why it is down; None while up


@dataclass
class _Collection:
    """A collection in flight: the scrapes arriving meanwhile wait for ``done`` and serve its families."""

    done: threading.Event = field(default_factory=threading.Event)
    families: list[Metric] = field(default_factory=list)
    error: Exception | None = None


@dataclass
class ExporterSources:
    """Where the exporter reads from; everything but vllm_url is optional. A live file (``follow``), when it
    holds a run, overrides vllm_url, loadgen_url and the command line with the run's. ``process`` reads the
    command line of the local process serving vllm_url when no command line is given (None: never)."""

    vllm_url: str
    loadgen_url: str | None = None
    vllm_api_key: str | None = None
    vllm_command: str | None = None
    vllm_command_file: Path | None = None
    docker: DockerSource | None = None
    process: ProcessSource | None = None
    timeout_s: float = 2.0
    follow: Path | None = None
    slo: SloFlags = field(default_factory=SloFlags)


@dataclass(frozen=True)
class Targets:
    """What one scrape reads: the followed run's, else the flags'; ``source`` names where the command line came
    from (live_file, file, flag; none)."""

    vllm_url: str
    loadgen_url: str | None
    command: str | list[str] | None
    source: str = "none"


@dataclass(frozen=True)
class CommandLine:
    """The command line a scrape's configuration is read from, where it came from (the label
    ``command_line_source``), and why there is none."""

    command: str | list[str] | None
    source: str
    why_none: str = ""


class BatchscopeCollector(Collector):
    """One Prometheus target carrying both sides of every request and the configuration behind them."""

    def __init__(self, sources: ExporterSources, changes: ChangeTracker,
                 health: DownReporter | None = None, timer: Callable[[], float] = time.perf_counter) -> None:
        self._sources = sources
        self._changes = changes
        self._health = health or DownReporter()
        self._timer = timer  # times each target's fetch and parse (batchscope_scrape_duration_seconds)
        self._parsers = {prefix: families.IncrementalParser() for prefix in PREFIXES.values()}
        self._workers = Workers()
        self._lock = threading.Lock()
        self._in_flight: _Collection | None = None
        self._follow_problem: str | None = None  # the live file's last problem, logged once until it changes
        self._slo = SloGauge(sources.slo)
        # (vLLM's start, its container's start) at the last whole configuration (_config_is_whole)
        self._starts: tuple[float | None, float | None] | None = None

    def collect(self) -> Iterator[Metric]:
        yield from self._shared_collection()

    # ----- one collection at a time -------------------------------------------------------------------

    def _shared_collection(self) -> list[Metric]:
        """The families of the collection in flight, else of a new one. Scrapes arriving during a collection
        wait for it and serve its result, so they never queue behind each other: each answers within one
        collection, itself bounded by the scrape timeout (every upstream wait ends at its deadline)."""
        with self._lock:
            run, leads = self._in_flight, self._in_flight is None
            if run is None:
                run = self._in_flight = _Collection()
        if leads:
            self._lead(run)
        else:
            # no timeout needed: the collection's every upstream wait ends at its deadline, and its other reads
            # are of local files (a live file, a command file)
            run.done.wait()
        if run.error is not None:
            raise run.error
        return run.families

    def _lead(self, run: _Collection) -> None:
        try:
            run.families = self._collect_once()
        except Exception as exc:  # re-raised in every scrape that shared this collection
            run.error = exc
        finally:
            with self._lock:
                self._in_flight = None
            run.done.set()

    def _collect_once(self) -> list[Metric]:
        src = self._sources
        started, deadline = self._timer(), time.monotonic() + src.timeout_s
        targets = self._targets()
        urls = {"vllm": targets.vllm_url + "/metrics"}
        if targets.loadgen_url:
            urls["loadgen"] = targets.loadgen_url + "/metrics"
        pending = {name: self._workers.submit(url, partial(self._scrape, url, PREFIXES[name], deadline))
                   for name, url in urls.items()}
        json_pending = {path: self._workers.submit(targets.vllm_url + path,
                                                   partial(self._json, targets.vllm_url + path, deadline))
                        for path in JSON_PATHS}
        docker_pending = self._workers.submit("docker", src.docker.read) if src.docker else None
        process_pending = (self._workers.submit("process", partial(src.process.read, targets.vllm_url, deadline))
                           if src.process is not None and targets.command is None and src.docker is None else None)
        scrapes = {name: self._finish(name, urls[name], future, deadline, started) for name, future in pending.items()}
        vllm = scrapes["vllm"]
        vllm_families, mappings = families.map_renamed(vllm.families)
        collected = [*vllm_families, _mapping_info(mappings)]
        loadgen = scrapes["loadgen"].families if "loadgen" in scrapes else []
        collected += [*loadgen, self._slo.family(loadgen)]
        container = self._docker(docker_pending, deadline) if docker_pending else None
        if vllm.up:
            card, version = (self._json_result(targets.vllm_url, path, json_pending[path], deadline)
                             for path in JSON_PATHS)
            command = self._command_line(targets, container, process_pending, deadline)
            config = self._config(vllm.families, card, version, container, command.command)
            started_at = vllm.start_time_s if vllm.start_time_s is not None else getattr(container, "started_at", None)
            if self._config_is_whole(container, started_at):
                self._changes.observe(config, started_at, command.why_none)
            collected += self._config_families(config, vllm.families, container, command.source)
        return [*collected, *self._change_families(), *_health_families(scrapes)]

    # ----- where to read ------------------------------------------------------------------------------

    def _targets(self) -> Targets:
        """The followed run's URLs and command line where the live file gives them, else the flags'."""
        src = self._sources
        live = self._live_run()
        if live is None:
            return Targets(src.vllm_url, src.loadgen_url, *self._command())
        if live.command_line:
            return Targets(live.vllm_url, live.loadgen_url or src.loadgen_url, live.command_line, "live_file")
        return Targets(live.vllm_url, live.loadgen_url or src.loadgen_url, *self._command())

    def _live_run(self) -> LiveRun | None:
        path = self._sources.follow
        if path is None or not path.exists():  # no run started yet: the flags' targets
            return None
        try:
            live = read_live_file(path)  # re-read: a tuner replaces it at every run's start
        except LiveFileError as exc:
            if str(exc) != self._follow_problem:
                log.warning("--follow: %s; using the flags' targets", exc)
            self._follow_problem = str(exc)
            return None
        self._follow_problem = None
        return live

    # ----- fetching ------------------------------------------------------------------------------------

    def _scrape(self, url: str, prefix: str, deadline: float) -> TargetScrape:
        """On a worker: fetch and parse one target's /metrics by ``deadline``."""
        started = self._timer()
        result = TargetScrape()
        try:
            text = read_text(self._workers.session(), url, timeout_s=deadline - time.monotonic())
            parsed = self._parsers[prefix].parse(text)
            result.families = families.contributed(parsed, prefix)
            result.start_time_s = next((f.samples[0].value for f in parsed
                                        if f.name == "process_start_time_seconds" and f.samples), None)
            result.up = True
        except Exception as exc:  # whatever the upstream did, the target is down at this scrape; the cause says why
            result.cause = down_cause(exc, self._sources.timeout_s)
        result.duration_s = self._timer() - started
        return result

    def _finish(self, target: str, url: str, pending: Future[TargetScrape], deadline: float,
                started: float) -> TargetScrape:
        """A target's scrape as it stands at ``deadline`` (a timeout if its worker is not done), logged."""
        try:
            scrape = self._workers.wait(pending, deadline)
        except FetchTimeout as exc:
            scrape = TargetScrape(duration_s=self._timer() - started, cause=down_cause(exc, self._sources.timeout_s))
        self._health.observe(target, url, scrape.cause)
        return scrape

    def _json(self, url: str, deadline: float) -> dict:
        """On a worker: one of vLLM's JSON routes by ``deadline``, at most JSON_MAX_BYTES."""
        headers = {"Authorization": f"Bearer {self._sources.vllm_api_key}"} if self._sources.vllm_api_key else {}
        payload = json.loads(fetch(self._workers.session(), url, deadline=deadline, max_bytes=JSON_MAX_BYTES,
                                   headers=headers).text())
        if not isinstance(payload, dict):
            raise ValueError(f"not a JSON object: {type(payload).__name__}")
        return payload

    def _json_result(self, base_url: str, path: str, pending: Future[dict], deadline: float) -> dict | None:
        """A JSON route's answer, or None (logged as target ``vllm /v1/models`` etc.; only while /metrics is up,
        so one outage is one line)."""
        cause, payload = None, None
        try:
            payload = self._workers.wait(pending, deadline)
        except Exception as exc:  # a missing route only leaves its configuration fields unknown
            cause = down_cause(exc, self._sources.timeout_s)
        self._health.observe(f"vllm {path}", base_url + path, cause)
        return payload

    def _docker(self, pending: Future[ContainerView | None], deadline: float) -> ContainerView | None:
        """The container's view if the docker engine answers by ``deadline`` (DockerSource logs its own errors)."""
        cause, view = None, None
        try:
            view = self._workers.wait(pending, deadline)
        except FetchTimeout as exc:
            cause = down_cause(exc, self._sources.timeout_s)
        self._health.observe("docker", "the docker engine", cause)
        return view

    # ----- configuration -------------------------------------------------------------------------------

    def _config_is_whole(self, container: ContainerView | None, started_at: float | None) -> bool:
        """Whether this scrape's configuration may be compared with the last one. With a docker source, the
        container's command line holds the knobs: a scrape without its view (a container being re-created, or an
        engine slow to answer), or with the view of the container that ran before the restart /metrics already
        shows, would turn `MAX_NUM_BATCHED_TOKENS=8192 docker compose up -d` into "vLLM restarted, configuration
        unchanged" and then a second change. Such a scrape is left out; the next whole one counts the change once."""
        if self._sources.docker is None:
            return True
        if container is None:
            return False
        previous, self._starts = self._starts, (started_at, container.started_at)
        if previous is not None and _moved(started_at, previous[0]) and _moved(container.started_at,
                                                                                previous[1]) is False:
            self._starts = previous  # a stale view: compare the next scrape with the last whole one
            return False
        return True

    def _config(self, vllm_families: list[Metric], models: dict | None, version: dict | None,
                container: ContainerView | None, command: str | list[str] | None) -> ServingConfig:
        card = (models or {}).get("data", [None])[0] if models else None
        config = from_exposed(cache_config_labels(vllm_families), card, (version or {}).get("version"))
        if command:
            config = parse_command(command).merged_over(config)
        if container is not None:
            config = container.config.merged_over(config)
        return config

    def _command(self) -> tuple[str | list[str] | None, str]:
        """The command line handed to the exporter and its source: the file, else the flag, else none."""
        src = self._sources
        if src.vllm_command_file is not None and src.vllm_command_file.exists():
            try:
                text = read_input_text(src.vllm_command_file)  # re-read: a tuner rewrites it per setting
                argv = shlex.split(text)
                if argv:
                    return argv, "file"
            except (OSError, ValueError) as exc:  # never the file's text: it may hold a key
                log.warning("--vllm-command-file %s: cannot read a command line (%s); using --vllm-command",
                            src.vllm_command_file, getattr(exc, "strerror", None) or exc)
        return (src.vllm_command, "flag") if src.vllm_command else (None, "none")

    def _command_line(self, targets: Targets, container: ContainerView | None,
                      process_pending: Future[ProcessView] | None, deadline: float) -> CommandLine:
        """The scrape's command line: the container's, else the one handed in (live file, file, flag), else the
        local process's; without one, why not."""
        if container is not None:
            return CommandLine(targets.command, "docker")  # the container's config is merged on top in _config
        if targets.command is not None:
            return CommandLine(targets.command, targets.source)
        if process_pending is None:
            return CommandLine(None, "none", PROCESS_OFF)
        try:
            view = self._workers.wait(process_pending, deadline)
        except FetchTimeout:
            view = ProcessView(None, "the process serving vLLM's port was not found in time")
        return CommandLine(view.argv, "process") if view.argv is not None else CommandLine(None, "none", view.why)

    def _config_families(self, config: ServingConfig, vllm_families: list[Metric],
                         container: ContainerView | None, source: str) -> Iterator[Metric]:
        labels = {**config.labels(), "command_line_source": source}
        info = GaugeMetricFamily("batchscope_vllm_config_info",
                                 "Serving configuration in effect (value 1): the command line (command_line_source: "
                                 "docker, live_file, file, flag, process; none: the knobs vLLM does not expose are "
                                 "unknown), then what vLLM exposes; '' = unknown.",
                                 labels=list(labels))
        info.add_metric(list(labels.values()), 1)
        yield info
        tokens, concurrency = kv_capacity(cache_config_labels(vllm_families), config, container)
        if tokens is not None:
            yield GaugeMetricFamily("batchscope_vllm_kv_cache_capacity_tokens",
                                    "Tokens the KV cache holds at once (vLLM's 'GPU KV cache size': num_gpu_blocks "
                                    "x block_size, or the start-up log line).", value=tokens)
        if concurrency is not None:
            yield GaugeMetricFamily("batchscope_vllm_kv_cache_max_concurrency",
                                    "Requests of max_model_len tokens the KV cache holds at once (vLLM's "
                                    "'Maximum concurrency').", value=concurrency)

    def _change_families(self) -> Iterator[Metric]:
        yield CounterMetricFamily("batchscope_config_changes",
                                  "Serving configuration or vLLM start-time changes seen between scrapes.",
                                  value=self._changes.changes)
        yield CounterMetricFamily("batchscope_config_changes_not_visible",
                                  "Of batchscope_config_changes_total, those seen without a command line before and "
                                  "after: knobs vLLM does not expose were not compared (the annotation says which).",
                                  value=self._changes.not_visible)
        yield GaugeMetricFamily("batchscope_config_last_change_timestamp_seconds",
                                "Unix time of the last configuration change (0 = none seen).",
                                value=self._changes.last_change_s)


def _moved(now: float | None, before: float | None) -> bool | None:
    """Whether a start time moved beyond the restart tolerance; None when either is unknown."""
    if now is None or before is None:
        return None
    return abs(now - before) > RESTART_TOLERANCE_S


def cache_config_labels(vllm_families: list[Metric]) -> dict[str, str]:
    for family in vllm_families:
        if family.name == catalogue.CACHE_CONFIG_INFO.name and family.samples:
            return dict(family.samples[0].labels)
    return {}


def kv_capacity(cache_config: dict[str, str], config: ServingConfig,
                container: ContainerView | None) -> tuple[float | None, float | None]:
    """(KV tokens, max concurrency): from vLLM's cache config when it says, else from the container's log."""
    tokens = None
    if cache_config.get("num_gpu_blocks", "").isdigit() and cache_config.get("block_size", "").isdigit():
        tokens = int(cache_config["num_gpu_blocks"]) * int(cache_config["block_size"])
    elif container is not None:
        tokens = container.kv_cache_tokens
    if tokens is not None and config.max_model_len.isdigit():
        return tokens, tokens / int(config.max_model_len)
    return tokens, container.max_concurrency if container is not None else None


def _mapping_info(mappings: dict[str, str]) -> GaugeMetricFamily:
    family = GaugeMetricFamily("batchscope_vllm_metric_renamed_info",
                               "An old vLLM metric name exposed under today's name at this scrape (value 1).",
                               labels=["source_name", "exposed_name"])
    for old, new in sorted(mappings.items()):
        family.add_metric([old, new], 1)
    return family


def _health_families(scrapes: dict[str, TargetScrape]) -> Iterator[Metric]:
    up = GaugeMetricFamily("batchscope_up", "1 if the target answered a parseable /metrics at this scrape.",
                           labels=["target"])
    duration = GaugeMetricFamily("batchscope_scrape_duration_seconds", "Time to fetch and parse the target.",
                                 labels=["target"])
    error = GaugeMetricFamily("batchscope_scrape_error_info",
                              f"Why the target is down at this scrape (value 1; absent while it is up): "
                              f"{', '.join(REASONS)}.", labels=["target", "reason"])
    for name, scrape in scrapes.items():
        up.add_metric([name], 1 if scrape.up else 0)
        duration.add_metric([name], scrape.duration_s)
        if scrape.cause is not None:
            error.add_metric([name, scrape.cause.reason], 1)
    yield up
    yield duration
    yield error
