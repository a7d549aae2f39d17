"""Applying a setting by restarting the server: the simulator, a command line, or a docker container.

Every backend has the same small interface (`Server`): ``start(params, log_path)`` returns a `Started` (base
URL, the command line in effect with secrets masked, what the server reported choosing: block size, KV blocks
and capacity, vLLM's version) once /health answers, or raises `StartFailed` with the cause in one line, the log's
tail and the command line that was run; ``alive()``, ``stop()`` and ``log_tail()``. Building argv and
re-creating a container's spec are pure functions; the classes only drive processes and the docker SDK. Only
the knobs a setting sets are passed (batchscope.vllm.knobs): vLLM picks the others.
"""

from __future__ import annotations

import ctypes
import json
import os
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

from batchscope.inputs.secrets import mask_argv
from batchscope.tuner.plan import CommandBackend, DockerBackend, ServingParams, SimulatorBackend
from batchscope.tuner.results import ServerReport, server_report
from batchscope.vllm import knobs as vllm_knobs
from batchscope.vllm import scrape
from batchscope.vllm.log import failure_cause
from batchscope.wire.bounded_read import JSON_MAX_BYTES, BodyTooLarge, FetchTimeout, fetch, request
from batchscope.wire.listen import free_port

if TYPE_CHECKING:  # the SDK is imported when a docker backend starts, not by every tuner command
    from docker import APIClient, DockerClient

SIMULATOR_STARTUP_S = 60.0
STOP_GRACE_S = 15.0
TAIL_LINES = 20
HEALTH_READ_S = 2.0
REPORT_READ_S = 5.0  # each of /metrics, /version, /v1/models
_SESSION = requests.Session()  # the reads of a server's answers after its start, one connection pool
CAUSE_LINES = 400  # a failed start's cause is looked for this far back: a traceback, then the shutdown's noise
PR_SET_PDEATHSIG = 1  # prctl(2) option: the signal a child gets when its parent dies


@dataclass(frozen=True)
class Started:
    """A server that answers /health."""

    url: str
    command_line: list[str]
    reported: ServerReport


class StartFailed(Exception):  # noqa: N818 - a run outcome, not a programming error
    """The server did not come up; ``str()`` is one line (the cause), ``log_tail`` the log's last lines,
    ``command_line`` what was run (secrets masked; empty when nothing was)."""

    def __init__(self, message: str, log_tail: list[str], command_line: list[str] | None = None) -> None:
        super().__init__(message)
        self.log_tail = log_tail
        self.command_line = command_line or []


class Server(Protocol):
    def start(self, params: ServingParams, log_path: Path) -> Started: ...
    def alive(self) -> bool: ...
    def stop(self) -> None: ...
    def log_tail(self, lines: int = TAIL_LINES) -> list[str]: ...


# --- pure parts ---------------------------------------------------------------------------------------------

def simulator_argv(backend: SimulatorBackend, params: ServingParams, port: int) -> list[str]:
    """`batchscope sim serve` with the setting's flags: only the set knobs (an unset one is the knob's baseline
    there, SchedulerConfig's default, where vLLM's `vllm serve` sizes it by device: batchscope.vllm.knobs)."""
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
    """A container's command with its knob flags (any spelling) dropped and the setting's set knobs and extra
    flags added. A knob the setting leaves unset is not passed, whatever the container had: it may be the
    previous run's re-created container, holding another setting's value."""
    kept = vllm_knobs.without_knobs(command)
    return [*kept, *vllm_knobs.knob_flags(params.knobs()), *(flag for flag in params.extra_flags if flag not in kept)]


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
        answer = request(_SESSION, "GET", url + "/health", deadline=time.monotonic() + HEALTH_READ_S,
                         max_bytes=JSON_MAX_BYTES)
    except (requests.RequestException, FetchTimeout, BodyTooLarge):
        return False
    return answer.reply.status_code == 200


