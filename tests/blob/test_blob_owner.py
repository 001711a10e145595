"""Issue 12 finding 6: a blob prefix has one owner. Two data directories on one prefix
(file store and S3 on moto): the second is refused with BlobPrefixOwned naming the prefix
and the owner, writes and deletes nothing there, and the first keeps its data. The sweep
leaves other writers' objects alone; a coordinator sharing the metadata store shares the
identity; taking a prefix over is explicit."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest

import sediment
from sediment.blob import owner as owner_mod
from sediment.blob.memory import MemoryBlobStore
from sediment.blob.uri import open_blob_store
from sediment.errors import BlobPrefixOwned, WalMissing

SCHEMA = pa.schema([("k", pa.int64())])


def _fill(engine, n: int) -> None:
    engine.add_relation("r", SCHEMA)
    engine.append("r", pa.table({"k": list(range(n)), "time": [1] * n, "diff": [1] * n}))
    engine.seal("r", 1)
    engine.compact()


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def prefix(request, tmp_path):
    """(blob URI, s3 endpoint or None) of one prefix both engines are pointed at."""
    if request.param == "file":
        return f"file://{tmp_path / 'shared-blobs'}", None
    endpoint, bucket = request.getfixturevalue("s3_bucket")
    return f"s3://{bucket}/shared", endpoint


def _listing(uri: str, endpoint: str | None) -> dict[str, bytes]:
    store = open_blob_store(uri, s3_endpoint=endpoint) if endpoint else open_blob_store(uri)
    try:
        return {k: store.get(k) for k in store.list("")}
    finally:
        store.close()


def test_second_engine_on_a_prefix_is_refused_and_the_first_keeps_its_data(tmp_path, prefix):
    uri, endpoint = prefix
    opts = {"blob": uri, "s3_endpoint": endpoint, "compact_interval": None}
    with sediment.open(str(tmp_path / "a"), **opts) as a:
        _fill(a, 40)
        owner_id = json.loads(a.storage.meta.get("engine/storage").value)["engine_id"]
    before = _listing(uri, endpoint)
    assert owner_mod.OWNER_KEY in before and any(k.startswith("trace/") for k in before)
    (tmp_path / "b").mkdir()  # an operator's directory: the refused open leaves it as it was, for verify
    with pytest.raises(BlobPrefixOwned) as info:
        sediment.open(str(tmp_path / "b"), **opts)
    assert os.listdir(tmp_path / "b") == []
    assert uri in str(info.value) and owner_id in str(info.value) and str(tmp_path / "a") in str(info.value)
    assert _listing(uri, endpoint) == before  # nothing written or deleted
    from sediment.engine.verify import verify_data_dir

    report = verify_data_dir(str(tmp_path / "b"), blob=uri, s3_endpoint=endpoint)
    assert any(owner_id in p and uri in p for p in report.problems)  # verify agrees with open
    assert verify_data_dir(str(tmp_path / "a"), blob=uri, s3_endpoint=endpoint).ok
    with sediment.open(str(tmp_path / "a"), **opts) as a:
        assert a.snapshot("r", 1).num_rows == 40


def test_the_sweep_leaves_foreign_objects_alone(tmp_path, prefix):
    uri, endpoint = prefix
    opts = {"blob": uri, "s3_endpoint": endpoint, "compact_interval": None}
    with sediment.open(str(tmp_path / "a"), **opts) as a:
        _fill(a, 10)
        tag = a.traces.owner_tag
        blobs = a.traces.blobs
        foreign = [f"trace/{5:016x}/{0:016x}-{9:016x}-0123456789abcdef.parquet",  # another engine's batch
                   "trace/notes.txt", "elsewhere/x"]
        for key in foreign:
            blobs.put(key, b"not mine")
        mine = f"trace/{5:016x}/{0:016x}-{9:016x}-{tag}feed.parquet"
        blobs.put(mine, b"my unreferenced batch: a crash before commit")
    with sediment.open(str(tmp_path / "a"), **opts) as a:
        assert mine in a.swept and not set(foreign) & set(a.swept)
        left = set(a.traces.blobs.list(""))
        assert set(foreign) <= left and mine not in left
        assert a.snapshot("r", 1).num_rows == 10


def test_a_second_data_directory_on_the_same_metadata_store_is_no_takeover(tmp_path):
    """The metadata store carries the engine's identity, so a second coordinator on it is the
    same engine, never a foreign owner of the prefix. With a local log it is still refused,
    for the log (which lives in the first data directory), and nothing is swept. (Replicated
    failover, where the log is on storage nodes, is tested in test_replicated_engine.py.)"""
    uri = f"file://{tmp_path / 'blobs'}"
    meta = str(tmp_path / "shared-meta")
    with sediment.open(str(tmp_path / "coordinator-1"), blob=uri, metadata=meta, compact_interval=None) as a:
        _fill(a, 7)
    before = sorted(p.name for p in (tmp_path / "blobs").rglob("*"))
    with pytest.raises(WalMissing, match="coordinator-2"):
        sediment.open(str(tmp_path / "coordinator-2"), blob=uri, metadata=meta, compact_interval=None)
    assert sorted(p.name for p in (tmp_path / "blobs").rglob("*")) == before
    with sediment.open(str(tmp_path / "coordinator-1"), blob=uri, metadata=meta, compact_interval=None) as a:
        assert a.snapshot("r", 1).num_rows == 7


def test_take_over_is_explicit_and_keeps_the_old_owners_objects(tmp_path):
    uri = f"file://{tmp_path / 'blobs'}"
    with sediment.open(str(tmp_path / "a"), blob=uri, compact_interval=None) as a:
        _fill(a, 5)
        a_id = json.loads(a.storage.meta.get("engine/storage").value)["engine_id"]
        a_keys = set(a.traces.blobs.list("trace/"))
    with sediment.open(str(tmp_path / "b"), blob=uri, compact_interval=None, take_over_blob_prefix=True) as b:
        b_id = json.loads(b.storage.meta.get("engine/storage").value)["engine_id"]
        marker = owner_mod.read_owner(b.traces.blobs, uri)
        assert marker is not None and (marker.engine_id, marker.taken_from) == (b_id, a_id)
        assert a_keys <= set(b.traces.blobs.list("trace/"))  # not this engine's: never swept
    with pytest.raises(BlobPrefixOwned, match=b_id):
        sediment.open(str(tmp_path / "a"), blob=uri, compact_interval=None)


def test_cli_flag_takes_over(tmp_path, capsys):
    from sediment.cli import main

    uri = f"file://{tmp_path / 'blobs'}"
    with sediment.open(str(tmp_path / "a"), blob=uri, compact_interval=None) as a:
        _fill(a, 3)
    base = ["--data-dir", str(tmp_path / "b"), "--blob", uri]
    assert main([*base, "relation", "add", "s", "--schema", "k:int64"]) != 0
    assert "take-over-blob-prefix" in capsys.readouterr().err
    assert main([*base, "--take-over-blob-prefix", "relation", "add", "s", "--schema", "k:int64"]) == 0


def test_claim_race_and_damaged_marker():
    store = MemoryBlobStore()
    one, two = "a" * 32, "b" * 32
    owner_mod.check_owner(store, one, "memory://x")
    owner_mod.check_owner(store, two, "memory://x")  # both saw a free prefix
    assert owner_mod.claim(store, one, "memory://x").engine_id == one
    with pytest.raises(BlobPrefixOwned, match=one):
        owner_mod.claim(store, two, "memory://x")
    assert owner_mod.claim(store, one, "memory://x").engine_id == one
    store.put(owner_mod.OWNER_KEY, b"\xff garbage")
    with pytest.raises(BlobPrefixOwned, match="unreadable"):
        owner_mod.check_owner(store, one, "memory://x")
    assert owner_mod.claim(store, two, "memory://x", take_over=True).engine_id == two
