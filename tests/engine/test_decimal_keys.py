"""decimal32 and decimal64 columns sort by their value everywhere a trace sorts (pyarrow 26
has no sort kernel for them: alone they failed with ArrowNotImplementedError, and as one of
several keys they sorted by their bytes, so a batch was stored out of order and every later
merge of it failed). Each operation is compared with a model of the rows, with rows in the
WAL and in compacted (and merged) batches; decimal128 is the control."""

from __future__ import annotations

import decimal

import pyarrow as pa
import pytest
from test_engine import rows

import sediment

D = decimal.Decimal
TYPES = {"decimal32": pa.decimal32(5, 2), "decimal64": pa.decimal64(12, 2), "decimal128": pa.decimal128(10, 2)}
# byte order differs from value order: negatives, a carry into the second byte, a null
VALUES = [D("1.00"), D("-1.00"), D("2.56"), D("0.01"), None, D("-0.01"), D("3.00"), D("-300.00")]


def _key(v):
    return (v is None, v if v is not None else 0)


def _updates(t: pa.DataType, vals: list, time: int, diff: int, **more: list) -> pa.Table:
    cols = {"v": pa.array(vals, t), **{k: pa.array(c, pa.int64()) for k, c in more.items()}}
    return pa.table({**cols, "time": pa.array([time] * len(vals), pa.int64()),
                     "diff": pa.array([diff] * len(vals), pa.int64())})


class Model:
    def __init__(self) -> None:
        self.updates: list[tuple] = []  # (row, time, diff)

    def add(self, table: pa.Table) -> None:
        cols = [c for c in table.column_names if c not in ("time", "diff")]
        for r in table.to_pylist():
            self.updates.append((tuple(r[c] for c in cols), r["time"], r["diff"]))

    def snapshot(self, as_of: int) -> list[tuple]:
        totals: dict[tuple, int] = {}
        for row, tm, d in self.updates:
            if tm <= as_of:
                totals[row] = totals.get(row, 0) + d
        return [(*row, d) for row, d in sorted(totals.items(), key=lambda kv: [_key(v) for v in kv[0]]) if d]

    def by_row_and_time(self) -> dict[tuple, int]:
        totals: dict[tuple, int] = {}
        for row, tm, d in self.updates:
            totals[(row, tm)] = totals.get((row, tm), 0) + d
        return {k: d for k, d in totals.items() if d}


def _replayed(eng, name: str) -> dict[tuple, int]:
    got: dict[tuple, int] = {}
    for r in pa.Table.from_batches(list(eng.replay(name))).to_pylist():
        row = tuple(v for k, v in r.items() if k not in ("time", "diff"))
        got[(row, r["time"])] = got.get((row, r["time"]), 0) + r["diff"]
    return {k: d for k, d in got.items() if d}


def _feed_rows(feed, upto: int) -> list[tuple]:
    """The (row, time, diff) a feed delivers until its progress event past ``upto``."""
    out = []
    while True:
        event = feed.next(timeout=10)
        assert event is not None
        if event.kind == "progress" and event.time > upto:
            return out
        if event.kind == "updates":
            cols = [c for c in event.table.column_names if c not in ("time", "diff")]
            out += [(tuple(r[c] for c in cols), r["time"], r["diff"]) for r in event.table.to_pylist()]


