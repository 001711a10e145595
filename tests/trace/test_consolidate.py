"""consolidate / snapshot / changes against a plain-Python model of the semantics."""

from __future__ import annotations

import datetime as dt
import math
import random

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sediment.trace.consolidate import changes, consolidate, first_unsorted, snapshot, sum_sorted

KEYS = ["s", "i", "f", "b", "y", "ts"]
TYPES = {
    "s": pa.string(),
    "i": pa.int64(),
    "f": pa.float64(),
    "b": pa.bool_(),
    "y": pa.binary(),
    "ts": pa.timestamp("us"),
}
EPOCH = dt.datetime(2024, 1, 1)
VALUES = {
    "s": st.sampled_from(["", "a", "b", "é", "\U0001f600", None]),
    "i": st.sampled_from([-(2**63), -1, 0, 7, 2**63 - 1, None]),
    "f": st.sampled_from([-1.5, 0.0, 2.25, math.inf, None]),
    "b": st.sampled_from([True, False, None]),
    "y": st.sampled_from([b"", b"\x00", b"\xff", None]),
    "ts": st.sampled_from([EPOCH, EPOCH + dt.timedelta(microseconds=1), None]),
}


def _row():
    return st.fixed_dictionaries(
        {
            **{k: VALUES[k] for k in KEYS},
            "time": st.integers(0, 6),
            "diff": st.integers(-3, 3),
        }
    )


@st.composite
def tables(draw, min_rows: int = 0):
    rows = draw(st.lists(_row(), min_size=min_rows, max_size=60))
    cuts = sorted(draw(st.lists(st.integers(0, len(rows)), max_size=3)))
    schema = pa.schema([(k, TYPES[k]) for k in KEYS] + [("time", pa.int64()), ("diff", pa.int64())])
    parts, prev = [], 0
    for c in [*cuts, len(rows)]:
        parts.append(pa.Table.from_pylist(rows[prev:c], schema=schema))
        prev = c
    return pa.concat_tables(parts), rows


def _sort_key(keys):
    return lambda r: tuple((r[k] is None, r[k] if r[k] is not None else 0) for k in keys)


def model_consolidate(rows, keys, since=None):
    acc: dict = {}
    for r in rows:
        t = r["time"] if since is None else max(r["time"], since)
        k = (*[r[c] for c in keys], t)
        acc[k] = acc.get(k, 0) + r["diff"]
    out = [dict(zip([*keys, "time", "diff"], (*k, d), strict=True)) for k, d in acc.items() if d != 0]
    return sorted(out, key=_sort_key([*keys, "time"]))


def model_snapshot(rows, keys, as_of):
    acc: dict = {}
    for r in rows:
        if r["time"] <= as_of:
            k = tuple(r[c] for c in keys)
            acc[k] = acc.get(k, 0) + r["diff"]
    out = [dict(zip([*keys, "diff"], (*k, d), strict=True)) for k, d in acc.items() if d != 0]
    return sorted(out, key=_sort_key(keys))


@settings(max_examples=150, deadline=None)
@given(tables(), st.sampled_from([KEYS, ["s"], ["i", "s"], ["f", "b"], ["ts", "y"]]), st.none() | st.integers(0, 7))
def test_consolidate_matches_model(data, keys, since):
    table, rows = data
    got = consolidate(table, keys, since)
    assert got.column_names == [*keys, "time", "diff"]
    assert got.to_pylist() == model_consolidate(rows, keys, since)


@settings(max_examples=100, deadline=None)
@given(tables(), st.integers(0, 7), st.integers(0, 7))
def test_consolidate_is_idempotent_and_since_composes(data, s1, s2):
    table, _ = data
    lo, hi = sorted((s1, s2))
    once = consolidate(table, KEYS, hi)
    assert consolidate(once, KEYS, hi).equals(once)
    assert consolidate(once, KEYS, hi, presorted=True).equals(once)
    assert consolidate(consolidate(table, KEYS, lo), KEYS, hi).equals(once)


@settings(max_examples=100, deadline=None)
@given(tables(), st.integers(0, 7))
def test_snapshot_matches_model(data, as_of):
    table, rows = data
    got = snapshot(table, ["s", "i"], as_of)
    assert got.column_names == ["s", "i", "diff"]
    assert got.to_pylist() == model_snapshot(rows, ["s", "i"], as_of)


@settings(max_examples=100, deadline=None)
@given(tables(), st.integers(0, 7), st.integers(0, 7))
def test_snapshot_unchanged_by_compaction_up_to_as_of(data, since, as_of):
    table, _ = data
    since = min(since, as_of)
    assert snapshot(consolidate(table, KEYS, since), KEYS, as_of).equals(snapshot(table, KEYS, as_of))


@settings(max_examples=100, deadline=None)
@given(tables(), st.integers(0, 7), st.integers(0, 7))
def test_changes_are_the_updates_in_the_half_open_interval(data, a, b):
    table, rows = data
    lo, hi = sorted((a, b))
    got = changes(table, ["s"], lo, hi)
    assert got.to_pylist() == model_consolidate([r for r in rows if lo < r["time"] <= hi], ["s"])
    # snapshot(lo) + changes(lo, hi) = snapshot(hi)
    combined = pa.concat_tables([snapshot(table, ["s"], lo), got.drop_columns(["time"])])
    assert snapshot(combined.append_column("time", pa.array([0] * combined.num_rows, pa.int64())), ["s"], 0).equals(
        snapshot(table, ["s"], hi)
    )


