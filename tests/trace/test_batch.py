"""The Parquet batch format: round trips, description checks, checksums, keys, streaming."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sediment.errors import BatchCorruption, BlobNotFound, TraceError
from sediment.trace.batch import (
    BatchDescription,
    BatchWriter,
    batch_key,
    decode_batch,
    encode_batch,
    iter_batch,
    new_nonce,
    parse_batch_key,
    read_batch,
    read_description,
    write_batch_stream,
)


class DictStore:
    """A minimal BlobStore that records the reads it serves."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.range_reads: list[int] = []
        self.whole_reads = 0

    def get(self, key: str) -> bytes:
        self.whole_reads += 1
        if key not in self.objects:
            raise BlobNotFound(key)
        return self.objects[key]

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if key not in self.objects:
            raise BlobNotFound(key)
        self.range_reads.append(length)
        return self.objects[key][start : start + length]

    def size(self, key: str) -> int:
        if key not in self.objects:
            raise BlobNotFound(key)
        return len(self.objects[key])

    def put(self, key: str, data: bytes) -> None:
        self.objects[key] = data


def make_table(n: int, *, lower: int = 0, upper: int = 100, seed: int = 0) -> pa.Table:
    rng = random.Random(seed)
    rows = sorted(
        {(rng.randbytes(8).hex(), rng.randrange(lower, upper)) for _ in range(n)}
    )
    return pa.table(
        {
            "name": pa.array([r[0] for r in rows]),
            "n": pa.array([rng.randrange(1 << 40) for _ in rows], pa.int64()),
            "time": pa.array([r[1] for r in rows], pa.int64()),
            "diff": pa.array([rng.choice([-1, 1, 2]) for _ in rows], pa.int64()),
        }
    )


def desc_for(t: pa.Table, **kw) -> BatchDescription:
    base = dict(relation_id=42, lower=0, upper=100, since=0, rows=t.num_rows, wal_first=5, wal_last=9)
    base.update(kw)
    return BatchDescription(**base)


def test_round_trip_and_metadata():
    t = make_table(1000)
    d = desc_for(t)
    data = encode_batch(t, d, row_group_rows=300)
    assert decode_batch(data, d).equals(t)
    assert read_description(data) == d
    meta = pq.ParquetFile(pa.BufferReader(data)).metadata
    assert meta.num_row_groups == 4
    assert meta.metadata[b"sediment.format"] == b"sediment-trace-batch"
    assert meta.metadata[b"sediment.upper"] == b"100"
    assert meta.metadata[b"sediment.wal_first"] == b"5"
    merged = desc_for(t, wal_first=None, wal_last=None, level=3)
    assert read_description(encode_batch(t, merged)) == merged


def test_all_key_types_round_trip():
    import datetime as dt

    t = pa.table(
        {
            "s": pa.array(["a", None]),
            "y": pa.array([b"\x00", None]),
            "f": pa.array([1.5, None]),
            "b": pa.array([True, None]),
            "ts": pa.array([dt.datetime(2024, 1, 1), None], pa.timestamp("us")),
            "time": pa.array([3, 4], pa.int64()),
            "diff": pa.array([1, -1], pa.int64()),
        }
    )
    d = desc_for(t)
    assert decode_batch(encode_batch(t, d), d).equals(t)


@pytest.mark.parametrize(
    "field,value",
    [("relation_id", 43), ("lower", 1), ("upper", 99), ("since", 7), ("rows", 999), ("wal_first", 4), ("level", 1)],
)
def test_description_mismatch_names_the_key(field, value):
    t = make_table(50)
    d = desc_for(t)
    data = encode_batch(t, d)
    wrong = BatchDescription(**{**d.__dict__, field: value})
    with pytest.raises(BatchCorruption, match=f"sediment.{field}"):
        decode_batch(data, wrong)


def test_missing_metadata_key_is_named():
    t = make_table(10)
    sink = pa.BufferOutputStream()
    w = pq.ParquetWriter(sink, t.schema)
    w.write_table(t)
    meta = desc_for(t).to_metadata()
    del meta["sediment.since"]
    w.add_key_value_metadata(meta)
    w.close()
    with pytest.raises(BatchCorruption, match="sediment.since"):
        decode_batch(sink.getvalue().to_pybytes())


