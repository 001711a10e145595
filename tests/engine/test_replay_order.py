"""Time-ordered replay: order and content against a brute-force stable sort by time.

The promise (engine/time_order.py): every stored row once, ordered by time; rows of one time
in storage order (batches, pending batches, then WAL records, each as stored). The sort
takes a fixed-size-binary fast path for binary and string columns of one width, so the
random tables mix fixed and variable widths, nulls and empty values.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sediment
from sediment.clock import ManualClock
from sediment.engine import staged, time_order
from sediment.engine.time_order import in_time_order, time_ordered

UPDATE = pa.schema([("k", pa.int64()), ("b", pa.binary()), ("s", pa.string()), ("time", pa.int64()),
                    ("diff", pa.int64())])


@dataclass(frozen=True)
class Item:
    t_lo: int
    t_hi: int
    table: pa.Table


def _rows(table: pa.Table) -> list[tuple]:
    return [tuple(r.values()) for r in table.to_pylist()]


def _brute(tables: list[pa.Table]) -> list[tuple]:
    """Stable sort by time of the tables' rows, concatenated in item order."""
    rows = [r for t in tables for r in _rows(t)]
    time_at = UPDATE.names.index("time")
    return sorted(rows, key=lambda r: r[time_at])


VALUE = st.one_of(st.none(), st.binary(min_size=0, max_size=5))
FIXED = st.binary(min_size=4, max_size=4)


@st.composite
def tables(draw, n_items):
    """Items whose columns are fixed-width (the fast path) or mixed, per item."""
    out = []
    for _ in range(n_items):
        n = draw(st.integers(0, 40))
        lo = draw(st.integers(0, 12))
        hi = lo + draw(st.integers(0, 6))
        fixed = draw(st.booleans())
        b = draw(st.lists(FIXED if fixed else VALUE, min_size=n, max_size=n))
        s = [None if x is None else x.hex() for x in b]
        times = draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))
        table = pa.table({"k": pa.array(range(n), pa.int64()), "b": pa.array(b, pa.binary()),
                          "s": pa.array(s, pa.string()), "time": pa.array(times, pa.int64()),
                          "diff": pa.array(draw(st.lists(st.sampled_from([-2, -1, 1, 3]), min_size=n, max_size=n)),
                                           pa.int64())}, schema=UPDATE)
        out.append(Item(lo, hi, table))
    return out


@settings(max_examples=200, deadline=None)
@given(items=st.integers(0, 6).flatmap(tables), batch_rows=st.integers(1, 50), chunks=st.integers(1, 4),
       streamed=st.booleans(), window=st.sampled_from([1, 5, 40, 1 << 19]))
