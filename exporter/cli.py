"""`batchscope exporter`: one Prometheus target merging vLLM's /metrics, the load generator's client metrics
and the serving configuration in effect. Every flag can also be set as a BATCHSCOPE_* environment variable."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry

from exporter.changes import ChangeTracker, GrafanaAnnotator
from exporter.collector import BatchscopeCollector, ExporterSources
from exporter.docker_source import DockerSource
from exporter.server import make_server, serve_in_thread

log = logging.getLogger("batchscope.exporter")
DEFAULT_PORT = 9648


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"BATCHSCOPE_{name}", default)


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("exporter", help="serve vLLM + client metrics + serving config as one target")
    p.add_argument("--vllm-url", default=_env("VLLM_URL", "http://127.0.0.1:8000"), help="vLLM base URL")
    p.add_argument("--loadgen-url", default=_env("LOADGEN_URL"),
                   help="load generator master's metrics base URL, e.g. http://127.0.0.1:9646")
    p.add_argument("--host", default=_env("HOST", "127.0.0.1"), help="address to listen on")
    p.add_argument("--port", type=int, default=int(_env("PORT", str(DEFAULT_PORT))), help="port to listen on")
    p.add_argument("--vllm-api-key", default=_env("VLLM_API_KEY"), help="bearer key for vLLM's /v1 routes")
    p.add_argument("--vllm-command", default=_env("VLLM_COMMAND"), help='the `vllm serve ...` command line')
    p.add_argument("--vllm-command-file", default=_env("VLLM_COMMAND_FILE"),
                   help="file holding the current `vllm serve` command line (re-read at every scrape)")
    p.add_argument("--docker-container", default=_env("DOCKER_CONTAINER"),
                   help="read the vLLM container's command line and logs through the docker SDK")
    p.add_argument("--docker-service", default=_env("DOCKER_SERVICE"),
                   help="find the vLLM container by its compose service label instead (e.g. vllm)")
    p.add_argument("--grafana-url", default=_env("GRAFANA_URL"), help="post an annotation per change here")
    p.add_argument("--grafana-token", default=_env("GRAFANA_TOKEN"), help="Grafana service-account token")
    p.add_argument("--grafana-user", default=_env("GRAFANA_USER"), help="Grafana basic-auth user")
    p.add_argument("--grafana-password", default=_env("GRAFANA_PASSWORD"), help="Grafana basic-auth password")
    p.add_argument("--scrape-timeout-s", type=float, default=float(_env("SCRAPE_TIMEOUT_S", "2")),
                   help="timeout for each upstream fetch, seconds")
    p.set_defaults(run=run_exporter)


def build_collector(args: argparse.Namespace) -> BatchscopeCollector:
    docker = None
    if args.docker_container or args.docker_service:
        import docker as docker_sdk

        docker = DockerSource(docker_sdk.from_env, container=args.docker_container,
                              service=args.docker_service or "vllm")
    annotator = None
    if args.grafana_url:
        auth = (args.grafana_user, args.grafana_password or "") if args.grafana_user else None
        annotator = GrafanaAnnotator(args.grafana_url, token=args.grafana_token, basic_auth=auth)
    sources = ExporterSources(
        vllm_url=args.vllm_url.rstrip("/"), loadgen_url=args.loadgen_url.rstrip("/") if args.loadgen_url else None,
        vllm_api_key=args.vllm_api_key, vllm_command=args.vllm_command,
        vllm_command_file=Path(args.vllm_command_file) if args.vllm_command_file else None,
        docker=docker, timeout_s=args.scrape_timeout_s)
    return BatchscopeCollector(sources, ChangeTracker(annotator))


def run_exporter(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s [%(name)s] %(message)s")
    registry = CollectorRegistry()
    registry.register(build_collector(args))
    # scrapes allocate many short-lived objects; keep the start-up heap out of every full collection
    gc.collect()
    gc.freeze()
    try:
        server = make_server(registry, args.host, args.port)
    except OSError as exc:
        print(f"batchscope exporter: error: --port: cannot listen on {args.host}:{args.port}: {exc.strerror}",
              file=sys.stderr)
        return 1
    serve_in_thread(server)
    log.info("exporter on http://%s:%d/metrics (vLLM %s, load generator %s)", args.host,
             server.server_address[1], args.vllm_url, args.loadgen_url or "-")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    return 0
