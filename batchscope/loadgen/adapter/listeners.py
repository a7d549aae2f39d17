"""Locust wiring: the event listeners through which every batchscope behaviour hangs off a Locust run.

Importing this module registers them (listeners take **kwargs always, so new event fields don't break them):
the locustfile's options (options.py), the run's set-up at init for this process's role, the summary at the
run's stop and the exit status at quitting (finish.py). The adapter's other parts: session.py (the run's state
per process and its roles), shape.py (the load shape), messages.py (worker ↔ master), interrupts.py
(SIGINT/SIGTERM), webui.py (the web UI's LLM tab and start form); the core's: batchscope/loadgen/run/control.py
(the controller), batchscope/loadgen/run/sender.py (the sender).
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import gevent
from locust import events
from locust.env import Environment
from locust.runners import MasterRunner, Runner, WorkerRunner
from prometheus_client import CollectorRegistry, start_http_server

from batchscope.inputs import exits
from batchscope.loadgen.adapter import interrupts, messages
from batchscope.loadgen.adapter.finish import on_quitting, on_test_stop
from batchscope.loadgen.adapter.options import add_arguments, check_options
from batchscope.loadgen.adapter.serving_knobs import ExporterKnobs, KnobView, command_line
from batchscope.loadgen.adapter.session import new_control, options_of, session
from batchscope.loadgen.adapter.stats import take_over_csv
from batchscope.loadgen.checks import BadInput
from batchscope.loadgen.figures import ClientMetricsCollector, workload_labels
from batchscope.loadgen.run import RunControl, work_when_idle
from batchscope.loadgen.spec import SpecError, load_spec

log = logging.getLogger("batchscope.loadgen")
# records stored per idle moment of the event loop (see RunControl.drain): each takes ~0.2 ms (a JSON line, the
# histograms, the sketch), and tokens arriving meanwhile wait; idle moments come hundreds of times a second
DRAIN_BATCH = 2

events.init_command_line_parser.add_listener(add_arguments)
events.test_stop.add_listener(on_test_stop)
events.quitting.add_listener(on_quitting)


@events.init.add_listener
def on_init(environment: Environment, runner: Runner, web_ui=None, **_kwargs) -> None:
    try:
        _install(environment, runner, web_ui)
    finally:
        # what start-up built lives as long as the process: out of the collector's sight, a full collection
        # takes about a millisecond instead of tens, a pause every in-flight stream's timing would sit in
        gc.freeze()


def _install(environment: Environment, runner: Runner, web_ui: Any) -> None:
    if isinstance(runner, WorkerRunner):
        messages.install_worker(environment, runner)
        interrupts.install_worker(environment)
        return
    options = options_of(environment)
    try:
        spec = load_spec(options.spec, options.spec_set)
        check_options(options)
        command_line(options.vllm_command, options.vllm_command_file)
    except (SpecError, BadInput) as exc:
        log.error("%s", exc)
        environment.process_exit_code = exits.BAD_INPUT
        runner.quit()
        return
    ctl = new_control(environment, spec)  # the spec is parsed here once; senders get it in their plan
    gevent.spawn(work_when_idle, lambda: ctl.drain(DRAIN_BATCH), ctl.backlog)  # records stored off the hot path
    interrupts.install_controller(environment)
    if isinstance(runner, MasterRunner):
        messages.install_master(environment, runner)
    if options.csv_prefix:
        # stopped at Locust's quit event: after its final stats, before its exit
        stop_csv = take_over_csv(environment)
        environment.events.quit.add_listener(lambda **_kw: stop_csv())
    registry = session(environment).registry = client_registry(ctl)
    if options.metrics_port:
        start_http_server(options.metrics_port, addr=options.metrics_host, registry=registry)
        log.info("client metrics on http://%s:%d/metrics", options.metrics_host, options.metrics_port)
    if web_ui is not None:
        from batchscope.loadgen.adapter import webui

        webui.install(web_ui, lambda: session(environment).control, grafana_url=options.grafana_url,
                      knobs=knob_view(options), summary_file=lambda: session(environment).summary_file)


def knob_view(options: Any) -> KnobView:
    """The LLM tab's knobs: the exporter's when a URL is given, else the command line's (checked at init)."""
    if options.exporter_url:
        return KnobView(exporter=ExporterKnobs(options.exporter_url))
    command = command_line(options.vllm_command, options.vllm_command_file)
    return KnobView(command=command, command_from="--vllm-command-file" if options.vllm_command_file
                    else "--vllm-command")


def client_registry(ctl: RunControl) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(ClientMetricsCollector(
        ctl.stats, in_flight=lambda: ctl.in_flight, run_id=ctl.run_id, scenario=ctl.spec.scenario,
        spec_labels=lambda: workload_labels(ctl.spec), refresh=ctl.refresh, generator=ctl.saturation.live))
    return registry
