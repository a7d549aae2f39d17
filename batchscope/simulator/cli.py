"""`batchscope sim serve MODEL ...`: the simulator as a drop-in for `vllm serve` (same flag names)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import signal
import socket
import sys
from collections.abc import Awaitable, Callable

from pydantic import ValidationError

from batchscope.inputs import exits
from batchscope.inputs.secrets import mask_mapping
from batchscope.simulator.config import Deployment, ServeConfig, validation_message
from batchscope.simulator.profile import builtin_profiles
from batchscope.simulator.responses import VLLM_VERSION
from batchscope.vllm import knobs
from batchscope.wire.listen import listen

Serve = Callable[[Deployment, socket.socket, asyncio.Event], Awaitable[None]]

log = logging.getLogger("batchscope.simulator")


def add_parser(commands: argparse._SubParsersAction) -> None:
    sim = commands.add_parser("sim", help="the vLLM-compatible simulator")
    sim_commands = sim.add_subparsers(dest="sim_command", required=True, parser_class=type(sim))
    serve = sim_commands.add_parser("serve", help="serve the OpenAI API and /metrics like `vllm serve`")
    serve.add_argument("model", help="model name or path (what `vllm serve` takes)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000, help="0 picks a free port (logged at start-up)")
    serve.add_argument("--served-model-name")
    for name in ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization"):
        knob = knobs.BY_NAME[name]
        serve.add_argument(knob.flag, type=type(knob.baseline), default=knob.baseline,
                           help=ServeConfig.model_fields[name].description)
    for name in ("max_num_active_seqs", "max_num_queued_reqs", "max_num_queued_tokens", "long_prefill_token_threshold"):
        serve.add_argument(knobs.BY_NAME[name].flag, type=int, metavar="N",
                           help=ServeConfig.model_fields[name].description)
    adaptive = "long_prefill_token_threshold_adaptive"
    serve.add_argument(knobs.BY_NAME[adaptive].flag, action=argparse.BooleanOptionalAction,
                       help=ServeConfig.model_fields[adaptive].description)
    serve.add_argument("--max-model-len", type=int, help="default: the profile's model context length")
    serve.add_argument("--num-gpu-blocks-override", type=int, metavar="N",
                       help="KV blocks to use instead of what memory allows (a fixed cache size)")
    serve.add_argument("--block-size", type=int, help="default: the profile's device's (16 on CUDA, 128 on CPU)")
    serve.add_argument("--vocab-size", type=int, metavar="N",
                       help="simulator only: the model's vocabulary (default: the profile's); a prompt id at or "
                            "above it is refused as vLLM refuses it")
    serve.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                       help="automatic prefix caching (default: on, as vLLM V1)")
    serve.add_argument("--api-key")
    serve.add_argument("--seed", type=int, default=0)
    serve.add_argument("--profile", default="h100-llama-3.1-8b",
                       help=f"GPU + model profile: {', '.join(builtin_profiles())}, or a YAML file")
    serve.add_argument("--ground-truth-log", metavar="FILE", help="append per-request server timestamps (JSONL)")
    serve.add_argument("--fault-error-rate", type=float, default=0.0, help="fraction of requests answered 500")
    serve.add_argument("--fault-cut-rate", type=float, default=0.0, help="fraction of streams cut half-way")
    serve.add_argument("--fault-stall-rate", type=float, default=0.0, help="fraction of requests held")
    serve.add_argument("--fault-stall-s", type=float, default=0.0, help="how long a held request waits, s")
    serve.add_argument("--fault-engine-stall-after-s", type=float,
                       help="seconds after start-up when the engine stops stepping (no tokens, queues kept)")
    serve.add_argument("--fault-engine-stall-s", type=float, default=0.0, help="how long the engine stays stopped, s")
    serve.add_argument("--fault-stream-event-cpu-s", type=float, default=0.0,
                       help="CPU time burnt per stream event, one step's tokens for one stream (a saturated "
                            "API server), s")
    serve.set_defaults(run=run_serve)
    calibrate = sim_commands.add_parser("calibrate", help="probe a running vLLM and write a profile fitted to it")
    calibrate.add_argument("--url", required=True, help="base URL of the running vLLM")
    calibrate.add_argument("--max-num-seqs", type=int, required=True,
                           help="the server's max_num_seqs (vLLM does not report it)")
    calibrate.add_argument("--max-num-batched-tokens", type=int, required=True,
                           help="the server's max_num_batched_tokens (vLLM does not report it)")
    calibrate.add_argument("--model-config", metavar="FILE",
                           help="the model's config.json or folder (default: the folder /v1/models names as root)")
    calibrate.add_argument("--budget-s", type=float, default=120.0,
                           help="seconds of probe load in all (9 phases, 2 s each at least; each phase's load "
                                "generator start comes on top)")
    calibrate.add_argument("--out", default="profile.yaml", help="the profile file to write")
    calibrate.add_argument("--noise-limit", type=float, metavar="FRACTION",
                           help="refuse when the repeated phase moved more than this, or the fit misses vLLM's "
                                "figures by more (RMS of relative errors); default 0.15")
    calibrate.add_argument("--seed", type=int, help="the probe loads' prompt seed (default: a new one each time, so "
                           "no prompt of an earlier probe is in the server's prefix cache)")
    calibrate.set_defaults(run=run_calibrate)


def run_serve(args: argparse.Namespace) -> int:
    """Validate everything (flags, profile, files, the listening socket) before the first log line."""
    fields = {k: v for k, v in vars(args).items() if k in ServeConfig.model_fields and v is not None}
    try:
        deployment = Deployment(ServeConfig(**fields))
        # bound before start-up as vLLM binds it, so a busy port or a bad host fails at once
        sock = listen(deployment.config.host, deployment.config.port)
    except ValidationError as exc:
        return _bad_input(validation_message(exc))
    except ValueError as exc:
        return _bad_input(str(exc))
    _configure_logging()
    _log_startup(deployment)
    import uvloop  # a dependency: the real-time loop's step timing is measured with it

    from batchscope.simulator.server import serve  # aiohttp is only needed once we really serve

    received = uvloop.run(_serve_until_signal(deployment, sock, serve))
    return exits.INTERRUPTED if received == signal.SIGINT else exits.OK


def _bad_input(message: str, command: str = "serve") -> int:
    print(f"batchscope sim {command}: error: {message}", file=sys.stderr)
    return exits.BAD_INPUT


def run_calibrate(args: argparse.Namespace) -> int:
    """Check the flags, probe the server, fit, write the profile; any refusal is one line and exit status 2."""
    from pathlib import Path

    from batchscope.simulator import calibrate  # requests, the fit: only for this command

    if args.noise_limit is None:
        args.noise_limit = calibrate.NOISE_LIMIT

    positive = {"--max-num-seqs": args.max_num_seqs, "--max-num-batched-tokens": args.max_num_batched_tokens,
                "--budget-s": args.budget_s, "--noise-limit": args.noise_limit}
    for flag, value in positive.items():
        if value <= 0:
            return _bad_input(f"{flag}: must be > 0, got {value:g}", "calibrate")
    out = Path(args.out)
    if not out.parent.is_dir():
        return _bad_input(f"--out: folder {out.parent} does not exist", "calibrate")
    try:
        server = calibrate.read_server(args.url, args.max_num_seqs, args.max_num_batched_tokens)
        config = calibrate.read_model_config(args.model_config or server.root)
        seed = random.randrange(2**31) if args.seed is None else args.seed
        measured = calibrate.probe(server, args.budget_s, seed,
                                   progress=lambda line: print(f"batchscope sim calibrate: {line}", file=sys.stderr))
        profile = calibrate.fit_profile(server, config, args.budget_s, measured, args.noise_limit)
    except calibrate.CalibrationError as exc:
        return _bad_input(str(exc), "calibrate")
    calibrate.write_profile(profile, out)
    record = profile.calibration
    assert record is not None
    print(f"batchscope sim calibrate: wrote {out}: {len(record.residuals)} figures fitted, RMS error "
          f"{record.rms_error:.1%}, repeat drift {record.repeat_drift:.1%}", file=sys.stderr)
    return exits.OK


async def _serve_until_signal(deployment: Deployment, sock: socket.socket, serve: Serve) -> signal.Signals:
    """Serve until SIGINT or SIGTERM; return which one, since an interrupt exits 130 and a stop exits 0."""
    stop = asyncio.Event()
    received: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig)
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    await serve(deployment, sock, stop)
    return received[0]


def _configure_logging() -> None:
    """vLLM's log line layout: 'INFO 11-30 04:51:11 [file.py:123] message'."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s",
                                           datefmt="%m-%d %H:%M:%S"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def _log_startup(deployment: Deployment) -> None:
    config = deployment.config
    log.info("vLLM API server version %s (batchscope simulator, profile %s)", VLLM_VERSION,
             deployment.profile.name)
    # masked like every shown config: the API key never reaches a log
    log.info("non-default args: %s", mask_mapping(config.model_dump(exclude_defaults=True)))
    log.info("Chunked prefill is enabled with max_num_batched_tokens=%d.", config.max_num_batched_tokens)
    for line in deployment.kv_plan.log_lines():
        log.info("%s", line)
