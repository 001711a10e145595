"""The streamed k-way merge against concat + consolidate, and its memory bound."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sediment.errors import TraceError
from sediment.trace.batch import BatchDescription, decode_batch
from sediment.trace.consolidate import consolidate
from sediment.trace.merge import MergeStats, merge_sorted, merge_to_batch

SCHEMA = pa.schema([("k", pa.string()), ("x", pa.int64()), ("time", pa.int64()), ("diff", pa.int64())])
KEYS = ["k", "x"]

update = st.fixed_dictionaries(
    {
        "k": st.sampled_from(["a", "b", "c", None]),
        "x": st.sampled_from([0, 1, None]),
        "time": st.integers(0, 5),
        "diff": st.integers(-2, 2),
    }
)


@st.composite
def chunked_input(draw):
    """A consolidated sorted table cut into random RecordBatches (possibly empty ones)."""
    t = consolidate(pa.Table.from_pylist(draw(st.lists(update, max_size=40)), schema=SCHEMA), KEYS)
    cuts = sorted(draw(st.lists(st.integers(0, t.num_rows), max_size=4)))
    out, prev = [], 0
    for c in [*cuts, t.num_rows]:
        out.extend(t.slice(prev, c - prev).to_batches() or [pa.RecordBatch.from_pylist([], schema=t.schema)])
        prev = c
    return t, out


@settings(max_examples=300, deadline=None)
@given(
    st.lists(chunked_input(), min_size=1, max_size=5),
    st.none() | st.integers(0, 6),
    st.integers(1, 6),
)
def test_merge_matches_concat_then_consolidate(inputs, since, chunk_rows):
    stats = MergeStats()
    out = list(merge_sorted([chunks for _, chunks in inputs], KEYS, since, chunk_rows, stats=stats))
    expected = consolidate(pa.concat_tables([t for t, _ in inputs]), KEYS, since)
    got = pa.concat_tables(out) if out else expected.schema.empty_table()
    assert got.to_pylist() == expected.to_pylist()
    assert all(0 < o.num_rows <= chunk_rows for o in out)
    seen = [(r["k"], r["x"], r["time"]) for r in got.to_pylist()]
    assert len(seen) == len(set(seen))
    assert stats.max_buffered_rows <= len(inputs) * (chunk_rows + 1)
    assert stats.rows_out == expected.num_rows


@settings(max_examples=100, deadline=None)
@given(st.lists(update, max_size=60), st.integers(1, 4), st.integers(1, 5))
def test_unconsolidated_sorted_inputs_with_duplicates_across_chunks(rows, copies, chunk_rows):
    # The same rows in several inputs, each sorted but not consolidated: every (row, time)
    # occurs in every input and in runs that straddle chunk boundaries.
    t = pa.Table.from_pylist(rows, schema=SCHEMA).sort_by([("k", "ascending"), ("x", "ascending"), ("time", "ascending")])
    out = list(merge_sorted([[t]] * copies, KEYS, None, chunk_rows))
    expected = consolidate(pa.concat_tables([t] * copies), KEYS)
    assert (pa.concat_tables(out).to_pylist() if out else []) == expected.to_pylist()


def _big_input(n: int, offset: int, step: int) -> pa.Table:
    keys = list(range(offset, offset + n * step, step))
    return pa.table(
        {
            "k": pa.array([f"{k % 997:04d}" for k in keys]),
            "x": pa.array(keys, pa.int64()),
            "time": pa.array([k % 7 for k in keys], pa.int64()),
            "diff": pa.array([1 if k % 3 else -1 for k in keys], pa.int64()),
        }
    ).sort_by([("k", "ascending"), ("x", "ascending"), ("time", "ascending")])


def test_memory_is_bounded_by_inputs_times_chunk_rows():
    inputs = [_big_input(100_000, o, s) for o, s in [(0, 1), (0, 2), (5, 3), (50_000, 1)]]
    stats = MergeStats()
    out = list(merge_sorted([t.to_batches(max_chunksize=7_000) for t in inputs], KEYS, 3, 1000, stats=stats))
    assert stats.rows_in == 400_000
    assert stats.max_buffered_rows <= 4 * 1001
    assert max(o.num_rows for o in out) <= 1000
    assert pa.concat_tables(out).equals(consolidate(pa.concat_tables(inputs), KEYS, 3))


def test_disjoint_inputs_stream_through():
    inputs = [_big_input(50_000, 0, 2), _big_input(50_000, 1, 2)]
    stats = MergeStats()
    out = list(merge_sorted([[t] for t in inputs], KEYS, None, 4096, stats=stats))
    assert sum(o.num_rows for o in out) == 100_000
    assert stats.max_buffered_rows <= 2 * 4097


def test_merge_to_batch_writes_incrementally(tmp_path):
    inputs = [_big_input(30_000, 0, 1), _big_input(30_000, 10_000, 1)]
    path = str(tmp_path / "merged.parquet")
    desc = BatchDescription(relation_id=3, lower=0, upper=7, since=2, rows=0, level=1)
    final = merge_to_batch(
        [t.to_batches(max_chunksize=5000) for t in inputs], KEYS, SCHEMA, desc, path, chunk_rows=2000,
        row_group_rows=8192,
    )
    expected = consolidate(pa.concat_tables(inputs), KEYS, 2)
    assert final.rows == expected.num_rows and final.since == 2
    with open(path, "rb") as f:
        assert decode_batch(f.read(), final).equals(expected)


def test_all_inputs_empty():
    empty = SCHEMA.empty_table()
    assert list(merge_sorted([[empty], [], empty.to_batches()], KEYS, 1, 10)) == []


@pytest.mark.parametrize("chunk_rows", [1, 2, 10])
def test_unsorted_input_is_an_error_naming_input_and_row(chunk_rows):
    a = pa.Table.from_pylist([{"k": k, "x": 0, "time": 0, "diff": 1} for k in "ab"], schema=SCHEMA)
    b = pa.Table.from_pylist([{"k": k, "x": 0, "time": 0, "diff": 1} for k in "bca"], schema=SCHEMA)
    with pytest.raises(TraceError, match=r"merge input 1: row 2 is not sorted"):
        list(merge_sorted([[a], [b.slice(0, 1), b.slice(1)]], KEYS, None, chunk_rows))


def test_chunk_rows_must_be_positive():
    with pytest.raises(ValueError):
        list(merge_sorted([], KEYS, None, 0))


WIDE = pa.schema([("b", pa.binary()), ("s", pa.large_string()), ("n", pa.int8()), ("time", pa.int64()),
                  ("diff", pa.int64())])
WIDE_KEYS = ["b", "s", "n"]
wide_update = st.fixed_dictionaries({
    "b": st.sampled_from([b"", b"\x00", b"\x00\x01", b"\x7f", b"\x80", b"\xff", None]),
    "s": st.sampled_from(["", "a", "z", "é", "\u00ff", "\u0100", "\U0001f600", "\uffff", None]),
    "n": st.sampled_from([-128, -1, 0, 127, None]),
    "time": st.integers(0, 3),
    "diff": st.integers(-1, 1),
})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(wide_update, max_size=30), min_size=2, max_size=4), st.integers(1, 5))
def test_binary_unicode_and_small_int_keys_merge_in_pyarrows_order(inputs, chunk_rows):
    """Binary keys with high bytes, strings beyond ASCII (byte order is code point order),
    int8 extremes and NULLs: the merge's frontier comparisons agree with pyarrow's sort, so
    the merge equals concat then consolidate."""
    tables = [consolidate(pa.Table.from_pylist(rows, schema=WIDE), WIDE_KEYS) for rows in inputs]
    out = list(merge_sorted([t.to_batches() for t in tables], WIDE_KEYS, None, chunk_rows))
    expected = consolidate(pa.concat_tables(tables), WIDE_KEYS)
    got = pa.concat_tables(out) if out else expected.schema.empty_table()
    assert got.to_pylist() == expected.to_pylist()
