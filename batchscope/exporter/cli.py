"""`batchscope exporter`: one Prometheus target merging vLLM's /metrics, the load generator's client metrics
and the serving configuration in effect. Every flag can also be set as a BATCHSCOPE_* environment variable.

Environment values are read when the exporter runs, not when the parser is built, so a malformed one
(``BATCHSCOPE_PORT=abc``) stops only `batchscope exporter`, with one line naming the variable (exit status 2);
`batchscope --help` and the other subcommands never see it.
"""

from __future__ import annotations

import argparse
import gc
import logging
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry

from batchscope.exporter.changes import ChangeTracker
from batchscope.exporter.collector import BatchscopeCollector, ExporterSources
from batchscope.exporter.config import parse_command
from batchscope.exporter.docker_source import DockerSource
from batchscope.exporter.fetch import pin_mmap_threshold
from batchscope.exporter.health import shown_url
from batchscope.exporter.process_source import ProcessSource
from batchscope.exporter.server import make_server, serve_in_thread
from batchscope.exporter.slo import MAX_TARGET_S, SloFlags
from batchscope.inputs import exits
from batchscope.inputs.validation import read_input_text
from batchscope.runs.annotations import GrafanaAnnotator
from batchscope.wire import listen

log = logging.getLogger("batchscope.exporter")
DEFAULT_PORT = 9648


@dataclass(frozen=True)
class Option:
    """One flag and its environment variable (BATCHSCOPE_ + the flag's name)."""

    flag: str
    help: str
    default: object = None
    type: Callable[[str], object] = str

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")

    @property
    def env(self) -> str:
        return "BATCHSCOPE_" + self.dest.upper()


OPTIONS = (
    Option("--vllm-url", "vLLM base URL", "http://127.0.0.1:8000"),
    Option("--loadgen-url", "load generator master's metrics base URL, e.g. http://127.0.0.1:9646"),
    Option("--host", "address to listen on", "127.0.0.1"),
    Option("--port", "port to listen on (0: a free one)", DEFAULT_PORT, int),
    Option("--vllm-api-key", "bearer key for vLLM's /v1 routes"),
    Option("--vllm-command", "the `vllm serve ...` command line"),
    Option("--vllm-command-file", "file holding the current `vllm serve` command line (re-read at every scrape)"),
    Option("--vllm-process", "without a command line given, read the one of the process listening on --vllm-url's "
           "loopback port from /proc: auto or off", "auto"),
    Option("--follow", "live file of `batchscope tune --live-file` (re-read at every scrape): the running run's "
           "vLLM URL, load generator URL and command line replace the flags' while it names one"),
    Option("--docker-container", "read the vLLM container's command line and logs through the docker SDK"),
    Option("--docker-service", "find the vLLM container by its compose service label instead (e.g. vllm)"),
    Option("--docker-project", "the compose project of --docker-service's container (default: the exporter's own "
           "container's project)"),
    Option("--grafana-url", "post an annotation per change here"),
    Option("--grafana-token", "Grafana service-account token"),
    Option("--grafana-user", "Grafana basic-auth user"),
    Option("--grafana-password", "Grafana basic-auth password"),
    Option("--scrape-timeout-s", "bound on the whole of each upstream fetch (name lookup, connect, body), seconds",
           2.0, float),
    Option("--slo-ttft-seconds", "TTFT target of the SLO rules and alerts when the load generator's spec sets none "
           "(batchscope/exporter/slo.py: rounded up to a bound of vLLM's buckets)", None, float),
    Option("--slo-tpot-seconds", "TPOT target, as --slo-ttft-seconds", None, float),
)
SLO_FLAGS = ("--slo-ttft-seconds", "--slo-tpot-seconds")
URL_FLAGS = ("--vllm-url", "--loadgen-url", "--grafana-url")
PROCESS_CHOICES = ("auto", "off")


class BadInput(ValueError):
    """A flag or variable the user gave is unusable; the message is one line naming it."""


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("exporter", help="serve vLLM + client metrics + serving config as one target")
    for option in OPTIONS:
        default = f"; default {option.default}" if option.default is not None else ""
        # default None: the environment and the real default are applied in run_exporter (see the docstring)
        p.add_argument(option.flag, type=option.type, default=None, help=f"{option.help} (env {option.env}{default})")
    p.set_defaults(run=run_exporter)


