"""Raw runs (batch format version 2, trace/raw.py): a bulk load's file as its writer wrote it
reads through the trace store as the sorted, consolidated run of its updates (whole reads,
streamed reads, merges), its footer is checked against the trace state like any batch's, and
version 1 batches and footers read as before."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sediment.blob.file import FileBlobStore
from sediment.blob.memory import MemoryBlobStore
from sediment.errors import BatchCorruption, TraceError
from sediment.metadata.memory import MemoryMetadataStore
from sediment.trace.batch import (
    FORMAT_VERSION,
    RAW_VERSION,
    BatchDescription,
    batch_key,
    checksums,
    encode_batch,
    read_description,
)
from sediment.trace.raw import raw_matches
from sediment.trace.state import BatchRef, TraceState
from sediment.trace.store import TraceStore

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string()), ("time", pa.int64()), ("diff", pa.int64())])
FRAME = pa.schema([pa.field("v", pa.string()), pa.field("k", pa.int64(), nullable=False)])  # Spark's order, not null


def raw_file(rows: list[tuple], desc: BatchDescription, schema: pa.Schema = FRAME, group: int = 2) -> bytes:
    table = pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema=schema)
    sink = pa.BufferOutputStream()
    pq.write_table(table.replace_schema_metadata(desc.to_metadata()), sink, row_group_size=group,
                   compression="snappy")
    return sink.getvalue().to_pybytes()


def put(store: TraceStore, data: bytes, desc: BatchDescription) -> BatchRef:
    key = batch_key(desc.relation_id, desc.lower, desc.upper, "r" + str(len(data)))
    store.blobs.put_if_absent(key, data)
    crc, footer_crc = checksums(data)
    return BatchRef(key, desc.lower, desc.upper, desc.rows, len(data), 0, desc.since, None, None, crc, footer_crc,
                    True, desc.time, desc.diff)


@pytest.fixture(params=["memory", "file"])
def store(request, tmp_path) -> TraceStore:
    blobs = MemoryBlobStore() if request.param == "memory" else FileBlobStore(str(tmp_path / "blobs"))
    s = TraceStore(MemoryMetadataStore(), blobs)
    s.set_schema(1, SCHEMA)
    return s


def as_rows(t: pa.Table) -> list[tuple]:
    return [tuple(r.values()) for r in t.select(SCHEMA.names).to_pylist()]


def test_a_raw_run_reads_as_its_consolidated_updates_whole_streamed_and_merged(store):
    """Rows out of order, a repeat, row groups of two; time and diff only in the footer."""
    desc = BatchDescription(1, 6, 7, 3, 5, format_version=RAW_VERSION, time=6, diff=-1)
    rows = [("b", 2), ("a", 1), ("b", 2), (None, 9), ("a", 0)]
    ref = put(store, raw_file(rows, desc), desc)
    want = [(0, "a", 6, -1), (1, "a", 6, -1), (2, "b", 6, -2), (9, None, 6, -1)]
    assert as_rows(store.read(1, ref)) == want
    assert [as_rows(t) for t in store.read_stream(1, ref)] == [want]  # one consolidated piece
    assert sum(t.num_rows for t in store.read_stream(1, ref, as_stored=True)) == 5  # as written
    assert store.verify(TraceState(1, upper=0, pending=(ref,))) == []
    plain = store.write(1, pa.table({"k": [1], "v": ["a"], "time": [6], "diff": [1]}, schema=SCHEMA), 6, 7, 3)
    merged = store.merge(1, [ref, plain], ["k", "v"], SCHEMA, 3, 1, chunk_rows=2, span=(6, 7))
    assert not merged.raw and as_rows(store.read(1, merged)) == [(0, "a", 6, -1), (2, "b", 6, -2), (9, None, 6, -1)]
    assert read_description(store.blobs.get(merged.key)).format_version == FORMAT_VERSION


def test_a_raw_run_with_its_own_time_column_keeps_each_row_s_time(store):
    schema = pa.schema([("k", pa.int64()), ("time", pa.int64()), ("v", pa.string())])
    desc = BatchDescription(1, 4, 9, 0, 4, format_version=RAW_VERSION, diff=1)
    ref = put(store, raw_file([(5, 8, "x"), (5, 4, "x"), (5, 8, "x"), (1, 4, None)], desc, schema), desc)
    assert as_rows(store.read(1, ref)) == [(1, None, 4, 1), (5, "x", 4, 1), (5, "x", 8, 2)]
    bad = BatchDescription(1, 4, 6, 0, 4, format_version=RAW_VERSION, diff=1)  # 8 is outside [4, 6)
    ref = put(store, raw_file([(5, 8, "x"), (5, 4, "x"), (5, 8, "x"), (1, 4, None)], bad, schema), bad)
    with pytest.raises(BatchCorruption, match="times span"):
        store.read(1, ref)


def test_a_raw_footer_that_is_not_what_the_state_says_is_refused(store):
    desc = BatchDescription(1, 6, 7, 3, 2, format_version=RAW_VERSION, time=6, diff=1)
    ref = put(store, raw_file([("a", 1), ("b", 2)], desc), desc)
    for wrong in (dataclasses.replace(ref, diff=2), dataclasses.replace(ref, raw=False, time=None, diff=None)):
        with pytest.raises(BatchCorruption, match="sediment.(diff|format_version|time)"):
            store.read(1, wrong)
    other = pa.schema([pa.field("v", pa.string()), pa.field("k", pa.int32())])
    ref = put(store, raw_file([("a", 1)], dataclasses.replace(desc, rows=1), other), dataclasses.replace(desc, rows=1))
    with pytest.raises(BatchCorruption, match="footer's schema"):
        store.read(1, ref)


def test_raw_schemas_and_constants_are_checked():
    rel = SCHEMA
    assert raw_matches(FRAME, rel, 6, 1)
    assert not raw_matches(FRAME, rel, None, 1)  # no time column and no constant
    assert not raw_matches(FRAME.append(pa.field("time", pa.int64())), rel, 6, 1)  # both
    assert not raw_matches(FRAME.append(pa.field("w", pa.int64())), rel, 6, 1)  # an unknown column
    assert not raw_matches(pa.schema([("k", pa.int64())]), rel, 6, 1)  # a missing one
    assert raw_matches(FRAME.append(pa.field("diff", pa.int64())), rel, 6, None)
    with pytest.raises(TraceError, match="constant diff"):
        BatchDescription(1, 6, 7, 3, 1, format_version=RAW_VERSION, time=6, diff=0)
    with pytest.raises(TraceError, match="constant time"):
        BatchDescription(1, 6, 7, 3, 1, format_version=RAW_VERSION, time=7, diff=1)
    with pytest.raises(TraceError, match="no constant"):
        BatchDescription(1, 6, 7, 3, 1, time=6)


def test_version_1_footers_keep_their_keys_and_still_read():
    """A footer written before version 2 existed (no time or diff keys) reads as version 1,
    and a version 1 batch written now has exactly the old keys."""
    desc = BatchDescription(1, 0, 5, 0, 1)
    data = encode_batch(pa.table({"k": [1], "v": ["a"], "time": [2], "diff": [1]}, schema=SCHEMA), desc)
    keys = {k.decode() for k in pq.ParquetFile(pa.BufferReader(data)).metadata.metadata if k.startswith(b"sediment.")}
    assert keys == {f"sediment.{n}" for n in ("format", "format_version", "relation_id", "lower", "upper", "since",
                                              "rows", "wal_first", "wal_last", "level")}
    assert read_description(data) == desc and (desc.time, desc.diff) == (None, None)
    assert BatchRef("k", 0, 5).to_json() == {"key": "k", "lower": 0, "upper": 5, "rows": 0, "bytes": 0, "level": 0,
                                             "since": 0, "wal_first": None, "wal_last": None}
