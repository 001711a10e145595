"""Paths over many small WAL records stay fast beside threads running Python: compaction reading
records back after a reopen from a cold page cache, snapshots and replays of a long tail, a
feed subscriber catching up. Each took every record alone (a log read, a decode, a sort, a
size), and each of those calls let go of the interpreter lock and waited for it again, up
to the switch interval, beside the busy threads (docs/architecture.md, "The interpreter
lock"). The bounds are wide: each path took 4x to 20x longer one record at a time, several
seconds, where it now takes under a second or two on a shared two-core host."""

from __future__ import annotations

import sys
import time

import pyarrow as pa
import pytest
from support.busy_threads import threads_running_python

import sediment
from sediment.clock import ManualClock
from sediment.errors import WalCorruption

SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.binary())])


def _rows(ids: range, t: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "payload": pa.array([b"p%d" % i for i in ids]),
                     "time": pa.array([t] * len(ids), pa.int64()), "diff": pa.array([1] * len(ids), pa.int64())})


def _one_row_records(engine, ids: range, t: int) -> None:
    """One WAL record a row, queued many at a time (no fsync a row, no joining)."""
    queued = []
    for i in ids:
        queued.append(engine.writer.append_queued("r", _rows(range(i, i + 1), t)))
        if len(queued) == 512:
            for q in queued:
                q.wait()
            queued.clear()
    for q in queued:
        q.wait()


def _filled(path, n: int, t: int = 1, **options):
    engine = sediment.open(path, clock=ManualClock(), compact_interval=None, **options)
    engine.add_relation("r", SCHEMA)
    _one_row_records(engine, range(n), t)
    engine.seal("r", 1)
    return engine


def _timed(call, busy: int = 2, tries: int = 1, switch: float | None = None):
    """``call``'s result and its quickest time of ``tries`` beside ``busy`` threads: a pass a
    record waits for the lock thousands of times in every try, while a host's other load
    slows only some tries. ``switch``: the interpreter's switch interval meanwhile, the most
    each of those waits takes; a longer one stretches a path a record far more than one
    that lets go of the lock a few times, whatever else the host runs."""
    before = sys.getswitchinterval()
    if switch is not None:
        sys.setswitchinterval(switch)
    try:
        with threads_running_python(busy):
            took = []
            for _ in range(tries):
                started = time.perf_counter()
                got = call()
                took.append(time.perf_counter() - started)
            return got, min(took)
    finally:
        sys.setswitchinterval(before)


def test_a_pass_after_a_reopen_reads_its_records_from_the_ring_together_beside_busy_threads(tmp_path):
    # the ring reads with direct I/O: a read a record waited for the disk, then for the lock
    # (500 records: ~9 s against 0.15 s); a pass compacts the tail away, so each of the
    # quickest-of-3 tries has a deployment of its own
    n, took = 500, []
    for k in range(3):
        ring = {"wal": f"device:{tmp_path / f'ring{k}.dev'}", "wal_capacity": 8 << 20}
        _filled(tmp_path / f"d{k}", n, **ring).close()
        with sediment.open(tmp_path / f"d{k}", clock=ManualClock(), compact_interval=None, **ring) as engine:
            assert engine.trace_info("r")["tail_records"] == n
            took.append(_timed(lambda: engine.compact("r"))[1])  # noqa: B023 - called at once
            got = engine.snapshot("r", as_of=1)
        assert got.column("id").to_pylist() == list(range(n))
        assert got.column("payload").to_pylist() == [b"p%d" % i for i in range(n)]
    assert min(took) < 2.0, f"a pass over {n} one-row records read back from the ring took {min(took):.1f} s"


def test_a_snapshot_of_a_long_tail_after_a_reopen_reads_the_ring_together_beside_busy_threads(tmp_path):
    n, ring = 500, {"wal": f"device:{tmp_path / 'ring.dev'}", "wal_capacity": 8 << 20}
    _filled(tmp_path / "d", n, **ring).close()
    with sediment.open(tmp_path / "d", clock=ManualClock(), compact_interval=None, **ring) as engine:
        got, took = _timed(lambda: engine.snapshot("r", as_of=1), tries=3)
    assert got.column("id").to_pylist() == list(range(n))
    assert got.column("payload").to_pylist() == [b"p%d" % i for i in range(n)]
    assert took < 2.0, f"a snapshot of {n} one-row records read back from the ring took {took:.1f} s"


