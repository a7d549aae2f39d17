"""`batchscope load`: run the workload spec with Locust (a master and N worker processes), headless or, with
``--web``, in Locust's web UI (its start form shows the spec's load, its LLM tab the run and the knobs).

Everything that can refuse the run is checked before Locust starts, so a refusal is one line and nothing else
(no banner, no empty tables or CSV files, no empty output folder): the flags, the spec, and the server
(stream/target.py's pre-flight: ``--host`` a URL that accepts a connection, the model, the length, the prompt ids'
vocabulary, chat's words).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

from batchscope.inputs import exits
from batchscope.loadgen.adapter import command_line
from batchscope.loadgen.checks import BadInput, check_host, check_out_dir, check_port, check_run_id
from batchscope.loadgen.figures import DEFAULT_METRICS_PORT
from batchscope.loadgen.spec import SpecError, WorkloadSpec, load_spec
from batchscope.loadgen.stream import build_target
from batchscope.runs import run_ids

LOCUSTFILE = Path(__file__).parent / "adapter" / "locustfile.py"
MASTER_PORT = 5557  # Locust's default
ANY_ADDRESS = ("*", "0.0.0.0")
WEB_PORT = 8089  # Locust's default


def add_parser(commands: argparse._SubParsersAction) -> None:
    load = commands.add_parser("load", help="send the fixed streaming load of a workload spec (Locust, headless or "
                                            "in its web UI)")
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
    load.add_argument("--master-bind-host", default="127.0.0.1", metavar="ADDR",
                      help="address the master listens on for workers (port 5557); 0.0.0.0 lets workers on other "
                           "hosts join with `locust -f batchscope/loadgen/adapter/locustfile.py --worker "
                           "--master-host HOST`")
    load.add_argument("--master-port", type=int, default=MASTER_PORT,
                      help="port the master listens on for workers (two runs with workers at once need two)")
    web = load.add_argument_group("web UI", "Locust's web UI with the LLM tab (no login: loopback by default)")
    web.add_argument("--web", action="store_true",
                     help="open Locust's web UI instead of running headless: Start begins the spec's run, the "
                          "process stays up after it until Ctrl-C")
    web.add_argument("--web-host", default="127.0.0.1", metavar="ADDR",
                     help="address the web UI listens on (0.0.0.0: any; the UI can start and stop runs)")
    web.add_argument("--web-port", type=int, default=WEB_PORT, help="port of the web UI")
    web.add_argument("--grafana-url", default="", metavar="URL", help="Grafana base URL: the LLM tab links its "
                     "batchscope dashboards")
    web.add_argument("--exporter-url", default="", metavar="URL",
                     help="batchscope exporter base URL: the LLM tab shows the knobs in effect from its "
                          "batchscope_vllm_config_info")
    web.add_argument("--vllm-command", default="", metavar="LINE",
                     help="vLLM's command line (`vllm serve MODEL --max-num-seqs 64 ...`): the LLM tab shows its "
                          "knobs when no --exporter-url is given")
    web.add_argument("--vllm-command-file", default="", metavar="FILE",
                     help="a file holding vLLM's command line (as --vllm-command)")
    load.set_defaults(run=run_load)


def run_load(args: argparse.Namespace) -> int:
    """Check every input and the server, then exec Locust. Bad input, or a server that cannot take the run: one
    line naming the flag, field or cause, exit status 2."""
    try:
        spec = load_spec(args.spec, args.overrides)
        run_id, out = check_inputs(args)
        ids = preflight(spec, args.host)
    except (SpecError, BadInput) as exc:
        print(f"batchscope load: error: {exc}", file=sys.stderr)
        return exits.BAD_INPUT
    except KeyboardInterrupt:  # Ctrl-C during the pre-flight's requests: no run, nothing written
        print("batchscope load: interrupted before the run started", file=sys.stderr)
        return exits.INTERRUPTED
    command = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), *mode_flags(args),
               "--host", args.host, "--spec", args.spec, "--run-id", run_id, "--out", str(out),
               "--metrics-port", str(args.metrics_port), "--csv", str(out / "locust"), "--stop-timeout", "0",
               # Locust's end-of-run table goes to a file, not after our summary: the console has one report
               "--json-file", str(out / "locust_stats")]
    if ids is not None:
        command += ["--batchscope-ids", f"{ids[0]},{ids[1]}"]
    for override in args.overrides:
        command += ["--spec-set", override]
    if args.workers:
        command += ["--processes", str(args.workers), "--master-bind-host", args.master_bind_host,
                    "--master-bind-port", str(args.master_port), "--master-port", str(args.master_port)]
        if args.master_bind_host not in ANY_ADDRESS:
            command += ["--master-host", args.master_bind_host]  # where the forked workers connect
    where = f", web UI on http://{args.web_host}:{args.web_port}/" if args.web else ""
    print(f"batchscope load: {spec.load.mode} load on {args.host}, results in {out}{where}", file=sys.stderr,
          flush=True)
    # become Locust: signals (Ctrl-C, SIGTERM) reach it directly and no wrapper process is left behind
    os.execv(sys.executable, command)
    return 1  # not reached


def mode_flags(args: argparse.Namespace) -> list[str]:
    """Locust's flags for a headless run, or for its web UI with the LLM tab's sources."""
    if not args.web:
        return ["--headless", "--only-summary"]
    flags = ["--web-host", args.web_host, "--web-port", str(args.web_port)]
    for flag, value in (("--grafana-url", args.grafana_url), ("--exporter-url", args.exporter_url),
                        ("--vllm-command", args.vllm_command), ("--vllm-command-file", args.vllm_command_file)):
        if value:
            flags.append(f"{flag}={value}")  # one word: a command line's value may start with a dash
    return flags


def preflight(spec: WorkloadSpec, host: str) -> tuple[int, int] | None:
    """The server's checks (batchscope/loadgen/stream/target.py's build_target, as the controller will make them); the
    completions'
    prompt id range it probed, handed on so the vocabulary is probed once per run."""
    target = build_target(spec, host)
    return None if target.chat else (target.id_low, target.id_high)


def check_inputs(args: argparse.Namespace) -> tuple[str, Path]:
    """The flags beside the spec; returns the run id and the output directory (checked, made when Locust starts)."""
    if args.workers < 0:
        raise BadInput("--workers: must be >= 0")
    check_metrics_port(args.metrics_port)
    for flag in ("grafana_url", "exporter_url", "vllm_command", "vllm_command_file"):
        if getattr(args, flag) and not args.web:
            raise BadInput(f"--{flag.replace('_', '-')}: for the web UI's LLM tab, only with --web")
    if args.web:
        check_host("--web-host", args.web_host)
        if not 1 <= args.web_port <= 65535:
            raise BadInput(f"--web-port: {args.web_port} is not a port number (1-65535)")
        check_port("--web-port", args.web_port, "" if args.web_host in ANY_ADDRESS else args.web_host,
                   host_flag="--web-host")
        command_line(args.vllm_command, args.vllm_command_file)
    if args.workers:
        if not 1 <= args.master_port <= 65535:  # workers connect to it: 0 cannot mean "off" here
            raise BadInput(f"--master-port: {args.master_port} is not a port number (1-65535)")
        check_host("--master-bind-host", args.master_bind_host)
        bind_host = "" if args.master_bind_host in ANY_ADDRESS else args.master_bind_host
        check_port("--master-port", args.master_port, bind_host, host_flag="--master-bind-host")
    run_id = check_run_id(args.run_id) if args.run_id else run_ids.default_run_id()
    out = Path(args.out or Path("out") / run_id)
    check_new_out_dir(out)
    return run_id, out


def check_metrics_port(port: int) -> None:
    """The client /metrics' port; the default is also the one `docker compose up` publishes (compose.yaml's Locust
    master), so a run beside the stack is told which flag to give."""
    try:
        check_port("--metrics-port", port)
    except BadInput as exc:
        if port != DEFAULT_METRICS_PORT:
            raise
        raise BadInput(f"{exc}; it is the default, which `docker compose up` publishes too: pass --metrics-port a "
                       "free port, or 0 for none") from None


def check_new_out_dir(out: Path) -> None:
    """``out`` can be created (or is a folder); the folders made to find out are removed again, so a run refused
    later (the server's pre-flight) leaves none behind. Locust makes it when the run starts (its CSV files)."""
    made = [folder for folder in (out, *out.parents) if not folder.exists()]  # deepest first
    check_out_dir(out)
    for folder in made:
        with contextlib.suppress(OSError):  # something else wrote there meanwhile: it is not ours to remove
            folder.rmdir()