@pytest.mark.parametrize("name", sorted(TYPES))
def test_a_relation_of_one_decimal_column_works_from_the_wal_and_from_batches(tmp_path, name):
    t, model = TYPES[name], Model()
    with sediment.open(tmp_path / "d", compact_interval=None, merge_factor=1.5) as eng:
        eng.add_relation("r", pa.schema([("v", t)]))
        feed = eng.subscribe("r")
        assert feed.next(timeout=10).kind == "snapshot"
        first = _updates(t, VALUES, 1, 1)
        eng.append("r", first)
        model.add(first)
        eng.seal("r", 2)
        assert rows(eng.snapshot("r", 2)) == model.snapshot(2)  # rows only in the WAL
        assert eng.trace_info("r")["batches"] == 0
        for round_ in range(3):  # batches, merged, with WAL rows above them
            base = 10 * (round_ + 1)
            more = _updates(t, VALUES[round_:] + VALUES[:round_], base, -1 if round_ == 1 else 2)
            eng.append("r", more)
            model.add(more)
            eng.compact()
            assert eng.compaction_errors() == {}
            eng.seal("r", base + 2)
            assert rows(eng.snapshot("r", base + 2)) == model.snapshot(base + 2)
        eng.compact()
        info = eng.trace_info("r")
        assert info["batches"] >= 1 and info["compaction_failures"] == 0 and eng.compaction_errors() == {}
        assert rows(eng.snapshot("r", 32)) == model.snapshot(32)
        assert rows(eng.snapshot("r", 12)) == model.snapshot(12)
        assert _replayed(eng, "r") == model.by_row_and_time()
        got: dict[tuple, int] = {}
        for row, tm, d in _feed_rows(feed, 31):
            got[(row, tm)] = got.get((row, tm), 0) + d
        assert {k: d for k, d in got.items() if d} == model.by_row_and_time()
        feed.close()
        late = _updates(t, VALUES, 40, 1)  # left in the WAL for the reopen
        eng.append("r", late)
        model.add(late)
        eng.seal("r", 41)
        with eng.subscribe("r", 41) as caught_up:  # a feed's snapshot from batches and the WAL
            event = caught_up.next(timeout=10)
            assert event.kind == "snapshot" and rows(event.table) == model.snapshot(41)
    with sediment.open(tmp_path / "d", compact_interval=None) as eng:  # the WAL replayed on open
        assert eng.snapshot("r", 41).schema.field("v").type == t
        assert rows(eng.snapshot("r", 41)) == model.snapshot(41)
        eng.compact()
        assert eng.compaction_errors() == {}
        assert rows(eng.snapshot("r", 41)) == model.snapshot(41)
        assert _replayed(eng, "r") == model.by_row_and_time()


@pytest.mark.parametrize("name", sorted(TYPES))
def test_a_decimal_key_column_with_others_sorts_by_value_and_merges(tmp_path, name):
    """First key of two: the batch used to be written in byte order and the next merge failed
    (TraceError: not sorted), on every retry."""
    t, model = TYPES[name], Model()
    with sediment.open(tmp_path / "d", compact_interval=None, merge_factor=1.5) as eng:
        eng.add_relation("m", pa.schema([("v", t), ("k", pa.int64())]))
        for time, diff in ((1, 1), (4, 1), (7, -1)):
            batch = _updates(t, VALUES, time, diff, k=[time % 2] * len(VALUES))
            eng.append("m", batch)
            model.add(batch)
            eng.seal("m", time + 1)
            assert rows(eng.snapshot("m", time + 1)) == model.snapshot(time + 1)
            eng.compact()
            assert eng.compaction_errors() == {}
            assert rows(eng.snapshot("m", time + 1)) == model.snapshot(time + 1)
        assert eng.trace_info("m")["compaction_failures"] == 0
        assert _replayed(eng, "m") == model.by_row_and_time()


@pytest.mark.parametrize("name", sorted(TYPES))
def test_a_decimal_column_left_alone_by_an_alter_works(tmp_path, name):
    """An alter drops every other column: rows written before (two columns) and after (one)
    read as the decimal column alone, in the WAL and in batches."""
    t = TYPES[name]
    before = _updates(t, VALUES, 1, 1, k=list(range(len(VALUES))))
    after = _updates(t, VALUES[:4], 3, 1)
    model = Model()
    model.add(before.drop(["k"]))
    model.add(after)
    with sediment.open(tmp_path / "d", compact_interval=None) as eng:
        eng.add_relation("r", pa.schema([("k", pa.int64()), ("v", t)]))
        eng.append("r", before)
        assert eng.alter_relation("r", drop=["k"]) == 1
        eng.append("r", after)
        eng.seal("r", 4)
        assert rows(eng.snapshot("r", 4)) == model.snapshot(4)  # from the WAL
        assert rows(eng.snapshot("r", 2)) == model.snapshot(2)
        eng.compact()
        assert eng.compaction_errors() == {} and eng.trace_info("r")["batches"] >= 1
        assert rows(eng.snapshot("r", 4)) == model.snapshot(4)  # from a batch
        assert _replayed(eng, "r") == model.by_row_and_time()