def test_empty_table():
    schema = pa.schema([("k", pa.string()), ("time", pa.int64()), ("diff", pa.int64())])
    empty = schema.empty_table()
    assert consolidate(empty, ["k"], 5).num_rows == 0
    assert consolidate(empty, ["k"]).schema == schema
    assert snapshot(empty, ["k"], 3).column_names == ["k", "diff"]
    assert changes(empty, ["k"], 0, 3).num_rows == 0


def test_nulls_group_as_one_value_and_sort_last():
    t = pa.table(
        {
            "k": pa.array([None, "b", None, "a"], pa.string()),
            "time": pa.array([1, 1, 1, 1], pa.int64()),
            "diff": pa.array([1, 1, 2, 1], pa.int64()),
        }
    )
    assert consolidate(t, ["k"]).to_pydict() == {"k": ["a", "b", None], "time": [1, 1, 1], "diff": [1, 1, 3]}


def test_nan_keys_group_together():
    t = pa.table(
        {
            "f": pa.array([math.nan, 1.0, math.nan], pa.float64()),
            "time": pa.array([2, 2, 2], pa.int64()),
            "diff": pa.array([1, 1, 1], pa.int64()),
        }
    )
    got = consolidate(t, ["f"])
    assert got.num_rows == 2
    assert got.column("diff").to_pylist() == [1, 2]


def test_sum_sorted_keeps_order_where_hash_group_by_does_not():
    # group_by(use_threads=False) reorders groups of multi-column keys; sum_sorted must not.
    keys = [("b", x, t) for x in (3, 4) for t in range(10)]
    t = pa.table(
        {
            "k": pa.array([k for k, _, _ in keys for _ in range(2)]),
            "x": pa.array([x for _, x, _ in keys for _ in range(2)], pa.int64()),
            "time": pa.array([t for _, _, t in keys for _ in range(2)], pa.int64()),
            "diff": pa.array([1, 1] * len(keys), pa.int64()),
        }
    )
    got = sum_sorted(t, ["k", "x", "time"])
    assert [(r["k"], r["x"], r["time"]) for r in got.to_pylist()] == keys
    assert set(got.column("diff").to_pylist()) == {2}


def test_missing_columns_are_reported():
    t = pa.table({"k": ["a"], "diff": pa.array([1], pa.int64())})
    with pytest.raises(ValueError, match="time"):
        consolidate(t, ["k"])
    with pytest.raises(ValueError, match="must not include"):
        consolidate(pa.table({"time": [1], "diff": [1]}), ["time"])


def test_large_input_is_fast_enough():
    n = 300_000
    t = pa.table(
        {
            "k": pa.array([i % 5003 for i in range(n)], pa.int64()),
            "s": pa.array([f"v{i % 17}" for i in range(n)]),
            "time": pa.array([i % 13 for i in range(n)], pa.int64()),
            "diff": pa.array([1] * n, pa.int64()),
        }
    )
    got = consolidate(t, ["k", "s"], since=6)
    assert 0 not in got.column("diff").to_pylist()
    assert got.num_rows == len({(i % 5003, i % 17, max(i % 13, 6)) for i in range(n)})
    assert sum(got.column("diff").to_pylist()) == n
    assert got.sort_by([("k", "ascending"), ("s", "ascending"), ("time", "ascending")]).equals(got)


def _model_key(r, cols):
    return tuple(
        (r[c] is None, isinstance(r[c], float) and math.isnan(r[c]), 0 if r[c] is None or r[c] != r[c] else r[c])
        for c in cols
    )


@settings(max_examples=200, deadline=None)
@given(tables(), st.sampled_from([KEYS, ["s"], ["f", "i"], ["b", "ts", "y"]]), st.booleans(), st.booleans())
def test_first_unsorted_matches_model(data, cols, nan, strict):
    table, rows = data
    if nan and rows:
        rows = [{**r, "f": math.nan} if i % 2 else r for i, r in enumerate(rows)]
        table = pa.Table.from_pylist(rows, schema=table.schema)
    keys = [_model_key(r, cols) for r in rows]
    want = next(
        (i for i in range(1, len(keys)) if keys[i] < keys[i - 1] or (strict and keys[i] == keys[i - 1])), None
    )
    assert first_unsorted(table, cols, strict=strict) == want
    ordered = table.sort_by([(c, "ascending") for c in cols])
    assert first_unsorted(ordered, cols, strict=False) is None
    assert first_unsorted(consolidate(table, cols), [*cols, "time"]) is None


@pytest.mark.parametrize("shape", ["identity", "reversed", "random", "blocks", "one_swap", "nulls"])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 257, 5000])
def test_sorted_table_equals_sort_by_and_moves_nothing_in_place(shape, n):
    """sorted_table is sort_by, whichever route the permutation takes (as is, slices, gather)."""
    from sediment.trace.consolidate import sorted_table

    rng = random.Random(n * 7 + len(shape))
    keys = list(range(n))
    if shape == "reversed":
        keys.reverse()
    elif shape == "random":
        rng.shuffle(keys)
    elif shape == "blocks":
        keys = [k for b in reversed(range(0, n, 300)) for k in range(b, min(b + 300, n))]
    elif shape == "one_swap" and n > 1:
        keys[0], keys[-1] = keys[-1], keys[0]
    elif shape == "nulls":
        keys = [None if k % 5 == 0 else k for k in keys]
    table = pa.table({"k": pa.array(keys, pa.int64()), "v": pa.array([b"x" * (i % 9) for i in range(n)]),
                      "diff": pa.array(range(n), pa.int64())})
    table = pa.Table.from_batches(table.to_batches(max_chunksize=333), schema=table.schema)
    order = [("k", "ascending"), ("v", "ascending")]
    got = sorted_table(table, order)
    assert got.equals(table.sort_by(order))
    if shape == "identity":
        assert got is table  # already in order: nothing copied
