"""The real-vLLM tier: every test here is marked ``real_vllm`` (`pytest -m "not real_vllm"` skips the tier) and
shares one long-lived server where a test does not need a configuration of its own (a start costs ~25 s), and one
with every queue knob (QUEUE_FLAGS) where it needs those."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.real_vllm.support import QUEUE_FLAGS, SHARED_FLAGS, VllmServer, tier

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


@pytest.fixture(scope="package")
def queue_knobs_vllm(tmp_path_factory: pytest.TempPathFactory) -> VllmServer:
    """SHARED_FLAGS and QUEUE_FLAGS, a lean start (its tests count): the exporter's queue-knob test and the
    admission load test share it (whichever runs first has refusals counted before the other's)."""
    server = tier().start(tmp_path_factory.mktemp("vllm-queue-knobs"), *SHARED_FLAGS, *QUEUE_FLAGS, lean=True)
    yield server
    server.stop()
