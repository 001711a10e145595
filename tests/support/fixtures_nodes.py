"""Three storage nodes (``nodes``) for the tests of the replicated log and engine: real
``sediment storage-node`` processes, started, and killed by their PIDs when the test ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.replication import Node


@pytest.fixture
def nodes(tmp_path: Path):
    started = [Node(tmp_path / f"node{i}") for i in range(3)]
    try:
        for n in started:
            n.start()
        yield started
    finally:
        for n in started:
            if n.proc is not None:
                n.kill()