def resolve(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    """Fill every flag not given from its environment variable, else its default. Returns, per flag given by
    the user, how to name it in an error: the flag, or the variable it came from."""
    names = {}
    for option in OPTIONS:
        if getattr(args, option.dest) is not None:
            names[option.flag] = option.flag
            continue
        raw = environ.get(option.env, "")
        if raw == "":  # unset, or set empty as compose's ${VAR:-} does
            setattr(args, option.dest, option.default)
            names[option.flag] = option.flag
            continue
        try:
            setattr(args, option.dest, option.type(raw))
        except ValueError:
            raise BadInput(f"{option.env}: invalid {option.type.__name__} value {raw!r}") from None
        names[option.flag] = option.env
    return names


def check(args: argparse.Namespace, names: Mapping[str, str]) -> None:
    """Refuse at start what cannot work: a URL without http(s), a timeout <= 0, an SLO target outside (0, a day],
    a port out of range, a command file that is missing or unreadable, a command line that cannot be split, a
    live file that is a folder."""
    for flag in URL_FLAGS:
        url = getattr(args, flag[2:].replace("-", "_"))
        if url is not None:
            try:
                parts = urlsplit(url)
            except ValueError:  # e.g. an unclosed IPv6 bracket
                raise BadInput(f"{names[flag]}: not a valid URL") from None
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise BadInput(f"{names[flag]}: {shown_url(url)!r} is not an http:// or https:// URL")
    if not (math.isfinite(args.scrape_timeout_s) and args.scrape_timeout_s > 0):
        raise BadInput(f"{names['--scrape-timeout-s']}: must be a number of seconds > 0, not {args.scrape_timeout_s}")
    for flag in SLO_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None and not 0 < value <= MAX_TARGET_S:  # NaN fails both comparisons
            raise BadInput(f"{names[flag]}: must be a number of seconds in (0, {MAX_TARGET_S:g}], not {value}")
    if args.vllm_process not in PROCESS_CHOICES:
        raise BadInput(f"{names['--vllm-process']}: must be one of {', '.join(PROCESS_CHOICES)}, not "
                       f"{args.vllm_process!r}")
    if not 0 <= args.port <= 65535:
        raise BadInput(f"{names['--port']}: must be in 0..65535, not {args.port}")
    if args.vllm_command_file is not None:
        path = Path(args.vllm_command_file)
        try:
            text = read_input_text(path)
        except OSError as exc:
            raise BadInput(f"{names['--vllm-command-file']}: cannot read {path} ({exc.strerror})") from None
        except UnicodeDecodeError:
            raise BadInput(f"{names['--vllm-command-file']}: {path} is not a text file") from None
        _check_command(names["--vllm-command-file"], text)
    if args.vllm_command is not None:
        _check_command(names["--vllm-command"], args.vllm_command)
    if args.follow is not None and Path(args.follow).is_dir():  # a missing one is fine: no run has started yet
        raise BadInput(f"{names['--follow']}: {args.follow} is a folder, not a file")


def _check_command(name: str, command: str) -> None:
    try:
        parse_command(command)
    except ValueError as exc:  # shlex: "No closing quotation"; the command itself is not shown (it may hold keys)
        raise BadInput(f"{name}: cannot split the command line ({exc})") from None


def bind(host: str, port: int, name_port: str, registry: CollectorRegistry) -> ThreadingHTTPServer:
    """The HTTP server, bound now so a busy port or an unknown host is a start-up error."""
    try:
        family, address = listen.resolve(host, port)
        return make_server(registry, address, family)
    except listen.ListenError as exc:
        raise BadInput(str(exc)) from None
    except OSError as exc:
        raise BadInput(listen.explain(exc, host, port, port_flag=name_port)) from None


def build_collector(args: argparse.Namespace) -> BatchscopeCollector:
    docker = None
    if args.docker_container or args.docker_service:
        import docker as docker_sdk

        docker = DockerSource(docker_sdk.from_env, container=args.docker_container,
                              service=args.docker_service or "vllm", project=args.docker_project)
    annotator = None
    if args.grafana_url:
        auth = (args.grafana_user, args.grafana_password or "") if args.grafana_user else None
        annotator = GrafanaAnnotator(args.grafana_url, token=args.grafana_token, basic_auth=auth, log=log)
    sources = ExporterSources(
        vllm_url=args.vllm_url.rstrip("/"), loadgen_url=args.loadgen_url.rstrip("/") if args.loadgen_url else None,
        vllm_api_key=args.vllm_api_key, vllm_command=args.vllm_command,
        vllm_command_file=Path(args.vllm_command_file) if args.vllm_command_file else None,
        docker=docker, process=ProcessSource() if args.vllm_process == "auto" else None,
        timeout_s=args.scrape_timeout_s, follow=Path(args.follow) if args.follow else None,
        slo=SloFlags(ttft_s=args.slo_ttft_seconds, tpot_s=args.slo_tpot_seconds))
    return BatchscopeCollector(sources, ChangeTracker(annotator))


def run_exporter(args: argparse.Namespace) -> int:
    """Check every input and bind the port before the first log line; serve until SIGINT (130) or SIGTERM (0)."""
    registry = CollectorRegistry()
    try:
        names = resolve(args, os.environ)
        check(args, names)
        server = bind(args.host, args.port, names["--port"], registry)
    except BadInput as exc:
        print(f"batchscope exporter: error: {exc}", file=sys.stderr)
        return exits.BAD_INPUT
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s [%(name)s] %(message)s")
    registry.register(build_collector(args))
    # scrapes allocate many short-lived objects; keep the start-up heap out of every full collection
    gc.collect()
    gc.freeze()
    pin_mmap_threshold()  # memory flat against an endless /metrics (fetch.py)
    serve_in_thread(server)
    # URLs only: keys, tokens and command lines are never logged
    log.info("exporter on http://%s:%d/metrics (vLLM %s, load generator %s)", args.host,
             server.server_address[1], shown_url(args.vllm_url), shown_url(args.loadgen_url or "-"))
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    stop.wait()
    server.shutdown()
    return exits.INTERRUPTED if received[0] == signal.SIGINT else exits.OK