def test_plain_parquet_is_not_a_batch():
    t = make_table(10)
    sink = pa.BufferOutputStream()
    pq.write_table(t, sink)
    with pytest.raises(BatchCorruption, match="not a sediment batch"):
        decode_batch(sink.getvalue().to_pybytes())


def _page_ranges(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each column chunk's data pages."""
    md = pq.ParquetFile(pa.BufferReader(data)).metadata
    out = []
    for g in range(md.num_row_groups):
        for c in range(md.num_columns):
            col = md.row_group(g).column(c)
            start = col.dictionary_page_offset or col.data_page_offset
            out.append((col.data_page_offset, start + col.total_compressed_size))
    return out


def _flip(data: bytes, pos: int) -> bytes:
    b = bytearray(data)
    b[pos] ^= 0x5A
    return bytes(b)


def test_flipped_byte_in_a_data_page_is_detected():
    t = make_table(3000)
    d = desc_for(t)
    data = encode_batch(t, d, row_group_rows=1000)
    ranges = _page_ranges(data)
    assert len(ranges) == 12
    for start, end in ranges:
        # The page's bytes follow its header; the last byte and the middle of a large page are data.
        for pos in {end - 1, (start + end) // 2 if end - start > 400 else end - 2}:
            with pytest.raises(BatchCorruption):
                decode_batch(_flip(data, pos), d)


def _pages(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of every page (dictionary and data) when each column chunk has one data page."""
    md = pq.ParquetFile(pa.BufferReader(data)).metadata
    out = []
    for g in range(md.num_row_groups):
        for c in range(md.num_columns):
            col = md.row_group(g).column(c)
            end = (col.dictionary_page_offset or col.data_page_offset) + col.total_compressed_size
            if col.dictionary_page_offset:
                out.append((col.dictionary_page_offset, col.data_page_offset))
            out.append((col.data_page_offset, end))
    return out


def test_every_flip_in_page_data_is_detected_only_thanks_to_checksums():
    t = make_table(800)
    d = desc_for(t)
    data = encode_batch(t, d)
    header = 96  # a page header (with its min/max statistics) is not covered by the page CRC
    positions = [p for start, end in _pages(data) for p in range(start + header, end, 3)]
    assert len(positions) > 300
    unverified_misses = 0
    for pos in positions:
        bad = _flip(data, pos)
        with pytest.raises(BatchCorruption, match="checksum|decode"):
            decode_batch(bad, d)
        try:
            pq.ParquetFile(pa.BufferReader(bad), page_checksum_verification=False).read()
            unverified_misses += 1
        except (OSError, pa.ArrowException):
            pass
    assert unverified_misses > len(positions) // 4


@pytest.mark.parametrize("cut", [1, 4, 8, 100, 0.5, 0.9])
def test_truncation_is_detected(cut):
    t = make_table(2000)
    data = encode_batch(t, desc_for(t), row_group_rows=500)
    n = int(len(data) * cut) if isinstance(cut, float) else len(data) - cut
    with pytest.raises(BatchCorruption):
        decode_batch(data[:n])


def test_stored_size_mismatch_and_missing_object():
    t = make_table(100)
    d = desc_for(t)
    store = DictStore()
    key = batch_key(42, 0, 100, new_nonce())
    store.put(key, encode_batch(t, d))
    with pytest.raises(BatchCorruption, match="bytes"):
        list(iter_batch(store, key, d, expected_bytes=len(store.objects[key]) + 1))
    with pytest.raises(BatchCorruption, match="missing"):
        list(iter_batch(store, key + "x", d))
    with pytest.raises(BatchCorruption, match="missing"):
        read_batch(store, key + "x", d)
    assert read_batch(store, key, d, expected_bytes=len(store.objects[key])).equals(t)


def test_streaming_reader_reads_one_row_group_at_a_time():
    t = make_table(40_000, seed=3)
    d = desc_for(t)
    store = DictStore()
    key = batch_key(42, 0, 100, new_nonce())
    store.put(key, encode_batch(t, d, row_group_rows=5000))
    size = len(store.objects[key])
    groups = list(iter_batch(store, key, d, expected_bytes=size))
    assert [g.num_rows for g in groups] == [5000] * 8
    assert pa.concat_tables(groups).equals(t)
    assert store.whole_reads == 0
    assert max(store.range_reads) < size / 4


def test_streaming_reader_detects_damage():
    t = make_table(3000)
    d = desc_for(t)
    data = encode_batch(t, d, row_group_rows=1000)
    store = DictStore()
    key = batch_key(42, 0, 100, "abc")
    _, end = _page_ranges(data)[-1]
    store.put(key, _flip(data, end - 1))
    with pytest.raises(BatchCorruption, match="row group 2"):
        list(iter_batch(store, key, d))


def test_encode_rejects_times_outside_the_description():
    t = make_table(100, lower=10, upper=20)
    with pytest.raises(TraceError, match="times span"):
        encode_batch(t, desc_for(t, lower=11, upper=20))
    with pytest.raises(TraceError, match="times span"):
        encode_batch(t, desc_for(t, lower=10, upper=19))
    with pytest.raises(TraceError, match="rows"):
        encode_batch(t, desc_for(t, lower=10, upper=20, rows=1))
    advanced = t.set_column(2, "time", pa.array([30] * t.num_rows, pa.int64()))
    # since beyond upper: every time was advanced to since
    assert decode_batch(encode_batch(advanced, desc_for(t, lower=10, upper=20, since=30))).equals(advanced)


def test_description_validation():
    with pytest.raises(TraceError, match="lower must be < upper"):
        BatchDescription(relation_id=1, lower=5, upper=5, since=0, rows=0)
    with pytest.raises(TraceError, match="both"):
        BatchDescription(relation_id=1, lower=0, upper=5, since=0, rows=0, wal_first=1)
    with pytest.raises(TraceError, match="rows"):
        BatchDescription(relation_id=1, lower=0, upper=5, since=0, rows=-1)


def test_writer_makes_full_row_groups_from_small_chunks(tmp_path):
    t = make_table(10_000)
    d = desc_for(t, rows=0)
    path = str(tmp_path / "b.parquet")
    chunks = [t.slice(i, 37) for i in range(0, t.num_rows, 37)]
    final = write_batch_stream(chunks, t.schema, d, path, row_group_rows=4096)
    assert final.rows == t.num_rows
    pf = pq.ParquetFile(path)
    assert [pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)] == [4096, 4096, t.num_rows - 8192]
    data = open(path, "rb").read()
    assert decode_batch(data, final).equals(t)


def test_empty_batch():
    schema = pa.schema([("k", pa.string()), ("time", pa.int64()), ("diff", pa.int64())])
    d = BatchDescription(relation_id=1, lower=0, upper=5, since=0, rows=0)
    sink = pa.BufferOutputStream()
    w = BatchWriter(sink, schema, d)
    assert w.finish() == d
    out = decode_batch(sink.getvalue().to_pybytes(), d)
    assert out.num_rows == 0 and out.schema == schema


U64 = st.integers(0, 2**64 - 1)
NONCE = st.text("0123456789abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=20)


@given(U64, U64, U64, NONCE)
def test_key_round_trip(rel, lo, hi, nonce):
    key = batch_key(rel, lo, hi, nonce)
    assert parse_batch_key(key) == (rel, lo, hi, nonce)
    assert key == key.lower()


@settings(max_examples=50)
@given(st.lists(st.tuples(U64, U64, NONCE), min_size=2, max_size=20))
def test_key_text_order_is_time_order(intervals):
    keys = [batch_key(7, lo, hi, n) for lo, hi, n in intervals]
    assert [parse_batch_key(k)[1:3] for k in sorted(keys)] == sorted((lo, hi) for lo, hi, _ in intervals)


@pytest.mark.parametrize(
    "key",
    [
        "trace/000000000000002a/0000000000000000-0000000000000064-x.parq",
        "trace/2a/0000000000000000-0000000000000064-x.parquet",
        "trace/000000000000002A/0000000000000000-0000000000000064-x.parquet",
        "wal/000000000000002a/0000000000000000-0000000000000064-x.parquet",
        "trace/000000000000002a/0000000000000000-0000000000000064-.parquet",
    ],
)
def test_parse_rejects_other_keys(key):
    with pytest.raises(BatchCorruption, match="not a batch key"):
        parse_batch_key(key)


def test_key_rejects_bad_parts():
    with pytest.raises(TraceError, match="nonce"):
        batch_key(1, 0, 1, "A/B")
    with pytest.raises(TraceError, match="lower"):
        batch_key(1, -1, 1, "a")


def test_order_is_verified_on_request_across_row_groups():
    t = make_table(1000)
    d = desc_for(t)
    good = encode_batch(t, d, row_group_rows=300)
    assert decode_batch(good, d, key_columns=["name"]).equals(t)
    swapped = pa.concat_tables([t.slice(0, 300), t.slice(301, 1), t.slice(300, 1), t.slice(302)])
    bad = encode_batch(swapped, d, row_group_rows=300)
    assert decode_batch(bad, d).num_rows == 1000  # order is not checked unless asked
    with pytest.raises(BatchCorruption, match="row group 1 row 1 does not follow"):
        decode_batch(bad, d, key_columns=["name"])
    store = DictStore()
    store.put("k", bad)
    with pytest.raises(BatchCorruption, match="row group 1 row 1"):
        list(iter_batch(store, "k", d, key_columns=["name"]))
    dup = pa.concat_tables([t.slice(0, 300), t.slice(299, 1), t.slice(301)])
    with pytest.raises(BatchCorruption, match="row group 1 row 0"):
        decode_batch(encode_batch(dup, d, row_group_rows=300), d, key_columns=["name"])


def test_open_batch_and_read_row_group_over_a_blob_reader():
    from sediment.blob.reader import BlobReader
    from sediment.trace.batch import open_batch, read_row_group

    t = make_table(1000)
    d = desc_for(t)
    store = DictStore()
    store.put("k", encode_batch(t, d, row_group_rows=400))
    pf, desc = open_batch(pa.PythonFile(BlobReader(store, "k"), mode="r"), d, where="batch 'k'")
    assert desc == d and pf.num_row_groups == 3
    assert pa.concat_tables([read_row_group(pf, i, desc) for i in range(3)]).equals(t)
    with pytest.raises(BatchCorruption, match="sediment.since"):
        open_batch(pa.PythonFile(BlobReader(store, "k"), mode="r"), desc_for(t, since=1))


def test_wide_row_groups_are_decoded_fewer_at_a_time(monkeypatch):
    """The read-ahead keeps about AHEAD_BYTES of decoded row groups in flight: 8 narrow row
    groups ahead, fewer as they grow, one at a time when one is past the budget (wide rows)."""
    from sediment import read_ahead
    from sediment.read_ahead import pool_workers
    from sediment.trace import batch as batch_mod

    t = make_table(2000)
    d = desc_for(t)
    meta = pq.ParquetFile(pa.BufferReader(encode_batch(t, d, row_group_rows=500))).metadata
    group_bytes = max(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    monkeypatch.setattr(read_ahead, "AHEAD_BYTES", 100 * group_bytes)
    assert batch_mod.groups_in_flight(meta) == 2 * pool_workers()
    monkeypatch.setattr(read_ahead, "AHEAD_BYTES", 3 * group_bytes)
    assert batch_mod.groups_in_flight(meta) == min(3, 2 * pool_workers())
    monkeypatch.setattr(read_ahead, "AHEAD_BYTES", group_bytes // 2)
    assert batch_mod.groups_in_flight(meta) == 0
    data = encode_batch(t, d, row_group_rows=500)
    asked, real = [], batch_mod.ordered_map
    monkeypatch.setattr(batch_mod, "ordered_map", lambda fn, items, ahead=None: asked.append(ahead) or real(fn, items, ahead=ahead))
    pf = pq.ParquetFile(pa.BufferReader(data))
    got = list(batch_mod.groups_ahead(pf, pa.py_buffer(data), d, "batch", lambda g: g, page_checks=True))
    assert asked == [0] and pa.concat_tables(got).equals(t)  # the reader asks for what the budget allows
