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


def test_concurrent_small_appends_are_checked_and_kept_apart(tmp_path):
    """With other appends in flight, a small table in the update schema is checked and
    encoded in one pass over its columns (engine/writer.py ``_append_small``). Each
    append's rows stay its own, and each bad one is refused with its own typed error,
    writing nothing: a negative time, a null time or diff, a time at or below the sealed
    frontier (the check reads the least time from the buffer the body copies)."""
    threads, each = 16, 30
    big = 1 << 40  # ids far from any time: a bound read from the wrong column would pass the seal check

    def table(k: int, times: list, diffs: list | None = None) -> pa.Table:
        n = len(times)
        return pa.table({"id": pa.array([big + k * 100 + i for i in range(n)], pa.int64()),
                         "payload": pa.array([b"p%d.%d" % (k, i) for i in range(n)], pa.binary()),
                         "time": pa.array(times, pa.int64()), "diff": pa.array(diffs or [1] * n, pa.int64())})

    bad = {0: ([-1], sediment.errors.InvalidUpdates), 1: ([None], sediment.errors.InvalidUpdates),
           2: ([4, 3], sediment.errors.TimeAlreadySealed), 3: ([6, 3, 7], sediment.errors.TimeAlreadySealed)}
    with sediment.open(tmp_path / "d", clock=ManualClock()) as engine:
        engine.add_relation("r", SCHEMA)
        engine.seal("r", 3)
        start = threading.Barrier(threads)
        kept: list[pa.Table] = []
        refused: list[tuple[int, type]] = []
        lock = threading.Lock()

        def work(w: int) -> None:
            start.wait()
            for i in range(each):
                k = w * each + i
                case = k % 7
                if case in bad:
                    times, error = bad[case]
                    try:
                        engine.append("r", table(k, times))
                    except error:
                        with lock:
                            refused.append((k, error))
                        continue
                    raise AssertionError(f"append {k} with times {times} was accepted")
                if case == 4:
                    t = table(k, [5], [None])
                    try:
                        engine.append("r", t)
                    except sediment.errors.InvalidUpdates:
                        continue
                    raise AssertionError(f"append {k} with a null diff was accepted")
                t = table(k, [4 + (k % 3)] * (1 + k % 5))
                engine.append("r", t.select(["payload", "id", "diff", "time"]) if case == 5 else t)
                with lock:
                    kept.append(t)

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(work, range(threads)))
        assert len(refused) == sum(1 for k in range(threads * each) if k % 7 in bad)
        engine.seal("r", 9)
        want = pa.concat_tables(kept).sort_by("id")
        got = engine.snapshot("r", as_of=9).sort_by("id")
        assert got.column("id").to_pylist() == want.column("id").to_pylist()
        assert got.column("payload").to_pylist() == want.column("payload").to_pylist()
        assert got.column("diff").to_pylist() == want.column("diff").to_pylist()
        at5 = engine.snapshot("r", as_of=5)
        assert sorted(at5.column("id").to_pylist()) == sorted(
            i for i, t in zip(want.column("id").to_pylist(), want.column("time").to_pylist(), strict=True) if t <= 5)


def test_a_lone_writer_s_appends_are_visible_on_return_and_each_its_own_feed_event(tmp_path):
    """One writer's group is its own record: the log and the view take it on their one-record
    path. Each append is visible to stats the moment it returns, reaches a subscriber as one
    event holding exactly its row, is counted once, and is all there after a reopen."""
    n = 40
    with sediment.open(tmp_path / "data", clock=ManualClock()) as engine:
        engine.add_relation("r", SCHEMA)
        with engine.subscribe("r") as feed:
            assert feed.next(timeout=10).kind == "snapshot"
            for k in range(n):
                engine.append("r", _one_row(k, t=k + 1))
                assert engine.stats()["relations"]["r"]["tail_records"] == k + 1  # read-your-writes
                event = feed.next(timeout=10)
                assert event.kind == "updates" and event.table.column("id").to_pylist() == [k]
                assert event.table.column("time").to_pylist() == [k + 1]
        assert _counter(engine, "sediment_appends_total", "r") == n
        assert _counter(engine, "sediment_rows_appended_total", "r") == n
    with sediment.open(tmp_path / "data", clock=ManualClock()) as engine:
        engine.seal("r", n)
        got = engine.snapshot("r", as_of=n).sort_by("id")
        assert got.column("id").to_pylist() == list(range(n))
        assert got.column("payload").to_pylist() == [b"p%d" % k for k in range(n)]
