"""Consolidation on read: snapshots over several batches and the WAL tail, the checksummed
fast read of a batch, batches used as stored, and replay of row groups as stored."""

from __future__ import annotations

import glob
import math
import os
import tempfile
from collections import defaultdict

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sediment
from sediment.errors import BatchCorruption, DiffOverflow
from sediment.trace.consolidate import consolidate, sort_keys
from sediment.trace.consolidate import snapshot as sorted_snapshot
from sediment.trace.runs import RunStats, batch_run, merge_runs, stitched

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
RUN_SCHEMA = pa.schema([("a", pa.float64()), ("b", pa.string()), ("diff", pa.int64())])


# --- pure: merge of runs and the snapshot of one batch, against brute force --------------------

def _norm(x):
    return "NaN" if isinstance(x, float) and math.isnan(x) else x


def _as_run(acc: dict) -> pa.Table:
    """A run in pyarrow's order from {(a, b): diff}: what a consolidated batch snapshot is."""
    rows = [(a, b, d) for (a, b), d in acc.items() if d != 0]
    table = pa.table({"a": pa.array([float("nan") if a == "NaN" else a for a, _, _ in rows], pa.float64()),
                      "b": pa.array([b for _, b, _ in rows], pa.string()),
                      "diff": pa.array([d for _, _, d in rows], pa.int64())})
    return table.sort_by(sort_keys(["a", "b"], with_time=False))


def _rows(table: pa.Table) -> list[tuple]:
    cols = [table.column(c).to_pylist() for c in table.column_names]
    return [tuple(_norm(x) for x in row) for row in zip(*cols, strict=True)]


KEY_A = st.sampled_from([None, float("nan"), -1.5, 0.0, 2.0, 7.25])
KEY_B = st.sampled_from([None, "", "x", "y", "zz"])
RUN = st.dictionaries(st.tuples(KEY_A.map(_norm), KEY_B), st.integers(-3, 3), max_size=14)


@settings(max_examples=150, deadline=None)
@given(runs=st.lists(RUN, min_size=0, max_size=5), chunk_rows=st.integers(1, 5), workers=st.sampled_from([1, 2]))
def test_merge_runs_equals_brute_force(runs, chunk_rows, workers):
    total: dict = defaultdict(int)
    for acc in runs:
        for key, d in acc.items():
            total[key] += d
    expected = _rows(_as_run(total))
    stats = RunStats()
    got = merge_runs([_as_run(acc) for acc in runs], ["a", "b"], RUN_SCHEMA, chunk_rows=chunk_rows, stats=stats,
                     workers=workers)
    assert got.schema.names == RUN_SCHEMA.names
    assert _rows(got) == expected
    assert stats.rows_passed + stats.rows_sorted >= len(expected)


def test_merge_runs_passes_disjoint_runs_without_sorting():
    """Runs whose rows do not interleave are emitted as they are: nothing is sorted."""
    low = _as_run({(float(i), "x"): 1 for i in range(10)})
    high = _as_run({(float(i), "x"): 2 for i in range(10, 30)})
    stats = RunStats()
    got = merge_runs([high, low], ["a", "b"], RUN_SCHEMA, chunk_rows=4, stats=stats)
    assert _rows(got) == _rows(low) + _rows(high)
    assert stats.rows_sorted == 0 and stats.rows_passed == 30


@settings(max_examples=200, deadline=None)
@given(updates=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["p", "q", None]), st.integers(0, 6),
                                  st.integers(-2, 2)), max_size=30),
       since=st.integers(0, 6), as_of=st.integers(0, 8))
def test_batch_run_equals_a_sorted_snapshot(updates, since, as_of):
    """A batch (consolidated at since, sorted by (row, time)) read without a sort gives the
    same snapshot as the sort-based one, and one that holds one time is used as stored."""
    raw = pa.table({"k": pa.array([u[0] for u in updates], pa.int64()), "v": pa.array([u[1] for u in updates], pa.string()),
                    "time": pa.array([u[2] for u in updates], pa.int64()), "diff": pa.array([u[3] for u in updates], pa.int64())})
    batch = consolidate(raw, ["k", "v"], since)
    lo, hi = since, max(6, since)
    stats = RunStats()
    got = batch_run(batch, ["k", "v"], as_of, min_time=lo, max_time=hi, stats=stats)
    assert _rows(got) == _rows(sorted_snapshot(batch, ["k", "v"], as_of))
    if as_of >= lo:
        assert (stats.batches_as_is, stats.batches_summed) == ((1, 0) if lo == hi else (0, 1))
        if lo == hi:
            assert _rows(got) == _rows(batch.select(["k", "v", "diff"]))


@settings(max_examples=300, deadline=None)
@given(updates=st.lists(st.tuples(st.sampled_from([None, float("nan"), 0.0, 1.5]), st.sampled_from(["p", None]),
                                  st.integers(0, 6), st.integers(-2, 2)), max_size=40),
       since=st.integers(0, 6), as_of=st.integers(0, 8), cuts=st.lists(st.integers(0, 40), max_size=8))
