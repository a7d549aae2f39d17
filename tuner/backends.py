"""Applying a setting by restarting the server: the simulator, a command line, or a docker container.

Every backend has the same small interface (`Server`): ``start(params, log_path)`` returns a `Started` (base
URL, the command line in effect with secrets masked, the KV capacity) once /health answers, or raises
`StartFailed` with one line and the log's tail; ``alive()``, ``stop()`` and ``log_tail()``. Building argv and
re-creating a container's spec are pure functions; the classes only drive processes and the docker SDK. Each
start writes the command line to ``command_file`` (the exporter's ``--vllm-command-file``), so the live
dashboards and the change annotation name the setting being measured.
"""

from __future__ import annotations

import ctypes
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import requests

from batchscope.listen import free_port
from batchscope.secrets import mask_argv
from exporter.docker_source import parse_capacity
from tuner.plan import CommandBackend, DockerBackend, ServingParams, SimulatorBackend
from tuner.results import write_atomically
from tuner.signals import kv_capacity_from_metrics

if TYPE_CHECKING:  # the SDK is imported when a docker backend starts, not by every tuner command
    from docker import APIClient, DockerClient

SIMULATOR_STARTUP_S = 60.0
STOP_GRACE_S = 15.0
TAIL_LINES = 20
PR_SET_PDEATHSIG = 1  # prctl(2) option: the signal a child gets when its parent dies
# The flags a setting owns: their values in a container's command are replaced, everything else is kept.
KNOB_FLAGS = ("--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization",
              "--block-size")


@dataclass(frozen=True)
class Started:
    """A server that answers /health."""

    url: str
    command_line: list[str]
    kv_capacity_tokens: int | None


class StartFailed(Exception):  # noqa: N818 - a run outcome, not a programming error
    """The server did not come up; ``str()`` is one line, ``log_tail`` the log's last lines."""

    def __init__(self, message: str, log_tail: list[str]) -> None:
        super().__init__(message)
        self.log_tail = log_tail


class Server(Protocol):
    def start(self, params: ServingParams, log_path: Path) -> Started: ...
    def alive(self) -> bool: ...
    def stop(self) -> None: ...
    def log_tail(self, lines: int = TAIL_LINES) -> list[str]: ...


# --- pure parts ---------------------------------------------------------------------------------------------

def knob_flags(params: ServingParams) -> list[str]:
    """The setting's own flags (no extra_flags), in ServingParams.flags() order."""
    return params.flags()[:2 * len(KNOB_FLAGS)]


def simulator_argv(backend: SimulatorBackend, params: ServingParams, port: int) -> list[str]:
    return [sys.executable, "-m", "batchscope.cli", "sim", "serve", params.model, "--host", "127.0.0.1",
            "--port", str(port), *params.flags(), "--profile", backend.profile, "--seed", str(backend.seed)]


def command_argv(backend: CommandBackend, params: ServingParams) -> list[str]:
    """The template split like a shell would (no shell runs it), {flags} expanded to separate words."""
    words = []
    for word in shlex.split(backend.command):
        if word == "{flags}":
            words.extend(params.flags())
        else:
            # plain replacement, not str.format: a word may hold literal braces (a JSON-valued flag)
            for name, value in (("{model}", params.model), ("{host}", backend.host), ("{port}", str(backend.port))):
                word = word.replace(name, value)
            words.append(word)
    return words


def replace_knobs(command: Sequence[str], params: ServingParams) -> list[str]:
    """A container's command with the knob flags (either spelling, `--x v` or `--x=v`) replaced by the setting's."""
    spellings = {flag: flag for flag in KNOB_FLAGS} | {"--" + flag[2:].replace("-", "_"): flag for flag in KNOB_FLAGS}
    kept: list[str] = []
    skip_value = False
    for word in command:
        if skip_value:
            skip_value = False
            continue
        name, has_value, _ = word.partition("=")
        if name in spellings:
            skip_value = not has_value
            continue
        kept.append(word)
    return [*kept, *knob_flags(params), *(flag for flag in params.extra_flags if flag not in kept)]