def wait_healthy(url: str, deadline_s: float, still_starting: Callable[[], str | None],
                 log_tail: Callable[[int], list[str]], command_line: list[str]) -> None:
    """Poll /health until it answers 200; ``still_starting`` returns a reason when the server is gone, and the
    failure names the cause the log gives (batchscope.vllm.log.failure_cause)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        gone = still_starting()
        if gone:
            lines = log_tail(CAUSE_LINES)
            raise StartFailed(f"{gone}: {failure_cause(lines) or 'no output'}", lines[-TAIL_LINES:], command_line)
        if healthy(url):
            return
        time.sleep(0.1)  # polling interval of a bounded wait
    raise StartFailed(f"no answer from {url}/health within {deadline_s:g} s", log_tail(TAIL_LINES), command_line)


def read_report(url: str, log_text: str) -> ServerReport:
    """What the server chose, asked once it answers /health: /metrics (cache_config_info), /version, /v1/models
    (unauthenticated: None when it asks for a key) and the start-up log's KV capacity line."""
    def answer(path: str) -> dict | None:
        try:
            body = fetch(_SESSION, url + path, deadline=time.monotonic() + REPORT_READ_S, max_bytes=JSON_MAX_BYTES)
            data = json.loads(body.text())
        except (requests.RequestException, FetchTimeout, BodyTooLarge, ValueError):
            return None
        return data if isinstance(data, dict) else None

    try:
        metrics = scrape.read_text(_SESSION, url + "/metrics", REPORT_READ_S)
    except scrape.Unreadable:
        metrics = ""
    return server_report(metrics, answer("/version"), answer("/v1/models"), log_text)


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

    def __init__(self, startup_timeout_s: float) -> None:
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen | None = None
        self.log_path: Path | None = None

    def launch(self, argv: list[str], url: str, log_path: Path) -> Started:
        command_line = mask_argv(argv)
        if healthy(url):
            raise StartFailed(f"a server already answers at {url}; stop it first", [], command_line)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:
            try:
                self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
            except OSError as exc:  # not found, not executable: a start that failed, as one line
                raise StartFailed(f"cannot run {command_line[0]}: {exc.strerror}", [], command_line) from None
        try:
            wait_healthy(url, self.startup_timeout_s, self._exit_reason, self.log_tail, command_line)
        except BaseException:  # a failed start, or Ctrl-C while waiting: no server is left behind either way
            self.stop()
            raise
        return Started(url, command_line, read_report(url, log_path.read_text(errors="replace")))

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

    def __init__(self, backend: SimulatorBackend) -> None:
        super().__init__(SIMULATOR_STARTUP_S)
        self.backend = backend

    def start(self, params: ServingParams, log_path: Path) -> Started:
        port = free_port()
        return self.launch(simulator_argv(self.backend, params, port), f"http://127.0.0.1:{port}", log_path)


class CommandServer(ProcessServer):
    """The plan's command template (e.g. `vllm serve ...`) run without a shell."""

    def __init__(self, backend: CommandBackend) -> None:
        super().__init__(backend.startup_timeout_s)
        self.backend = backend

    def start(self, params: ServingParams, log_path: Path) -> Started:
        host = "127.0.0.1" if self.backend.host in ("0.0.0.0", "::", "") else self.backend.host
        return self.launch(command_argv(self.backend, params), f"http://{host}:{self.backend.port}", log_path)


class DockerServer:
    """Stop and remove the named container, create it again with the setting's flags, start it."""

    def __init__(self, backend: DockerBackend, client_factory: Callable[[], DockerClient] | None = None) -> None:
        self.backend = backend
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
        except docker.errors.NotFound:
            raise StartFailed(f"docker: no container named {self.backend.container} (backend.container: the name "
                              "`docker ps` shows for the running vLLM)", []) from None
        except docker.errors.DockerException as exc:
            raise StartFailed(f"docker: {docker_reason(exc)}", []) from None
        command_line = mask_argv([*(spec["entrypoint"] or []), *spec["command"]])
        url = self.backend.url.rstrip("/")
        try:
            wait_healthy(url, self.backend.startup_timeout_s, self._exit_reason, self.log_tail, command_line)
        except BaseException:  # a failed start, or Ctrl-C while waiting: no container is left running
            self.stop()
            raise
        self._save_log()
        return Started(url, command_line, read_report(url, self._logs()))

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


def docker_reason(exc: Exception) -> str:
    """One line for a docker SDK error: no engine answering says where it was looked for, else the SDK's words."""
    words = " ".join(str(exc).split())
    if "Error while fetching server API version" in words:  # the SDK's first request found no engine
        where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        return f"no Docker engine answers at {where} (is dockerd running, and DOCKER_HOST right?)"
    return words[:200]


def _docker_from_env() -> DockerClient:
    import docker

    return docker.from_env()


def make_server(backend: SimulatorBackend | CommandBackend | DockerBackend) -> Server:
    """The driver for a plan's backend."""
    if isinstance(backend, SimulatorBackend):
        return SimulatorServer(backend)
    if isinstance(backend, CommandBackend):
        return CommandServer(backend)
    return DockerServer(backend)