def test_a_replay_of_a_long_tail_decodes_its_records_together_beside_busy_threads(tmp_path):
    # a decode and a sort a record: 5,000 records 3.5 s against 0.15-0.5 s at best of 3 on a
    # loaded host with the default 5 ms switch interval; with 20 ms, 5-11 s against 0.3-0.6 s
    n = 5_000
    with _filled(tmp_path / "d", n, t=3) as engine:
        _one_row_records(engine, range(n, n + 100), 2)  # earlier times after later ones: a sort is needed
        rows, took = _timed(lambda: pa.Table.from_batches(list(engine.replay("r"))), tries=3, switch=0.02)
    ids = rows.column("id").to_pylist()
    assert ids == list(range(n, n + 100)) + list(range(n))
    assert rows.column("time").to_pylist() == [2] * 100 + [3] * n
    assert rows.column("payload").to_pylist() == [b"p%d" % i for i in ids]
    assert took < 3.0, f"a replay of {n} one-row records took {took:.1f} s at best of 3"


WIDE = pa.schema([("id", pa.int64())] + [(f"c{j}", pa.string()) for j in range(16)])


def _wide_row(i: int) -> pa.Table:
    return pa.table({"id": pa.array([i], pa.int64()), **{f"c{j}": [f"v{i}-{j}"] for j in range(16)},
                     "time": pa.array([2], pa.int64()), "diff": pa.array([1], pa.int64())})


def test_a_subscriber_behind_by_many_records_catches_up_beside_busy_threads(tmp_path):
    # a decode, a table and a size a record, each waiting for the lock again beside four busy
    # threads: 3,000 records of 16 columns ~3-13 s against ~1-1.5 s on a loaded host with the
    # default 5 ms switch interval; with 20 ms, 11-14 s against 1.4-2.4 s. The feed keeps the
    # events it decoded for every subscriber: each of the quickest-of-3 tries has its own engine.
    n, took = 3_000, []
    wide = [_wide_row(i) for i in range(n)]
    for k in range(3):
        with sediment.open(tmp_path / f"d{k}", clock=ManualClock(), compact_interval=None) as engine:
            engine.add_relation("r", WIDE)
            sub = engine.subscribe("r")
            queued = [engine.writer.append_queued("r", one) for one in wide]
            for q in queued:
                q.wait()

            def catch_up(sub=sub) -> list:
                events = []
                while sum(e.table.num_rows for e in events) < n:
                    event = sub.next(timeout=30)
                    assert event is not None, "the feed stalled"
                    if event.kind == "updates":
                        events.append(event)
                return events

            events, quickest = _timed(catch_up, busy=4, switch=0.02)
            took.append(quickest)
            sub.close()
        rows = pa.concat_tables([e.table for e in events])
        assert rows.column("id").to_pylist() == list(range(n))
        assert rows.column("c7").to_pylist() == [f"v{i}-7" for i in range(n)]
    assert min(took) < 5.0, f"catching up over {n} one-row records took {min(took):.1f} s at best of 3"


def test_a_damaged_record_in_a_tail_read_together_is_named_by_its_lsn(tmp_path):
    with _filled(tmp_path / "d", 20) as engine:
        lsn = sorted(e.lsn for e in engine.view.get("r").tail)[7]
        size = len(memoryview(engine.view.bodies.get(lsn)))
        engine.view.bodies.put(lsn, b"\x00" * size, size)  # damaged in memory, after its checksum was checked
        with pytest.raises(WalCorruption, match=f"LSN {lsn} "):
            engine.snapshot("r", as_of=1)
        with pytest.raises(WalCorruption, match=f"LSN {lsn} "):
            list(engine.replay("r"))
        engine.view.bodies.drop_below(lsn + 1)  # the log's copy is whole
        assert engine.snapshot("r", as_of=1).column("id").to_pylist() == list(range(20))
