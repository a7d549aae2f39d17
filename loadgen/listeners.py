"""Locust wiring: every batchscope behaviour hangs off Locust's events (listeners take **kwargs always).

Roles: a *sender* (worker or local runner) runs users and produces records; the *controller* (master or local
runner) merges reports, serves /metrics, writes records and the summary, and ends the run. Messages:
worker -> master deltas ride on report_to_master / worker_report; "batchscope_stop" asks workers to stop,
"batchscope_final" carries each worker's last delta.

Signals: SIGINT or SIGTERM to the controller ends the run as its duration would (in-flight requests aborted and
counted, every sender's last records collected, summary written), with exit status 130. A worker hit by SIGINT
(a terminal's Ctrl-C reaches the whole process group) or SIGTERM sends its last records before it quits.
"""

from __future__ import annotations

import argparse
import logging
import signal
import time
from pathlib import Path

import gevent
from locust import events
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner
from prometheus_client import CollectorRegistry, generate_latest, start_http_server

from loadgen.checks import BadInput, check_out_dir, check_port, check_run_id
from loadgen.control import RunControl
from loadgen.locust_stats import DeferredRequestEvents, take_over_csv
from loadgen.metrics import DEFAULT_METRICS_PORT, ClientMetricsCollector
from loadgen.request import Target
from loadgen.run import LoadRun, work_when_idle
from loadgen.spec import OfflineLoad, SpecError, WorkloadSpec, load_spec
from loadgen.summary import print_summary

log = logging.getLogger("batchscope.loadgen")
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C


@events.init_command_line_parser.add_listener
def add_arguments(parser, **_kwargs) -> None:
    parser.add_argument("--spec", help="workload spec YAML file", env_var="BATCHSCOPE_SPEC")
    # not shown in the web UI: an override may carry the api_key
    parser.add_argument("--spec-set", action="append", default=[], metavar="KEY=VALUE", include_in_web_ui=False,
                       help="override a spec field, e.g. load.rate=8 (repeatable)")
    parser.add_argument("--run-id", default="", help="run identifier (default: start time)")
    parser.add_argument("--out", default="", help="directory for records.jsonl and summary.json")
    parser.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT,
                       help="port of the merged client /metrics (master or local runner); 0 = off")
    parser.add_argument("--metrics-host", default="127.0.0.1", help="address of the client /metrics")
    parser.add_argument("--grafana-url", default="", env_var="BATCHSCOPE_GRAFANA_URL", include_in_web_ui=False,
                        help="Grafana base URL: the web UI's LLM tab links its batchscope dashboards (empty = none)")
    parser.add_argument("--batchscope-spec", default="", include_in_web_ui=False, help=argparse.SUPPRESS)
    parser.add_argument("--batchscope-target", default="", include_in_web_ui=False, help=argparse.SUPPRESS)
    # Locust's master port has no authentication and workers receive the target with its API key: listen on
    # loopback unless told otherwise (--master-bind-host 0.0.0.0 for workers on other hosts)
    parser.set_defaults(master_bind_host="127.0.0.1")


# ----- senders ---------------------------------------------------------------------------------------------


def sender(environment: Environment) -> LoadRun:
    """This process's LoadRun, built on first use (on a worker the spec arrives with the first spawn)."""
    run = getattr(environment, "batchscope_run", None)
    if run is None:
        options = environment.parsed_options
        spec = WorkloadSpec.model_validate_json(options.batchscope_spec)
        runner = environment.runner
        is_worker = isinstance(runner, WorkerRunner)
        workers = max(1, int(getattr(options, "expect_workers", 1) or 1)) if is_worker else 1
        events = DeferredRequestEvents(environment, spec.scenario)
        run = LoadRun(spec, Target.from_json(options.batchscope_target), run_id=options.run_id,
                      worker_index=runner.worker_index if is_worker else 0, workers=workers, on_record=events.add)
        environment.batchscope_run, environment.batchscope_events = run, events
    return run


# ----- controller ------------------------------------------------------------------------------------------


def control(environment: Environment) -> RunControl | None:
    return getattr(environment, "batchscope_control", None)


def _new_control(environment: Environment, spec: WorkloadSpec) -> RunControl:
    """``spec`` as read, with its API key (a dumped spec has its secrets masked)."""
    options = environment.parsed_options
    runner = environment.runner
    if isinstance(runner, MasterRunner):
        stop = lambda: runner.send_message("batchscope_stop", None)  # noqa: E731
        # a worker that sent its last records and quit (its own Ctrl-C) still counts among those that finished
        count = lambda: max(runner.worker_count, len(ctl.senders))  # noqa: E731
        pull = None
    else:
        def stop() -> None:
            sender(environment).stop_now()
            environment.batchscope_events.flush()
            pull(final=True)

        def pull(final: bool = False) -> None:
            run = getattr(environment, "batchscope_run", None)  # none before the first user starts
            if run is not None:
                ctl.merge_report("local", run.report(final=final, as_dicts=False))

        count = lambda: 1  # noqa: E731
    ctl = RunControl(spec=spec, run_id=options.run_id or time.strftime("%Y%m%dT%H%M%S"),
                     host=environment.host or "", out_dir=Path(options.out) if options.out else None,
                     request_stop=stop, sender_count=count, pull=pull)
    return ctl


