"""Three storage nodes (``nodes``) for the tests of the replicated log and engine: real
``sediment storage-node`` processes, started, and killed by their PIDs when the test ends
(or when a later one fails to start)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.replication import Node, start_all, stop_all


@pytest.fixture
def nodes(tmp_path: Path):
    started = [Node(tmp_path / f"node{i}") for i in range(3)]
    start_all(started)
    try:
        yield started
    finally:
        stop_all(started)
