"""The engine under test, parametrized over its interchangeable parts.

``open_engine(**options)`` opens (or reopens) an engine on the test's data
directory with the backend of the current parameter. Every engine test uses it, so
adding a backend to ``WAL_BACKENDS`` runs the whole engine suite on it.
"""

from __future__ import annotations

import pytest

import sediment

WAL_BACKENDS = ["file"]


@pytest.fixture(params=WAL_BACKENDS)
def wal_backend(request):
    return request.param


@pytest.fixture
def open_engine(tmp_path, wal_backend):
    opened = []

    def _open(data_dir=None, **options):
        options.setdefault("wal", wal_backend)
        options.setdefault("segment_bytes", 1 << 20)
        engine = sediment.open(data_dir or tmp_path / "data", **options)
        opened.append(engine)
        return engine

    yield _open
    for engine in opened:
        engine.close()