def recreate_spec(attrs: dict, params: ServingParams) -> dict:
    """Keyword arguments of docker's low-level ``create_container`` that re-create an inspected container with
    the setting's flags: the same image, entrypoint, environment, labels and the whole HostConfig (GPUs,
    binds and mounts, network, ports, shm size, IPC), the network aliases too."""
    config, host_config = attrs["Config"], attrs["HostConfig"]
    network = host_config.get("NetworkMode") or "default"
    endpoint = (attrs.get("NetworkSettings") or {}).get("Networks", {}).get(network)
    networking = None
    if endpoint and network not in ("default", "bridge", "host", "none"):
        aliases = [a for a in endpoint.get("Aliases") or [] if a != attrs["Id"][:12]]
        networking = {"EndpointsConfig": {network: {"Aliases": aliases}}}
    ports = [tuple(port.split("/", 1)) for port in config.get("ExposedPorts") or {}]
    return {
        "image": config["Image"], "command": replace_knobs(config.get("Cmd") or [], params),
        "entrypoint": config.get("Entrypoint"), "environment": config.get("Env"), "labels": config.get("Labels"),
        "name": attrs["Name"].lstrip("/"), "ports": ports or None, "working_dir": config.get("WorkingDir") or None,
        "user": config.get("User") or None, "healthcheck": config.get("Healthcheck"),
        "volumes": list(config.get("Volumes") or {}) or None, "stop_signal": config.get("StopSignal"),
        "tty": config.get("Tty", False), "host_config": host_config, "networking_config": networking,
    }


def tail(text: str, lines: int = TAIL_LINES) -> list[str]:
    return [line for line in text.splitlines() if line.strip()][-lines:]


# --- shared driving -----------------------------------------------------------------------------------------

def healthy(url: str) -> bool:
    try:
        return requests.get(url + "/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def wait_healthy(url: str, deadline_s: float, still_starting: Callable[[], str | None],
                 log_tail: Callable[[], list[str]]) -> None:
    """Poll /health until it answers 200; ``still_starting`` returns a reason when the server is gone."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        gone = still_starting()
        if gone:
            lines = log_tail()
            raise StartFailed(f"{gone}: {lines[-1] if lines else 'no output'}", lines)
        if healthy(url):
            return
        time.sleep(0.1)  # polling interval of a bounded wait
    raise StartFailed(f"no answer from {url}/health within {deadline_s:g} s", log_tail())


def kv_capacity(log_text: str, url: str) -> int | None:
    """vLLM's 'GPU KV cache size: N tokens' line, else cache_config_info's blocks x block size."""
    tokens, _ = parse_capacity(log_text)
    if tokens is not None:
        return tokens
    try:
        return kv_capacity_from_metrics(requests.get(url + "/metrics", timeout=5).text)
    except requests.RequestException:
        return None


def write_command_file(path: Path | None, command_line: list[str]) -> None:
    if path is not None:
        write_atomically(path, shlex.join(command_line) + "\n")


def die_with_parent() -> None:
    """In a child process (the server, the load): SIGTERM when the tuner dies, even by SIGKILL (Linux
    PR_SET_PDEATHSIG), so an interrupted plan never leaves a server holding the GPU or the port --resume needs."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def stop_process(process: subprocess.Popen, grace_s: float, kill_wait_s: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``grace_s``."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=kill_wait_s)


class ProcessServer:
    """A server run as a child process that dies with the tuner, output to a file."""

    def __init__(self, command_file: Path | None, startup_timeout_s: float) -> None:
        self.command_file = command_file
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen | None = None
        self.log_path: Path | None = None

    def launch(self, argv: list[str], url: str, log_path: Path) -> Started:
        if healthy(url):
            raise StartFailed(f"a server already answers at {url}; stop it first", [])
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            preexec_fn=die_with_parent)
        command_line = mask_argv(argv)
        try:
            wait_healthy(url, self.startup_timeout_s, self._exit_reason, self.log_tail)
        except BaseException:  # a failed start, or Ctrl-C while waiting: no server is left behind either way
            self.stop()
            raise
        write_command_file(self.command_file, command_line)
        return Started(url, command_line, kv_capacity(log_path.read_text(errors="replace"), url))

    def _exit_reason(self) -> str | None:
        code = self.process.poll() if self.process else None
        return None if code is None else f"server exited with status {code}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process, STOP_GRACE_S, STOP_GRACE_S)
        self.process = None

    def log_tail(self, lines: int = TAIL_LINES) -> list[str]:
        if self.log_path is None or not self.log_path.exists():
            return []
        return tail(self.log_path.read_text(errors="replace"), lines)