def test_stitched_pieces_of_a_batch_equal_its_whole_run(updates, since, as_of, cuts):
    """A batch cut into row groups anywhere (a row's times across a cut, several cuts in one
    row's times, empty pieces), each piece made a run on its own and the pieces stitched,
    is the whole batch's run: boundary rows summed, cancelled ones dropped, NULL and NaN
    keys equal to themselves."""
    raw = pa.table({"a": pa.array([u[0] for u in updates], pa.float64()), "b": pa.array([u[1] for u in updates], pa.string()),
                    "time": pa.array([u[2] for u in updates], pa.int64()), "diff": pa.array([u[3] for u in updates], pa.int64())})
    batch = consolidate(raw, ["a", "b"], since)
    lo, hi = since, max(6, since)
    whole = batch_run(batch, ["a", "b"], as_of, min_time=lo, max_time=hi)
    bounds = sorted({0, batch.num_rows, *(min(c, batch.num_rows) for c in cuts)})
    pieces = [batch_run(batch.slice(x, y - x), ["a", "b"], as_of, min_time=lo, max_time=hi)
              for x, y in zip(bounds, bounds[1:], strict=False)]
    out = list(stitched(pieces, ["a", "b"]))
    assert all(t.num_rows for t in out)
    got = pa.concat_tables(out) if out else whole.slice(0, 0)
    assert _rows(got) == _rows(whole)


# --- the engine: several batches plus the tail, against a model ------------------------------

def _table(rows) -> pa.Table:
    return pa.table({"k": pa.array([r[0] for r in rows], pa.int64()), "v": pa.array([r[1] for r in rows], pa.string()),
                     "time": pa.array([r[2] for r in rows], pa.int64()), "diff": pa.array([r[3] for r in rows], pa.int64())})


def _model(updates, as_of):
    acc: dict = defaultdict(int)
    for k, v, t, d in updates:
        if t <= as_of:
            acc[(k, v)] += d
    return sorted(((k, v, d) for (k, v), d in acc.items() if d != 0), key=lambda r: (r[0], r[1] is None, r[1] or ""))


def _snap_rows(table: pa.Table) -> list[tuple]:
    return list(zip(table.column("k").to_pylist(), table.column("v").to_pylist(), table.column("diff").to_pylist(), strict=True))


STEP = st.tuples(
    st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["a", "b", None]), st.integers(0, 3), st.integers(-2, 2)),
             max_size=12),
    st.booleans(),  # advance since to the sealed time before compacting
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(STEP, min_size=1, max_size=4), tail=STEP, data=st.data())
def test_snapshot_over_batches_and_tail_equals_model(steps, tail, data):
    with tempfile.TemporaryDirectory(prefix="sediment-reads-") as d:
        engine = sediment.open(d)
        try:
            engine.add_relation("r", SCHEMA)
            updates, t0 = [], 0
            for rows, advance in steps:
                rows = [(k, v, t0 + t, diff) for k, v, t, diff in rows]
                engine.append("r", _table(rows))
                updates += rows
                t0 += 4
                engine.seal("r", t0 - 1)
                if advance:
                    engine.set_since("r", t0 - 1)
                engine.compact()
            rows = [(k, v, t0 + t, diff) for k, v, t, diff in tail[0]]
            engine.append("r", _table(rows))
            updates += rows
            engine.seal("r", t0 + 3)
            for as_of in sorted({engine.since("r"), t0 - 1, t0 + 1, t0 + 3,
                                 data.draw(st.integers(engine.since("r"), t0 + 3))}):
                got = engine.snapshot("r", as_of)
                assert _snap_rows(got) == _model(updates, as_of), as_of
        finally:
            engine.close()


def _compacted(d: str, steps: int, rows_per_step: int, *, advance: bool) -> sediment.Engine:
    engine = sediment.open(d)
    engine.add_relation("r", SCHEMA)
    for s in range(steps):
        k = pc.cast(pc.divide(pc.cast(pa.array(range(rows_per_step)), pa.float64()), 1.0), pa.int64())
        table = pa.table({"k": pc.add(k, s * 7), "v": pa.array(["v"] * rows_per_step),
                          "time": pa.repeat(pa.scalar(s * 2, pa.int64()), rows_per_step),
                          "diff": pa.repeat(pa.scalar(1, pa.int64()), rows_per_step)})
        engine.append("r", table)
        engine.seal("r", s * 2 + 1)
        if advance:
            engine.set_since("r", s * 2 + 1)
        engine.compact()
    return engine


