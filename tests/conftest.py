"""Shared fixtures: real node processes on loopback ports with data in tmp folders."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

import headwater  # noqa: F401  (before grpc: it turns gRPC fork support off, see its module)
from tests.kinds import KIND_OF_MODULE
from tests.node_process import NodeProcess

# Property tests check behaviour, not speed: no per-example deadline, which would make them
# flaky on a loaded 2-core machine. A failure prints the example (and its replay blob).
settings.register_profile("headwater", deadline=None, print_blob=True)
settings.load_profile("headwater")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    """One node with embedded defaults, its own port and data folder; killed afterwards."""
    process = NodeProcess(tmp_path / "data")
    process.start()
    try:
        yield process
    finally:
        process.kill()


@pytest.fixture(scope="module")
def shared_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """One node shared by a module's tests (each test uses its own topics)."""
    process = NodeProcess(tmp_path_factory.mktemp("shared") / "data")
    process.start()
    try:
        yield process
    finally:
        process.kill()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its module's kind (``tests/kinds.py``): ``pytest -m unit``."""
    for item in items:
        kind = KIND_OF_MODULE.get(item.path.stem)
        if kind is not None:
            item.add_marker(kind)
