"""The vLLM container, read through the docker SDK (read-only): its command line, start time and KV log line
(any device's, batchscope.vllm.log).

The container is found by name, or by its compose labels: the service (``com.docker.compose.service=vllm``) of
one compose project (``com.docker.compose.project``), so another project's vllm service on the same engine is never
read instead. The project is the one given, else the exporter's own container's (its hostname is its container id,
as Docker sets it); outside a container and with several projects' containers to choose from, none is read (logged).
Logs are read once per container start (the KV capacity line is printed at start-up), not on every scrape.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from batchscope.exporter.config import ServingConfig, parse_command
from batchscope.vllm.log import parse_capacity

if TYPE_CHECKING:  # the SDK is imported by the client factory, only when a container is asked for
    from docker import DockerClient
    from docker.models.containers import Container

log = logging.getLogger("batchscope.exporter")
LOG_TAIL_LINES = 5000
SERVICE_LABEL, PROJECT_LABEL = "com.docker.compose.service", "com.docker.compose.project"


@dataclass(frozen=True)
class ContainerView:
    """What the exporter learns from the container."""

    config: ServingConfig
    started_at: float | None
    kv_cache_tokens: int | None
    max_concurrency: float | None


class DockerSource:
    """Reads one container through a docker SDK client (built lazily: no daemon, no client, no error)."""

    def __init__(self, client_factory: Callable[[], DockerClient], container: str | None = None,
                 service: str = "vllm", project: str | None = None, own_container: str | None = None) -> None:
        self._client_factory = client_factory
        self._client: DockerClient | None = None
        self._container = container
        self._service = service
        self._project = project  # None: the own container's, looked up once; "": none (not in a container)
        self._own_container = own_container or socket.gethostname()
        self._ambiguous: list[str] = []  # the projects last logged as ambiguous, so the warning is logged once
        self._log_cache: dict[tuple[str | None, str], tuple[int | None, float | None]] = {}

    def read(self) -> ContainerView | None:
        """The container's view, or None when there is no daemon or no such container (logged, not raised)."""
        try:
            container = self._find()
            if container is None:
                return None
            attrs = container.attrs
            config = attrs.get("Config", {})
            command = list(config.get("Entrypoint") or []) + list(config.get("Cmd") or [])
            started = attrs.get("State", {}).get("StartedAt", "")
            tokens, concurrency = self._capacity(container, started)
            return ContainerView(parse_command(command), _timestamp(started), tokens, concurrency)
        except Exception as exc:  # the SDK raises many types (DockerException, requests errors, APIError)
            log.warning("docker: cannot read the vLLM container: %s", exc)
            self._client = None
            return None

    def _find(self) -> Container | None:
        if self._client is None:
            self._client = self._client_factory()
        containers = self._client.containers
        if self._container:
            return containers.get(self._container)
        if self._project is None:
            self._project = self._own_project(self._client)
        labels = [f"{SERVICE_LABEL}={self._service}"] + ([f"{PROJECT_LABEL}={self._project}"] if self._project else [])
        found = containers.list(filters={"label": labels})
        projects = sorted({container.labels.get(PROJECT_LABEL, "") for container in found})
        if len(projects) > 1:  # only without a project: whichever came first could be another stack's server
            if projects != self._ambiguous:
                log.warning("docker: service %s runs in compose projects %s; set --docker-project to read one",
                            self._service, ", ".join(projects))
            self._ambiguous = projects
            return None
        return found[0] if found else None

    def _own_project(self, client: DockerClient) -> str:
        """The compose project of the container the exporter runs in, "" when it runs in none."""
        from docker.errors import NotFound  # the SDK is there: a client was built

        try:
            own = client.containers.get(self._own_container)
        except NotFound:
            return ""
        return own.labels.get(PROJECT_LABEL, "")

    def _capacity(self, container: Container, started: str) -> tuple[int | None, float | None]:
        key = (container.id, started)
        if key not in self._log_cache:
            text = container.logs(stdout=True, stderr=True, tail=LOG_TAIL_LINES).decode("utf-8", "replace")
            self._log_cache = {key: parse_capacity(text)}
        return self._log_cache[key]


def _timestamp(started_at: str) -> float | None:
    """Docker's RFC 3339 StartedAt (nanoseconds, 'Z') as Unix seconds."""
    if not started_at or started_at.startswith("0001-"):
        return None
    trimmed = re.sub(r"\.(\d{6})\d*", r".\1", started_at.replace("Z", "+00:00"))
    return datetime.fromisoformat(trimmed).timestamp()