def test_time_ordered_equals_stable_sort_by_time(items, batch_rows, chunks, streamed, window):
    """Items come as tables of several chunks, or (as stored batches do) as a stream of record
    batches; each chunk is a block sorted on its own, and the blocks are merged in windows of
    about ``window`` rows (small ones here, so most merges take several windows)."""
    def load(item: Item, sort):
        t = item.table
        step = max(1, -(-t.num_rows // chunks))
        if streamed:
            return map(sort, t.to_batches(max_chunksize=step))
        return [sort(pa.Table.from_batches(t.to_batches(max_chunksize=step), schema=UPDATE))]  # several chunks

    saved, time_order.WINDOW_ROWS = time_order.WINDOW_ROWS, window
    try:
        out = list(time_ordered(items, load, UPDATE, batch_rows))
    finally:
        time_order.WINDOW_ROWS = saved
    assert all(b.num_rows <= batch_rows and b.schema.equals(UPDATE) for b in out)
    got = [r for b in out for r in _rows(pa.Table.from_batches([b]))]
    assert got == _brute([i.table for i in items])


def test_fixed_width_gather_keeps_values_types_and_offsets():
    """Sliced inputs (non-zero offsets) and large types take the fixed-width path correctly."""
    n = 1000
    rng = random.Random(5)
    raw = [rng.randbytes(8) for _ in range(n + 7)]
    schema = pa.schema([("b", pa.large_binary()), ("s", pa.large_string()), ("time", pa.int64()),
                        ("diff", pa.int64())])
    full = pa.table({"b": pa.array(raw, pa.large_binary()), "s": pa.array([x.hex() for x in raw], pa.large_string()),
                     "time": pa.array([rng.randrange(30) for _ in raw], pa.int64()),
                     "diff": pa.array([1] * len(raw), pa.int64())}, schema=schema)
    table = pa.concat_tables([full.slice(3, 400), full.slice(407, n - 400)])
    got = pa.Table.from_batches(list(in_time_order(table, schema, 128)))
    assert got.schema.equals(schema)
    assert _rows(got) == sorted(_rows(table), key=lambda r: r[2])


def test_one_time_is_streamed_as_stored():
    table = pa.table({"k": pa.array([3, 1, 2], pa.int64()), "b": pa.array([b"x", b"yy", None]),
                      "s": pa.array(["a", None, "ccc"]), "time": pa.array([4, 4, 4], pa.int64()),
                      "diff": pa.array([1, -1, 2], pa.int64())}, schema=UPDATE)
    out = list(in_time_order(table, UPDATE, 2))
    assert [b.num_rows for b in out] == [2, 1]
    assert _rows(pa.Table.from_batches(out)) == _rows(table)


# --- the engine: several batches with interleaving times, retractions, the WAL tail ------------

ENGINE_SCHEMA = pa.schema([("k", pa.int64()), ("b", pa.binary()), ("s", pa.string())])


def _updates(rng: random.Random, n: int, t_lo: int, t_hi: int, fixed: bool) -> pa.Table:
    ks = [rng.randrange(50) for _ in range(n)]
    bs = [(k.to_bytes(4, "little") if fixed else bytes(k % 3)) for k in ks]
    return pa.table({"k": pa.array(ks, pa.int64()), "b": pa.array(bs, pa.binary()),
                     "s": pa.array([f"{k:03d}" if fixed else "x" * (k % 4) for k in ks], pa.string()),
                     "time": pa.array([rng.randrange(t_lo, t_hi + 1) for _ in ks], pa.int64()),
                     "diff": pa.array([rng.choice([1, 1, -1, 2]) for _ in ks], pa.int64())}, schema=UPDATE)


def _stored(engine: sediment.Engine) -> list[pa.Table]:
    """What the relation stores, in storage order: batches, pending batches, WAL records."""
    rel = engine.view.get("r")
    out = []
    for ref in (*rel.trace.batches, *rel.trace.pending):
        if ref.key is not None:
            out.append(engine.traces.read(rel.entry.id, ref).cast(UPDATE))
    for entry in rel.tail:
        record = engine.wal.read(entry.lsn)
        out.append(pa.Table.from_batches([rel.decode_body(record.body, record.schema_version)]))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_engine_replay_equals_brute_force_over_random_history(tmp_path, seed, blob_options):
    """On local files and on S3 (moto), whose batches are fetched whole and decoded from memory."""
    rng = random.Random(seed)
    engine = sediment.open(str(tmp_path / "d"), clock=ManualClock(), **blob_options)
    try:
        engine.add_relation("r", ENGINE_SCHEMA)
        sealed = -1
        for _step in range(rng.randrange(2, 5)):
            for _ in range(rng.randrange(1, 4)):  # records with overlapping time ranges
                engine.append("r", _updates(rng, rng.randrange(1, 300), sealed + 1, sealed + 8, rng.random() < 0.5))
            sealed += rng.randrange(3, 9)
            engine.seal("r", sealed)
            if rng.random() < 0.3:
                engine.set_since("r", sealed - rng.randrange(0, 3))
            engine.compact()
        engine.append("r", _updates(rng, 100, sealed + 1, sealed + 20, True))  # the tail, interleaving in time
        engine.append("r", _updates(rng, 50, sealed + 5, sealed + 9, False))
        stored = _stored(engine)
        assert len(stored) >= 3
        batch_rows = rng.choice([7, 64, 65536])
        got = [r for b in engine.replay("r", batch_rows=batch_rows) for r in _rows(pa.Table.from_batches([b]))]
        assert got == _brute(stored)
        unordered = [r for b in engine.replay("r", ordered=False) for r in _rows(pa.Table.from_batches([b]))]
        assert sorted(got, key=repr) == sorted(unordered, key=repr)
    finally:
        engine.close()


def test_replay_of_empty_relations(tmp_path):
    """A relation never written, one sealed with empty intervals only, and one whose
    updates cancelled out on compaction all replay nothing."""
    engine = sediment.open(str(tmp_path / "d"), clock=ManualClock())
    try:
        for name in ("never", "sealed", "cancelled"):
            engine.add_relation(name, ENGINE_SCHEMA)
        engine.seal("sealed", 5)
        one = _updates(random.Random(1), 10, 0, 0, True)
        engine.append("cancelled", one)
        engine.append("cancelled", one.set_column(4, "diff", pc.negate(one.column("diff"))))
        engine.seal("cancelled", 3)
        engine.compact()
        for name in ("never", "sealed", "cancelled"):
            assert list(engine.replay(name)) == [], name
        assert engine.trace_info("cancelled")["tail_records"] == 0
    finally:
        engine.close()


def test_replay_of_a_wide_fixed_width_relation_matches_a_sort_by_time(tmp_path):
    """The benchmark's shape at small scale: 16-byte keys, two compacted batches with many
    times each; the replay equals pyarrow's stable sort by time of the stored batches."""
    engine = sediment.open(str(tmp_path / "d"), clock=ManualClock())
    try:
        engine.add_relation("r", pa.schema([("k", pa.int64()), ("v", pa.binary())]))
        rng = random.Random(2)
        for step in range(2):
            n = 20_000
            ks = [rng.randrange(1 << 40) for _ in range(n)]
            engine.append("r", pa.table({"k": pa.array(ks, pa.int64()),
                                         "v": pa.array([os.urandom(16) for _ in ks], pa.binary()),
                                         "time": pa.array([step * 50 + rng.randrange(50) for _ in ks], pa.int64()),
                                         "diff": pa.array([1] * n, pa.int64())}))
            engine.seal("r", step * 50 + 49)
            engine.compact()
        rel = engine.view.get("r")
        stored = pa.concat_tables([engine.traces.read(rel.entry.id, ref) for ref in rel.trace.batches if ref.key])
        assert len(rel.trace.batches) >= 1 and stored.num_rows == 40_000
        got = pa.Table.from_batches(list(engine.replay("r", batch_rows=4096)))
        assert got.equals(stored.sort_by([("time", "ascending")]))
    finally:
        engine.close()


def test_replay_of_batches_of_many_row_groups_and_a_tail(tmp_path, monkeypatch):
    """Batches past one row group (65,536 rows), so each is sorted block by block and merged,
    with repeated times and a WAL tail, against a Python stable sort of the stored rows by
    time. (Items overlapping in time are the sweep's case, tested above on random items.)"""
    engine = sediment.open(str(tmp_path / "d"), clock=ManualClock())
    try:
        engine.add_relation("r", pa.schema([("k", pa.int64()), ("v", pa.binary())]))
        rng = random.Random(7)
        for step, n in enumerate((150_000, 90_000)):
            ks = rng.sample(range(1 << 40), n)
            engine.append("r", pa.table({"k": pa.array(ks, pa.int64()),
                                         "v": pa.array([k.to_bytes(8, "little") * 2 for k in ks], pa.binary()),
                                         "time": pa.array([step * 40 + rng.randrange(40) for _ in ks], pa.int64()),
                                         "diff": pa.array([rng.choice([1, 2, -1]) for _ in ks], pa.int64())}))
            engine.seal("r", step * 40 + 39)
            engine.compact()
        engine.append("r", _updates(rng, 500, 80, 90, True).select(["k", "b", "time", "diff"]).rename_columns(
            ["k", "v", "time", "diff"]))
        rel = engine.view.get("r")
        stored_rows = [b.rows for b in rel.trace.batches if b.key]
        assert max(stored_rows) > 2 * 65_536 and len(rel.tail) == 1
        stored = pa.concat_tables(t.cast(engine.view.get("r").update_schema) for t in _stored_as(engine, "r"))
        times = stored.column("time").to_pylist()
        expected = stored.take(sorted(range(len(times)), key=times.__getitem__))
        for batch_rows, window in ((65_536, 1 << 19), (9_999, 1 << 19), (9_999, 30_000)):
            monkeypatch.setattr(time_order, "WINDOW_ROWS", window)
            got = pa.Table.from_batches(list(engine.replay("r", batch_rows=batch_rows)))
            assert got.equals(expected)
    finally:
        engine.close()


def _stored_as(engine: sediment.Engine, name: str) -> list[pa.Table]:
    rel = engine.view.get(name)
    out = [engine.traces.read(rel.entry.id, ref) for ref in (*rel.trace.batches, *rel.trace.pending) if ref.key]
    for entry in rel.tail:
        record = engine.wal.read(entry.lsn)
        out.append(pa.Table.from_batches([rel.decode_body(record.body, record.schema_version)]))
    return out


# --- raw runs (bulk loads) beside batches and a tail --------------------------------------------


def test_replay_with_raw_runs_batches_and_a_tail_equals_brute_force(tmp_path):
    """Bulk-loaded files out of order (raw runs, read consolidated) beside compacted batches and
    a WAL tail, all overlapping in time: the replay is the stable sort by time of what each
    stores (a raw run as its read consolidates it), with windows small enough that the merge
    takes several."""
    engine = sediment.open(str(tmp_path / "d"), clock=ManualClock(), compact_interval=None)
    try:
        engine.add_relation("r", ENGINE_SCHEMA)
        rng = random.Random(11)
        engine.append("r", _updates(rng, 400, 0, 6, True))
        engine.seal("r", 6)
        engine.compact()
        path = staged.stage(engine, "r", "load-1")
        for i in range(2):  # rows in random order with repeated rows and times: not a run as written
            pq.write_table(_updates(rng, 300, 7, 12, i == 0), os.path.join(path, f"part-{i}.parquet"))
        assert staged.commit_staged(engine, "r", "load-1")["runs"] == 2
        assert [ref.raw for ref in engine.view.get("r").trace.pending] == [True, True]
        engine.append("r", _updates(rng, 200, 8, 14, False))
        expected = _brute(_stored(engine))
        for window in (1 << 19, 150):
            saved, time_order.WINDOW_ROWS = time_order.WINDOW_ROWS, window
            try:
                got = [r for b in engine.replay("r", batch_rows=97) for r in _rows(pa.Table.from_batches([b]))]
            finally:
                time_order.WINDOW_ROWS = saved
            assert got == expected
    finally:
        engine.close()


# --- sorted blocks' runs, found as each block is sorted, and the cut at a boundary -----------


def _block_rows(rng: random.Random, n: int, lo: int, hi: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"k": i, "b": rng.randbytes(4), "s": None if rng.random() < 0.2 else "x" * (i % 3),
                                        "time": rng.randrange(lo, hi + 1), "diff": rng.choice([1, -1, 2])}
                                       for i in range(n)], schema=UPDATE)