def tick(environment: Environment, closed_user: type, open_user: type) -> tuple | None:
    """The load shape: who runs, until the run is over and every sender has reported its last records."""
    ctl = control(environment)
    if ctl is None:
        return None
    ctl.refresh()
    if ctl.start_s is None:
        try:
            ctl.begin()
        except SpecError as exc:
            log.error("%s", exc)
            environment.process_exit_code = 2
            return None
        environment.parsed_options.batchscope_target = ctl.target.to_json()  # travels with the spawn
    if not ctl.stopping and ctl.should_end():
        ctl.begin_stop()
    if ctl.stopping and ctl.stopped():
        return None
    load = ctl.spec.load
    if load.mode == "concurrency":
        # all users at once; each delays its first request (LoadRun.start_delay): Locust's spawn rate acts in
        # whole-second batches, too coarse to spread users over a request's duration
        return load.concurrency, load.concurrency, [closed_user]
    senders = environment.runner.worker_count if isinstance(environment.runner, MasterRunner) else 1
    return senders, senders, [open_user]


def dispatch_window(environment: Environment) -> tuple[float, float]:
    """(start, end) of this sender's open-loop schedule."""
    spec = sender(environment).spec
    start = time.time()
    end = float("inf") if isinstance(spec.load, OfflineLoad) else start + spec.warmup_s + spec.duration_s
    return start, end


@events.init.add_listener
def on_init(environment: Environment, runner, web_ui=None, **_kwargs) -> None:
    if isinstance(runner, WorkerRunner):
        _init_worker(environment, runner)
        return
    options = environment.parsed_options
    try:
        spec = load_spec(options.spec, options.spec_set)
        _check_options(options)
    except (SpecError, BadInput) as exc:
        log.error("%s", exc)
        environment.process_exit_code = EXIT_BAD_INPUT
        runner.quit()
        return
    options.batchscope_spec = spec.model_dump_json()  # custom options travel to workers with each spawn
    environment.batchscope_control = _new_control(environment, spec)
    options.run_id = environment.batchscope_control.run_id  # travels to workers: request ids name their run
    ctl = environment.batchscope_control
    gevent.spawn(work_when_idle, lambda: ctl.drain(DRAIN_BATCH))  # store records off the hot path
    # Locust's default Ctrl-C raises KeyboardInterrupt in whichever greenlet runs (a request's, the /metrics
    # server's) and its SIGTERM handler comes only after a headless run's shape ends: take both over
    for signum in (signal.SIGINT, signal.SIGTERM):
        gevent.signal_handler(signum, _end_on_signal, environment, signum)
    if isinstance(runner, MasterRunner):
        runner.register_message("batchscope_final", lambda msg, **_kw: _merge(environment, msg.node_id, msg.data),
                                concurrent=True)
        environment.events.worker_report.add_listener(
            lambda client_id, data, **_kw: _merge(environment, client_id, data.get("batchscope")))
    if options.csv_prefix:
        # stopped at Locust's quit event: after its final stats, before its exit
        stop_csv = take_over_csv(environment)
        environment.events.quit.add_listener(lambda **_kw: stop_csv())
    environment.batchscope_registry = _client_registry(control(environment))
    if options.metrics_port:
        start_http_server(options.metrics_port, addr=options.metrics_host, registry=environment.batchscope_registry)
        log.info("client metrics on http://%s:%d/metrics", options.metrics_host, options.metrics_port)
    if web_ui is not None:
        from loadgen import webui

        webui.install(web_ui, lambda: control(environment), grafana_url=options.grafana_url)


def _client_registry(ctl: RunControl) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(ClientMetricsCollector(
        ctl.stats, in_flight=lambda: ctl.in_flight, run_id=ctl.run_id, scenario=ctl.spec.scenario,
        spec_labels=lambda: workload_labels(ctl.spec), refresh=ctl.refresh))
    return registry


def workload_labels(spec: WorkloadSpec) -> dict[str, str]:
    load = spec.load
    level = {"concurrency": "concurrency", "poisson": "rate", "offline": "requests"}[load.mode]
    return {"mode": load.mode, "endpoint": spec.endpoint, "input_tokens": str(spec.input_tokens),
            "output_tokens": str(spec.output_tokens), "stream": str(spec.stream).lower(),
            "load_level": str(getattr(load, level))}


