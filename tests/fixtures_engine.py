"""The engine under test, parametrized over its interchangeable parts.

``open_engine(**options)`` opens (or reopens) an engine on the test's data
directory with the WAL backend and blob store of the current parameters. Every
engine test uses it, so adding a backend here runs the whole engine suite on it.
"""

from __future__ import annotations

import uuid

import pytest

import sediment

WAL_BACKENDS = ["file"]
BLOB_BACKENDS = ["file", pytest.param("s3", marks=pytest.mark.s3)]


@pytest.fixture(params=WAL_BACKENDS)
def wal_backend(request):
    return request.param


@pytest.fixture(params=BLOB_BACKENDS)
def blob_options(request):
    """Engine options selecting the blob store: the default local files, or S3 on moto."""
    if request.param == "file":
        return {}
    moto = request.getfixturevalue("moto_server")
    bucket = request.getfixturevalue("_shared_blob_bucket")
    return {"blob": f"s3://{bucket}/engine-{uuid.uuid4().hex}", "s3_endpoint": moto.endpoint}


@pytest.fixture
def open_engine(tmp_path, wal_backend, blob_options):
    opened = []

    def _open(data_dir=None, **options):
        options.setdefault("wal", wal_backend)
        options.setdefault("segment_bytes", 1 << 20)
        for key, value in blob_options.items():
            options.setdefault(key, value)
        engine = sediment.open(data_dir or tmp_path / "data", **options)
        opened.append(engine)
        return engine

    yield _open
    for engine in opened:
        engine.close()
