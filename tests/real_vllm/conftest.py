"""The real-vLLM tier: every test here is marked ``real_vllm`` (`pytest -m "not real_vllm"` skips the tier) and
shares one long-lived server where a test does not need a configuration of its own (a start costs ~25 s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.real_vllm.support import SHARED_FLAGS, VllmServer, tier

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.real_vllm)


@pytest.fixture(scope="session")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> VllmServer:
    server = tier().start(tmp_path_factory.mktemp("vllm"), *SHARED_FLAGS)
    yield server
    server.stop()
