"""The Docker stack tier's marker, registered here beside the tier (tests/stack/test_docker_stack.py)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "docker_stack: `docker compose up` of compose.yaml on a private Docker engine "
                                       "(tests/stack/test_docker_stack.py; skip the tier with -m 'not docker_stack')")