def test_consolidated_batches_are_read_not_reconsolidated(tmp_path):
    """A batch holding one time (since at or past its last time) is used as stored; a batch
    keeping several times is summed without a sort; both through the checksummed fast read."""
    engine = _compacted(str(tmp_path / "one"), 3, 50, advance=True)
    try:
        sealed = engine.sealed("r")
        before = (engine.read_stats.batches_as_is, engine.read_stats.batches_summed, engine.traces.whole_reads)
        snap = engine.snapshot("r", sealed)
        batches = engine.trace_info("r")["batches"]
        after = (engine.read_stats.batches_as_is, engine.read_stats.batches_summed, engine.traces.whole_reads)
        assert after[0] - before[0] == batches >= 1
        assert after[1] == before[1]
        assert after[2] - before[2] == batches
        assert snap.num_rows == 50 + 14 and pc.sum(snap.column("diff")).as_py() == 150
    finally:
        engine.close()
    engine = _compacted(str(tmp_path / "many"), 3, 50, advance=False)
    try:
        before = engine.read_stats.batches_summed
        snap = engine.snapshot("r", 3)
        assert engine.read_stats.batches_summed > before
        assert pc.sum(snap.column("diff")).as_py() == 100
    finally:
        engine.close()


def _batch_files(d: str) -> list[str]:
    return sorted(glob.glob(os.path.join(d, "blobs", "trace", "**", "*.parquet"), recursive=True))


@pytest.mark.parametrize("where", ["page", "footer"])
def test_a_damaged_batch_raises_on_the_fast_path(tmp_path, where):
    d = str(tmp_path)
    engine = _compacted(d, 1, 2000, advance=True)
    try:
        files = _batch_files(d)
        assert len(files) == 1
        size = os.path.getsize(files[0])
        at = size // 3 if where == "page" else size - 20
        with open(files[0], "r+b") as f:
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0x40]))
        with pytest.raises(BatchCorruption, match="CRC32C"):
            engine.snapshot("r", engine.sealed("r"))
    finally:
        engine.close()


def test_replay_unordered_streams_row_groups_as_stored(tmp_path):
    """ordered=False yields each batch's rows in stored order, then the WAL tail."""
    d = str(tmp_path)
    engine = _compacted(d, 2, 70_000, advance=False)
    try:
        tail = _table([(1, "t", 9, 1), (0, "t", 8, -1)])
        engine.append("r", tail)
        trace = engine.view.get("r").trace
        stored = [pq.read_table(os.path.join(d, "blobs", *ref.key.split("/"))) for ref in trace.batches if ref.key]
        expected = pa.concat_tables([*stored, tail]).to_pylist()
        parts = list(engine.replay("r", ordered=False, batch_rows=50_000))
        got = pa.Table.from_batches(parts).to_pylist()
        assert got == expected
        groups = sum(pq.ParquetFile(os.path.join(d, "blobs", *r.key.split("/"))).num_row_groups
                     for r in trace.batches if r.key)
        assert groups >= 3 and len(parts) >= groups
    finally:
        engine.close()


def test_snapshot_merges_tiered_batches_and_tail(tmp_path):
    """Batches of very different sizes stay apart (size-tiered); the snapshot merges them and
    the tail as interleaving runs, and equals the model at every time."""
    engine = sediment.open(str(tmp_path))
    try:
        engine.add_relation("r", SCHEMA)
        steps = [[(k, "a", 0, 1) for k in range(20_000)],
                 [(k, "a", 2, -1) for k in range(0, 6_000, 2)] + [(k, "b", 2, 1) for k in range(1, 600, 3)],
                 [(k, "a" if k % 2 else None, 4, 2) for k in range(5, 400, 5)]]
        updates = []
        for i, rows in enumerate(steps):
            engine.append("r", _table(rows))
            updates += rows
            engine.seal("r", 2 * i + 1)
            if i < 2:
                engine.compact()
        assert engine.trace_info("r")["batches"] >= 2
        for as_of in range(0, 6):
            before = engine.read_stats.rows_sorted
            assert _snap_rows(engine.snapshot("r", as_of)) == _model(updates, as_of), as_of
            if as_of >= 2:
                assert engine.read_stats.rows_sorted > before
    finally:
        engine.close()


def test_a_row_whose_partial_sum_overflows_in_one_row_group_is_summed_exactly(tmp_path):
    """A row's times span two row groups, and the first group's diffs alone sum past int64
    while the row's total fits: the snapshot is the exact total (the batch is then summed
    whole, as before the pieces), not a DiffOverflow."""
    n = 65_537  # one more than a row group holds
    big = 1 << 62
    diffs = [big, big] + [1] * (n - 3) + [-big]
    with sediment.open(str(tmp_path / "d"), compact_interval=None) as engine:
        engine.add_relation("r", SCHEMA)
        engine.append("r", pa.table({"k": pa.array([7] * n, pa.int64()), "v": pa.array(["x"] * n, pa.string()),
                                     "time": pa.array(range(n), pa.int64()), "diff": pa.array(diffs, pa.int64())}))
        engine.seal("r", n - 1)
        engine.compact()
        assert engine.trace_info("r")["tail_records"] == 0 and engine.trace_info("r")["rows"] == n
        snap = engine.snapshot("r", n - 1)
        assert _snap_rows(snap) == [(7, "x", big + n - 3)]
        with pytest.raises(DiffOverflow, match="outside int64"):  # the two large diffs alone do not fit
            engine.snapshot("r", 1)
