"""The locustfile's own command-line options (beside Locust's), and their checks for `locust -f` runs.

`batchscope load` checks the same flags before it becomes Locust (batchscope/loadgen/cli.py), so its user sees one line
and nothing else; a run started with `locust -f batchscope/loadgen/adapter/locustfile.py` is checked here, at init.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from batchscope.loadgen.checks import check_out_dir, check_port, check_run_id
from batchscope.loadgen.figures import DEFAULT_METRICS_PORT


def add_arguments(parser, **_kwargs) -> None:
    """Listener of Locust's init_command_line_parser event. None is shown in the web UI's start form: each is read
    once at start-up, so a value typed there would be ignored (the form shows the spec's load instead)."""
    parser.add_argument("--spec", help="workload spec YAML file", env_var="BATCHSCOPE_SPEC", include_in_web_ui=False)
    # not shown in the web UI: an override may carry the api_key
    parser.add_argument("--spec-set", action="append", default=[], metavar="KEY=VALUE", include_in_web_ui=False,
                        help="override a spec field, e.g. load.rate=8 (repeatable)")
    parser.add_argument("--run-id", include_in_web_ui=False, default="", help="run identifier (default: start time)")
    parser.add_argument("--out", include_in_web_ui=False, default="",
                        help="directory for records.jsonl and summary.json")
    parser.add_argument("--metrics-port", include_in_web_ui=False, type=int, default=DEFAULT_METRICS_PORT,
                        help="port of the merged client /metrics (master or local runner); 0 = off")
    parser.add_argument("--metrics-host", include_in_web_ui=False, default="127.0.0.1",
                        help="address of the client /metrics")
    parser.add_argument("--grafana-url", default="", env_var="BATCHSCOPE_GRAFANA_URL", include_in_web_ui=False,
                        help="Grafana base URL: the web UI's LLM tab links its batchscope dashboards (empty = none)")
    parser.add_argument("--exporter-url", default="", include_in_web_ui=False,
                        help="batchscope exporter base URL: the LLM tab shows the knobs in effect from its "
                             "batchscope_vllm_config_info")
    parser.add_argument("--vllm-command", default="", include_in_web_ui=False,
                        help="vLLM's command line (`vllm serve MODEL --max-num-seqs 64 ...`): the LLM tab shows its "
                             "knobs when no --exporter-url is given")
    parser.add_argument("--vllm-command-file", default="", include_in_web_ui=False,
                        help="a file holding vLLM's command line (as --vllm-command)")
    # set by `batchscope load`: the prompt token ids LOW,HIGH its pre-flight probed, so they are not probed again
    parser.add_argument("--batchscope-ids", default="", include_in_web_ui=False, help=argparse.SUPPRESS)
    # Locust's master port has no authentication and workers receive the target with its API key, and its web
    # UI (no login by default) can start, stop and re-aim the run: both listen on loopback unless told
    # otherwise (--master-bind-host 0.0.0.0 for workers on other hosts, --web-host 0.0.0.0 for a remote browser)
    parser.set_defaults(master_bind_host="127.0.0.1", web_host="127.0.0.1")


def check_options(options: argparse.Namespace) -> None:
    """The flags beside the spec; raises BadInput naming the flag. The output directory last: checking it makes it,
    and a run refused for another flag leaves none."""
    if options.run_id:
        check_run_id(options.run_id)
    check_port("--metrics-port", options.metrics_port, options.metrics_host, host_flag="--metrics-host")
    if options.out:
        check_out_dir(Path(options.out))