@pytest.mark.parametrize("seed", range(6))
def test_a_sorted_block_cut_anywhere_keeps_its_rows_and_runs(seed):
    """A block's runs (distinct times, run ends, counts) describe its sorted rows; cut at any
    bound (below, inside, past its times) the two parts hold exactly the rows below and from
    the bound, in order, each with the runs a fresh block of those rows would have."""
    rng = random.Random(seed)
    lo = rng.randrange(0, 5)
    (block,) = time_order.sorted_blocks([_block_rows(rng, rng.randrange(1, 300), lo, lo + rng.randrange(0, 9))],
                                        UPDATE)
    rows = _rows(pa.Table.from_batches([time_order._restored(block.rows, UPDATE)]))
    times = [r[3] for r in rows]
    assert times == sorted(times)
    assert block.times == sorted(set(times))
    assert block.ends == [max(i + 1 for i, t in enumerate(times) if t == u) for u in block.times]
    assert block.counts.to_pylist() == [{"t": u, "n": times.count(u)} for u in block.times]
    for bound in range(min(times) - 1, max(times) + 2):
        below, above = block.cut(bound)
        want_below = [r for r in rows if r[3] < bound]
        for part, want in ((below, want_below), (above, rows[len(want_below):])):
            if not want:
                assert part is None
                continue
            fresh = time_order.Block.of(part.rows, UPDATE.get_field_index("time"))
            assert _rows(pa.Table.from_batches([time_order._restored(part.rows, UPDATE)])) == want
            assert (part.times, part.ends, part.counts.to_pylist()) == (fresh.times, fresh.ends,
                                                                       fresh.counts.to_pylist())


