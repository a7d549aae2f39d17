"""`batchscope sim serve MODEL ...`: the simulator as a drop-in for `vllm serve` (same flag names)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys
from collections.abc import Awaitable, Callable

from pydantic import ValidationError

from batchscope import exits
from batchscope.listen import listen
from batchscope.secrets import mask_mapping
from simulator.config import Deployment, ServeConfig, validation_message
from simulator.profile import builtin_profiles
from simulator.responses import VLLM_VERSION

Serve = Callable[[Deployment, socket.socket, asyncio.Event], Awaitable[None]]

log = logging.getLogger("simulator")


def add_parser(commands: argparse._SubParsersAction) -> None:
    sim = commands.add_parser("sim", help="the vLLM-compatible simulator")
    sim_commands = sim.add_subparsers(dest="sim_command", required=True, parser_class=type(sim))
    serve = sim_commands.add_parser("serve", help="serve the OpenAI API and /metrics like `vllm serve`")
    serve.add_argument("model", help="model name or path (what `vllm serve` takes)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000, help="0 picks a free port (logged at start-up)")
    serve.add_argument("--served-model-name")
    serve.add_argument("--max-num-seqs", type=int, default=128)
    serve.add_argument("--max-num-batched-tokens", type=int, default=2048)
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.92)
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
    serve.set_defaults(run=run_serve)


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

    from simulator.server import serve  # aiohttp is only needed once we really serve

    received = uvloop.run(_serve_until_signal(deployment, sock, serve))
    return exits.INTERRUPTED if received == signal.SIGINT else exits.OK


def _bad_input(message: str) -> int:
    print(f"batchscope sim serve: error: {message}", file=sys.stderr)
    return exits.BAD_INPUT


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
