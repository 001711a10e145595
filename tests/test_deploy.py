"""The replicated data-directory marker and the shared-blob rule (engine/deploy.py)."""

from __future__ import annotations

import pytest

import sediment
from sediment.engine.deploy import (
    decode_marker,
    encode_marker,
    read_marker,
    require_shared_blob,
    write_marker,
)
from sediment.errors import StorageRecordMismatch


def test_every_damaged_marker_is_refused_with_a_typed_error():
    good = encode_marker("zk://127.0.0.1:2181/x")
    assert decode_marker(good) == "zk://127.0.0.1:2181/x"
    for i in range(len(good)):
        for bit in range(8):
            bad = bytearray(good)
            bad[i] ^= 1 << bit
            with pytest.raises(StorageRecordMismatch):
                decode_marker(bytes(bad))
    for n in range(len(good)):
        with pytest.raises(StorageRecordMismatch):
            decode_marker(good[:n])


def test_marker_round_trip_and_a_marker_naming_a_python_object_refuses_to_open_without_metadata(tmp_path):
    """A marker names its metadata store so that later opens find it; a store that was a
    Python object (written as ``<ClassName>``) cannot be found from its name: refused."""
    assert read_marker(str(tmp_path)) is None
    write_marker(str(tmp_path), "zk://h:1/root")
    assert read_marker(str(tmp_path)) == "zk://h:1/root"
    write_marker(str(tmp_path), "<MemoryMetadataStore>")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(StorageRecordMismatch, match="<MemoryMetadataStore>"):
        sediment.open(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("blob", [None, "memory://", "/some/path"])
def test_replicated_mode_refuses_blob_stores_other_coordinators_cannot_reach(blob):
    with pytest.raises(StorageRecordMismatch, match="every coordinator"):
        require_shared_blob(blob, "/data")
    require_shared_blob("s3://bucket/prefix", "/data")
    require_shared_blob("file:///shared/mount", "/data")


def test_tail_cache_keeps_lsn_order_evicts_oldest_and_forgets_trimmed():
    from sediment.wal.record import Record, RecordKind
    from sediment.wal.replication.tail_cache import TailCache

    def r(lsn: int, n: int = 10) -> Record:
        return Record(RecordKind.UPDATES, body=bytes(n), lsn=lsn)

    size = r(0).frame_size
    cache = TailCache(max_bytes=3 * size)
    cache.add([r(0), r(1)])
    cache.add([r(2), r(3)])
    assert [cache.get(i) is not None for i in range(4)] == [False, True, True, True], "oldest evicted"
    assert cache.bytes == 3 * size
    cache.add([r(1)])
    assert len(cache) == 3
    cache.trim(3)
    assert cache.get(2) is None and cache.get(3).lsn == 3 and cache.bytes == size
    cache.trim(10)
    assert len(cache) == 0 and cache.bytes == 0