@pytest.mark.parametrize("python_runs", [0, 1 << 30])
@pytest.mark.parametrize("seed", range(4))
def test_the_times_counted_over_blocks_and_their_cut_parts_equal_a_count_of_the_rows(seed, python_runs,
                                                                                      monkeypatch):
    """The merge's distinct times and their row counts, summed in Python (few runs) or by a
    hash group-by (many), over whole blocks and the parts of blocks cut at a bound."""
    monkeypatch.setattr(time_order, "PYTHON_RUNS", python_runs)
    rng = random.Random(seed)
    blocks = []
    for _ in range(rng.randrange(1, 6)):
        lo = rng.randrange(0, 20)
        (block,) = time_order.sorted_blocks([_block_rows(rng, rng.randrange(1, 200), lo, lo + rng.randrange(0, 12))],
                                            UPDATE)
        below, above = block.cut(lo + rng.randrange(0, 12))
        blocks += [b for b in (below, above) if b is not None] if rng.random() < 0.5 else [block]
    times = [t for b in blocks for t in b.rows.column("time").to_pylist()]
    assert time_order._counts(blocks) == (sorted(set(times)), [times.count(t) for t in sorted(set(times))])


def _distinct_updates(rng: random.Random, n: int, t_lo: int, t_hi: int, fixed: bool) -> pa.Table:
    """Like :func:`_updates`, with keys from a large space: few rows consolidate away."""
    ks = [rng.randrange(1 << 30) for _ in range(n)]
    return pa.table({"k": pa.array(ks, pa.int64()),
                     "b": pa.array([k.to_bytes(4, "little") if fixed else bytes(k % 3) for k in ks], pa.binary()),
                     "s": pa.array([f"{k % 1000:03d}" if fixed else "x" * (k % 4) for k in ks], pa.string()),
                     "time": pa.array([rng.randrange(t_lo, t_hi + 1) for _ in ks], pa.int64()),
                     "diff": pa.array([rng.choice([1, 1, -1, 2]) for _ in ks], pa.int64())}, schema=UPDATE)


