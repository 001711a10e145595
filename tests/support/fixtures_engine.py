"""The engine under test, parametrized over its interchangeable parts.

``open_engine(**options)`` opens (or reopens) an engine on the test's data
directory with the WAL backend and blob store of the current parameters. Every
engine test uses it, so adding a backend here runs the whole engine suite on it.

``access`` runs each test twice: on the engine itself ("embedded"), and through a
SedimentFlightServer on a free loopback port and a sediment.client.Client ("server"),
whose close() also stops the server and closes the engine. Tests that reach into
engine internals are marked ``embedded_only`` and are not run through the server. The
network path does not depend on the backends, so "server" runs with the file WAL and
the file blob store only (SEDIMENT_TEST_SERVER_MATRIX=full runs every combination).

``wal_backend`` is the log: the file log and the device ring run every engine test (the device
ring with the file blob store only, unless SEDIMENT_TEST_SERVER_MATRIX=full: no call of the blob
store depends on the log); the slower
logs, the replicated log (three storage nodes in this process, metadata in a real ZooKeeper,
batches in a shared blob directory, as a deployment does) and the log on S3 (log, metadata and
batches in moto's S3, as an S3-only deployment), run the
tests marked ``every_log``, embedded, each with the blob store of its deployment.
"""

from __future__ import annotations

import os
import uuid

import pytest

import sediment
from support.wal_backends import KEY, InProcessNodes

SLOW_LOGS = ["replicated", "s3"]
WAL_BACKENDS = ["file", "device", pytest.param("replicated", marks=pytest.mark.zookeeper),
                *(pytest.param(log, marks=pytest.mark.s3) for log in SLOW_LOGS[1:])]
DEVICE_CAPACITY = 32 << 20
BLOB_BACKENDS = ["file", pytest.param("s3", marks=pytest.mark.s3)]
ACCESS = ["embedded", "server"]


def pytest_configure(config):
    config.addinivalue_line("markers", "embedded_only: uses engine internals, so not run through the server")
    config.addinivalue_line("markers", "every_log: also runs on the slower logs (replicated, S3)")
    config.addinivalue_line("markers", "backend_independent: refused before any log or blob store is "
                            "reached, so run on the file log and file blob store only")


def _dropped(item, full: bool) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    if item.get_closest_marker("backend_independent") and (
            params.get("wal_backend", "file") != "file" or params.get("blob_options", "file") != "file"):
        return True
    if not full and params.get("wal_backend") == "device" and params.get("blob_options") == "s3":
        return True  # the blob store sees the same calls whichever log runs: file x S3 covers it
    if params.get("wal_backend") in SLOW_LOGS:
        return not item.get_closest_marker("every_log") or params.get("access") != "embedded" or (
            params.get("blob_options") != "file")
    if params.get("access") != "server":
        return False
    return bool(item.get_closest_marker("embedded_only")) or not full and (
        params.get("wal_backend", "file") != "file" or params.get("blob_options", "file") != "file")


def pytest_collection_modifyitems(config, items):
    """Deselect the "server" runs of embedded_only tests, and (unless the full matrix is asked
    for) the device ring on S3 batches and the server runs on other backends than the file WAL
    and file blob store; the slower logs
    keep only the embedded runs of the tests marked every_log."""
    full = os.environ.get("SEDIMENT_TEST_SERVER_MATRIX") == "full"
    drop = [item for item in items if _dropped(item, full)]
    if drop:
        config.hook.pytest_deselected(items=drop)
        dropped = set(map(id, drop))
        items[:] = [item for item in items if id(item) not in dropped]


@pytest.fixture(params=ACCESS)
def access(request):
    """How the test reaches the engine: in process, or over the network (see the module doc)."""
    return request.param


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


def _slow_log_options(wal_backend: str, request) -> dict:
    """The deployment of a slower log: for the replicated log, three storage nodes (stopped
    when the test ends), its ZooKeeper and a shared blob directory; for the log on S3, a bucket."""
    tmp_path = request.getfixturevalue("tmp_path")
    if wal_backend == "s3":
        endpoint, bucket = request.getfixturevalue("s3_bucket")
        return {"endpoint": endpoint, "bucket": bucket}
    zookeeper, root = request.getfixturevalue("zookeeper"), request.getfixturevalue("zk_root")
    nodes = InProcessNodes(tmp_path / "storage-nodes")
    nodes.start()
    request.addfinalizer(nodes.stop)
    return {"replicas": nodes.addresses, "cluster_key": str(KEY),
            "metadata": f"zk://{zookeeper.hosts}{root}", "blob": f"file://{tmp_path}/shared-blobs"}


@pytest.fixture
def engine_options(wal_backend, blob_options, request):
    """``engine_options(data_dir)``: the options that select this test's backends, also for
    child processes (crash tests), which must open the same WAL and blob store."""
    slow = _slow_log_options(wal_backend, request) if wal_backend in SLOW_LOGS else {}

    def options(data_dir) -> dict:
        if wal_backend == "s3":  # nothing but S3; each data directory its own engine
            at = f"s3://{slow['bucket']}/{os.path.basename(data_dir)}"
            return {"wal": f"{at}/wal", "metadata": f"{at}/meta?endpoint={slow['endpoint']}",
                    "blob": f"{at}/blobs", "s3_endpoint": slow["endpoint"]}
        if wal_backend == "replicated":
            return dict(slow)
        out = dict(blob_options)
        if wal_backend == "device":  # a preallocated file beside the data directory stands for the device
            out.update(wal=f"device:{data_dir}.ring", wal_capacity=DEVICE_CAPACITY)
        else:
            out["wal"] = wal_backend
        return out

    return options


@pytest.fixture
def open_engine(tmp_path, engine_options, access):
    opened = []

    def _open(data_dir=None, **options):
        data_dir = str(data_dir or tmp_path / "data")
        for key, value in engine_options(data_dir).items():
            options.setdefault(key, value)
        options.setdefault("segment_bytes", 1 << 20)
        engine = sediment.open(data_dir, **options)
        if access == "server":
            from sediment.server import serve_local

            engine = serve_local(engine)  # its close() stops the server and closes the engine
        opened.append(engine)
        return engine

    yield _open
    for engine in opened:
        engine.close()