def _check_options(options) -> None:
    """The flags beside the spec, for `locust -f` runs (`batchscope load` checked them before starting Locust)."""
    if options.run_id:
        check_run_id(options.run_id)
    if options.out:
        check_out_dir(Path(options.out))
    check_port("--metrics-port", options.metrics_port, options.metrics_host)


def _init_worker(environment: Environment, runner: WorkerRunner) -> None:
    runner.register_message("batchscope_stop", lambda msg, **_kw: _stop_worker(environment), concurrent=True)
    environment.events.report_to_master.add_listener(lambda data, **_kw: _attach_report(environment, data))
    # quitting fires in reverse order of registration: added after Locust's own listener (which tells the
    # master this worker quits), this one runs first, so the last records reach the master before the quit.
    # Covers a quit from the master and a SIGTERM to the worker alike.
    environment.events.quitting.add_listener(lambda **_kw: _stop_worker(environment))
    # a terminal's Ctrl-C reaches the workers too: Locust would end them on the spot (KeyboardInterrupt), their
    # in-flight requests and unsent records lost; report everything, then quit
    gevent.signal_handler(signal.SIGINT, _quit_worker, environment)


def _stop_worker(environment: Environment) -> None:
    """Abort this worker's in-flight requests and send every record left; harmless when repeated."""
    run = getattr(environment, "batchscope_run", None)
    if run is None:
        return
    run.stop_now()
    environment.batchscope_events.flush()  # Locust's own final report carries them to the master
    environment.runner.send_message("batchscope_final", run.report(final=True))


def _quit_worker(environment: Environment) -> None:
    log.info("SIGINT: this worker's in-flight requests count as aborted; quitting")
    _stop_worker(environment)
    environment.runner.quit()


DRAIN_BATCH = 16


def _end_on_signal(environment: Environment, signum: int) -> None:
    if environment.process_exit_code == EXIT_INTERRUPTED:
        return  # a second Ctrl-C: the first is already ending the run (bounded by FINAL_REPORT_TIMEOUT_S)
    ctl = control(environment)
    if ctl is not None and ctl.stopping and ctl.stopped():
        # the run ended by itself (its web UI kept Locust up): quitting now interrupts nothing
        environment.runner.quit()
        if environment.web_ui is not None:
            environment.web_ui.stop()
        return
    environment.process_exit_code = EXIT_INTERRUPTED
    log.warning("%s: run interrupted; in-flight requests count as aborted", signal.Signals(signum).name)
    if ctl is not None:
        _finish_stop(ctl)
    environment.runner.quit()
    if environment.web_ui is not None:
        environment.web_ui.stop()  # the web UI's greenlet is what keeps Locust's main loop waiting


def _finish_stop(ctl: RunControl) -> None:
    """Quitting early (Ctrl-C, SIGTERM, the UI's stop): abort what is in flight and collect it first."""
    if ctl.start_s is None:
        return
    if not ctl.stopping:
        ctl.begin_stop()
    while not ctl.stopped():  # bounded: stopped() turns true at the final-report deadline
        gevent.sleep(0.05)


def _attach_report(environment: Environment, data: dict) -> None:
    """Worker side of report_to_master: add this worker's delta to Locust's periodic report."""
    run = getattr(environment, "batchscope_run", None)
    if run is not None:
        data["batchscope"] = run.report()


def _merge(environment: Environment, sender_id: str, report: dict) -> None:
    ctl = control(environment)
    if ctl is not None and report:
        ctl.merge_report(sender_id, report)


@events.quitting.add_listener
def on_quitting(environment: Environment, **_kwargs) -> None:
    ctl = control(environment)
    if ctl is None or isinstance(environment.runner, WorkerRunner):
        return
    _finish_stop(ctl)
    summary = ctl.close()
    if summary is None:
        return
    if ctl.out_dir is not None:  # the merged client metrics as they stood at the end, for after-the-fact use
        (ctl.out_dir / "metrics.prom").write_bytes(generate_latest(environment.batchscope_registry))
    print_summary(summary)
    if not summary.balanced:
        log.error("started %d requests but %d ended in an outcome", summary.started, sum(summary.outcomes.values()))
        environment.process_exit_code = 3
    elif environment.process_exit_code == EXIT_INTERRUPTED:
        log.warning("run interrupted: the summary covers it up to the signal")
    elif summary.failure:
        log.error("run failed: %s", summary.failure)
        environment.process_exit_code = 4
    elif environment.process_exit_code is None or environment.process_exit_code == 1:
        environment.process_exit_code = 0  # failed requests under the spec's threshold are outcomes, not a crash