@pytest.mark.parametrize("seed", range(3))
def test_replay_of_merged_batches_of_many_row_groups_equals_brute_force(tmp_path, seed, monkeypatch):
    """A small memory bound makes merged batches of many small row groups (past the row
    groups a replay queues ahead), beside batches with overlapping and with disjoint time
    ranges, retractions, an advanced since and a WAL tail: however many row groups and
    windows are queued on the read-ahead pool, and however small the windows, the replay is
    the stable sort by time of what is stored, in storage order."""
    rng = random.Random(100 + seed)
    engine = sediment.open(str(tmp_path / "d"), clock=ManualClock(), compact_interval=None, memory_bound=1 << 20)
    try:
        engine.add_relation("r", ENGINE_SCHEMA)
        sealed = -1
        for step in range(5):
            width = rng.choice([1, 4, 12])  # one time per step, a few, or many
            for _ in range(rng.randrange(1, 3)):  # records overlapping in time
                table = _distinct_updates(rng, rng.randrange(2_000, 6_000), sealed + 1, sealed + width,
                                          rng.random() < 0.7)
                engine.append("r", table)
                if rng.random() < 0.5:  # retract some of it: cancels on compaction, or stays negative
                    engine.append("r", table.slice(0, 300).set_column(4, "diff", pc.negate(table.column("diff")
                                                                                          .slice(0, 300))))
            sealed += width
            engine.seal("r", sealed)
            if step == 2:
                engine.set_since("r", sealed - 1)
            engine.compact()
        for n, lo, hi in ((4_000, 1, 6), (4_000, 2, 3), (200, 3, 9)):  # the tail: records overlapping in time
            engine.append("r", _distinct_updates(rng, n, sealed + lo, sealed + hi, rng.random() < 0.5))
        rel = engine.view.get("r")
        groups = [pq.ParquetFile(engine.traces._local.local_path(ref.key)).num_row_groups
                  for ref in (*rel.trace.batches, *rel.trace.pending) if ref.key]
        assert max(groups) > 4 and len(rel.tail) == 3
        expected = _brute(_stored(engine))
        for pieces, windows, window_rows in ((1, 0, 1 << 19), (2, 1, 3_000), (time_order.PIECES_AHEAD, 3, 500)):
            monkeypatch.setattr(time_order, "PIECES_AHEAD", pieces)
            monkeypatch.setattr(time_order, "WINDOWS_AHEAD", windows)
            monkeypatch.setattr(time_order, "WINDOW_ROWS", window_rows)
            batch_rows = rng.choice([97, 4096, 65536])
            got = [r for b in engine.replay("r", batch_rows=batch_rows) for r in _rows(pa.Table.from_batches([b]))]
            assert got == expected
    finally:
        engine.close()


@pytest.mark.parametrize("ordered", [True, False])
def test_a_replay_read_on_after_the_engine_closed_raises_engine_closed(tmp_path, ordered):
    """Its pin on the batches goes with the engine (another open may compact them away): the
    replay stops with a typed error at its next batch rather than reading on."""
    from sediment.errors import EngineClosed

    engine = sediment.open(str(tmp_path / "d"), clock=ManualClock())
    engine.add_relation("r", ENGINE_SCHEMA)
    rng = random.Random(7)
    for t in range(4):
        engine.append("r", _updates(rng, 50, t, t, True))
    engine.seal("r", 3)
    engine.compact()
    whole = list(engine.replay("r", batch_rows=10, ordered=ordered))
    assert len(whole) > 2
    replay = engine.replay("r", batch_rows=10, ordered=ordered)
    first = next(replay)
    assert first.num_rows
    engine.close()
    with pytest.raises(EngineClosed, match="replay it again after reopening"):
        next(replay)
