"""One-row and few-row appends, the path bench/small_writes.py measures: every row of a small
table is stored whatever its chunking, concurrent appends are counted once each though their
group commit bumps the counters once, and a pass over many one-row records (joined into one
chunk first) keeps every row."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

import sediment
from sediment.clock import ManualClock

SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.binary())])


def _one_row(k: int, t: int = 1) -> pa.Table:
    return pa.table({"id": pa.array([k], pa.int64()), "payload": pa.array([b"p%d" % k], pa.binary()),
                     "time": pa.array([t], pa.int64()), "diff": pa.array([1], pa.int64())})


def _counter(engine, name: str, relation: str) -> float:
    for family in text_string_to_metric_families(engine.metrics.exposition().decode()):
        for s in family.samples:
            if s.name == name and s.labels.get("relation") == relation:
                return s.value
    raise AssertionError(f"no {name} for {relation}")


def test_a_small_table_whose_columns_are_chunked_differently_keeps_every_row(tmp_path):
    table = pa.Table.from_arrays(
        [pa.chunked_array([pa.array([1, 2, 3], pa.int64())]),
         pa.chunked_array([pa.array([b"a"]), pa.array([b"b", b"c"])], pa.binary()),
         pa.chunked_array([pa.array([1, 1], pa.int64()), pa.array([2], pa.int64())]),
         pa.chunked_array([pa.array([1, 1, 1], pa.int64())])],
        schema=pa.schema([("id", pa.int64()), ("payload", pa.binary()), ("time", pa.int64()), ("diff", pa.int64())]))
    assert table.column(0).num_chunks == 1 and len(table.to_batches()) > 1
    with sediment.open(tmp_path / "d", clock=ManualClock()) as engine:
        engine.add_relation("r", SCHEMA)
        engine.append("r", table)
        engine.seal("r", 2)
        got = engine.snapshot("r", as_of=2).sort_by("id")
        assert got.column("id").to_pylist() == [1, 2, 3]
        assert got.column("payload").to_pylist() == [b"a", b"b", b"c"]


def test_concurrent_one_row_appends_are_counted_once_each_and_compact_whole(tmp_path):
    threads, each = 16, 40
    with sediment.open(tmp_path / "d", clock=ManualClock()) as engine:
        engine.add_relation("r", SCHEMA)
        start = threading.Barrier(threads)

        def work(w: int) -> None:
            start.wait()
            for i in range(each):
                engine.append("r", _one_row(w * each + i))

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(work, range(threads)))  # raises what a writer raised
        n = threads * each
        assert _counter(engine, "sediment_appends_total", "r") == n
        assert _counter(engine, "sediment_rows_appended_total", "r") == n
        engine.seal("r", 1)
        engine.compact()
        assert engine.stats()["wal"]["backlog_records"] == 0
        got = engine.snapshot("r", as_of=1).sort_by("id")
        assert got.column("id").to_pylist() == list(range(n))
        assert got.column("payload").to_pylist() == [b"p%d" % k for k in range(n)]
        assert set(got.column("diff").to_pylist()) == {1}