class SimulatorServer(ProcessServer):
    """`batchscope sim serve` on a free loopback port per start."""

    def __init__(self, backend: SimulatorBackend, command_file: Path | None = None) -> None:
        super().__init__(command_file, SIMULATOR_STARTUP_S)
        self.backend = backend

    def start(self, params: ServingParams, log_path: Path) -> Started:
        port = free_port()
        return self.launch(simulator_argv(self.backend, params, port), f"http://127.0.0.1:{port}", log_path)


class CommandServer(ProcessServer):
    """The plan's command template (e.g. `vllm serve ...`) run without a shell."""

    def __init__(self, backend: CommandBackend, command_file: Path | None = None) -> None:
        super().__init__(command_file, backend.startup_timeout_s)
        self.backend = backend

    def start(self, params: ServingParams, log_path: Path) -> Started:
        host = "127.0.0.1" if self.backend.host in ("0.0.0.0", "::", "") else self.backend.host
        return self.launch(command_argv(self.backend, params), f"http://{host}:{self.backend.port}", log_path)


class DockerServer:
    """Stop and remove the named container, create it again with the setting's flags, start it."""

    def __init__(self, backend: DockerBackend, command_file: Path | None = None,
                 client_factory: Callable[[], DockerClient] | None = None) -> None:
        self.backend = backend
        self.command_file = command_file
        self.client_factory = client_factory or _docker_from_env
        self.container_id: str | None = None
        self.log_path: Path | None = None
        self._api: APIClient | None = None

    def start(self, params: ServingParams, log_path: Path) -> Started:
        import docker

        self.log_path = log_path
        try:
            api = self._api = self.client_factory().api
            old = api.inspect_container(self.backend.container)
            spec = recreate_spec(old, params)
            api.stop(old["Id"])
            api.remove_container(old["Id"])
            self.container_id = api.create_container(**spec)["Id"]
            api.start(self.container_id)
        except docker.errors.DockerException as exc:
            raise StartFailed(f"docker: {' '.join(str(exc).split())[:200]}", []) from None
        command_line = mask_argv([*(spec["entrypoint"] or []), *spec["command"]])
        url = self.backend.url.rstrip("/")
        try:
            wait_healthy(url, self.backend.startup_timeout_s, self._exit_reason, self.log_tail)
        except BaseException:  # a failed start, or Ctrl-C while waiting: no container is left running
            self.stop()
            raise
        self._save_log()
        write_command_file(self.command_file, command_line)
        return Started(url, command_line, kv_capacity(self._logs(), url))

    def _exit_reason(self) -> str | None:
        if self._api is None or self.container_id is None:
            return "the container was not created"
        state = self._api.inspect_container(self.container_id)["State"]
        if state.get("Status") in ("exited", "dead"):
            return f"container exited with status {state.get('ExitCode')}"
        return None

    def _logs(self, lines: int | Literal["all"] = "all") -> str:
        if self._api is None or self.container_id is None:
            return ""
        return self._api.logs(self.container_id, tail=lines).decode(errors="replace")

    def _save_log(self) -> None:
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log_path.write_text(self._logs())

    def alive(self) -> bool:
        return self.container_id is not None and self._exit_reason() is None

    def stop(self) -> None:
        if self._api is not None and self.container_id is not None:
            self._save_log()
            self._api.stop(self.container_id)
            self.container_id = None

    def log_tail(self, lines: int = TAIL_LINES) -> list[str]:
        return tail(self._logs(lines), lines)


def _docker_from_env() -> DockerClient:
    import docker

    return docker.from_env()


def make_server(backend: SimulatorBackend | CommandBackend | DockerBackend, command_file: Path | None) -> Server:
    """The driver for a plan's backend."""
    if isinstance(backend, SimulatorBackend):
        return SimulatorServer(backend, command_file)
    if isinstance(backend, CommandBackend):
        return CommandServer(backend, command_file)
    return DockerServer(backend, command_file)
