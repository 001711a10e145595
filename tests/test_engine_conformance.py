"""The engine's behaviour does not depend on its log: a representative part of the engine suite
(tests/test_engine.py: relations, reads, restarts, replay, transactions, commit_all, bad input,
the directory lock, SIGKILL mid-append) runs here over the file log, the device ring, the
replicated log and the log on S3. The tests are the engine suite's own functions, collected again in this module
so they use this module's ``open_engine``; the replicated engine runs on three storage nodes on
127.0.0.1 (in this process: tests/wal_backends.py), its metadata in a real ZooKeeper and its
batches in a shared blob directory, as a deployment does; the log on S3 with its metadata and
batches in S3 too (moto), as an S3-only deployment."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from test_engine import (  # noqa: F401 - collected here, run on every WAL backend
    test_append_many_is_atomic_across_relations,
    test_bad_input_is_a_typed_error_and_writes_nothing,
    test_commit_all_aborts_every_transaction_when_one_cannot_commit,
    test_commit_all_makes_several_transactions_visible_as_one_and_survives_restart,
    test_commit_fails_when_its_times_were_sealed_meanwhile,
    test_concurrent_appends_and_seals_never_violate_the_frontier,
    test_large_append_splits_into_one_atomic_transaction,
    test_relations_add_list_schema_drop,
    test_replay_is_time_ordered_and_complete,
    test_second_engine_on_same_dir_is_refused,
    test_set_since_rules,
    test_sigkill_mid_appends_keeps_acknowledged_and_no_partial_transaction,
    test_snapshot_consolidates_and_sorts,
    test_state_survives_restart,
    test_transaction_visible_only_after_commit_and_abort_leaves_nothing,
)
from wal_backends import KEY, InProcessNodes

import sediment

pytestmark = pytest.mark.timeout(300)
DEVICE_CAPACITY = 32 << 20


@pytest.fixture(params=["file", "device", pytest.param("replicated", marks=pytest.mark.zookeeper),
                        pytest.param("s3", marks=pytest.mark.s3)])
def wal_kind(request):
    return request.param


@pytest.fixture
def engine_options(wal_kind, tmp_path, request):
    """``engine_options(data_dir)``: the options selecting this test's log, also for child processes."""
    extra: dict = {}
    if wal_kind == "replicated":
        zookeeper = request.getfixturevalue("zookeeper")
        root = request.getfixturevalue("zk_root")
        nodes = InProcessNodes(tmp_path / "storage-nodes")
        nodes.start()
        request.addfinalizer(nodes.stop)
        extra = {"replicas": nodes.addresses, "cluster_key": str(KEY),
                 "metadata": f"zk://{zookeeper.hosts}{root}", "blob": f"file://{tmp_path}/shared-blobs"}

    if wal_kind == "s3":
        endpoint, bucket = request.getfixturevalue("s3_bucket")

    def options(data_dir) -> dict:
        if wal_kind == "s3":  # nothing but S3; each data directory its own engine
            at = f"s3://{bucket}/{os.path.basename(data_dir)}"
            return {"wal": f"{at}/wal", "metadata": f"{at}/meta?endpoint={endpoint}", "blob": f"{at}/blobs",
                    "s3_endpoint": endpoint}
        if wal_kind == "device":
            return {"wal": f"device:{data_dir}.ring", "wal_capacity": DEVICE_CAPACITY}
        if wal_kind == "replicated":
            return dict(extra)
        return {"wal": "file"}

    return options


@pytest.fixture
def open_engine(tmp_path, engine_options):
    opened = []

    def _open(data_dir=None, **options):
        data_dir = str(data_dir or tmp_path / "data")
        for key, value in engine_options(data_dir).items():
            options.setdefault(key, value)
        options.setdefault("segment_bytes", 1 << 20)
        engine = sediment.open(data_dir, **options)
        opened.append(engine)
        return engine

    yield _open
    for engine in opened:
        engine.close()


def test_compaction_trims_the_log_and_a_restart_reads_the_same(open_engine, wal_kind):
    """Compaction moves sealed updates into batches and trims the log below them; the
    reopened engine answers exactly as before, from batches and the log's tail."""
    eng = open_engine(segment_bytes=1 << 14)
    eng.add_relation("r", pa.schema([("k", pa.int64())]))
    for t in range(1, 200):
        eng.append("r", pa.table({"k": [t % 17], "time": [t], "diff": [1]}))
        eng.seal("r", t)
    eng.compact()
    before = eng.snapshot("r", 199).sort_by("k").to_pylist()
    assert sum(r["diff"] for r in before) == 199
    assert eng.wal.start_lsn > 0, f"the {wal_kind} log was not trimmed after compaction"
    eng.close()
    eng = open_engine(segment_bytes=1 << 14)
    assert eng.sealed("r") == 199
    assert eng.snapshot("r", 199).sort_by("k").to_pylist() == before
    eng.append("r", pa.table({"k": [1], "time": [200], "diff": [1]}))
    eng.seal("r", 200)
    assert sum(r["diff"] for r in eng.snapshot("r", 200).to_pylist()) == 200
