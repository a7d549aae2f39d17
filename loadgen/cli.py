"""`batchscope load`: run the workload spec headless with Locust (a master and N worker processes)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from loadgen.metrics import DEFAULT_METRICS_PORT
from loadgen.spec import SpecError, load_spec

LOCUSTFILE = Path(__file__).with_name("locustfile.py")


def add_parser(commands: argparse._SubParsersAction) -> None:
    load = commands.add_parser("load", help="send the fixed streaming load of a workload spec (Locust, headless)")
    load.add_argument("--spec", required=True, metavar="FILE", help="workload spec YAML")
    load.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="override a spec field, e.g. --set load.rate=8 (repeatable)")
    load.add_argument("--host", default="http://127.0.0.1:8000", help="base URL of the vLLM server")
    load.add_argument("--workers", type=int, default=0,
                      help="worker processes (0: one local process; N: a master and N workers)")
    load.add_argument("--out", metavar="DIR", help="output directory (default: out/RUN_ID)")
    load.add_argument("--run-id", help="run identifier (default: start time)")
    load.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT,
                      help="port of the merged client /metrics on 127.0.0.1 (0: off)")
    load.set_defaults(run=run_load)


def run_load(args: argparse.Namespace) -> int:
    try:
        spec = load_spec(args.spec, args.overrides)
    except SpecError as exc:
        print(f"batchscope load: error: {exc}", file=sys.stderr)
        return 2
    if args.workers < 0:
        print("batchscope load: error: --workers must be >= 0", file=sys.stderr)
        return 2
    run_id = args.run_id or time.strftime("%Y%m%dT%H%M%S")
    out = Path(args.out or Path("out") / run_id)
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
               "--host", args.host, "--spec", args.spec, "--run-id", run_id, "--out", str(out),
               "--metrics-port", str(args.metrics_port), "--csv", str(out / "locust"), "--stop-timeout", "0"]
    for override in args.overrides:
        command += ["--spec-set", override]
    if args.workers:
        command += ["--processes", str(args.workers)]
    print(f"batchscope load: {spec.load.mode} load on {args.host}, results in {out}", file=sys.stderr, flush=True)
    # become Locust: signals (Ctrl-C, SIGTERM) reach it directly and no wrapper process is left behind
    os.execv(sys.executable, command)
    return 1  # not reached
