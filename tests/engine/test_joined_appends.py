"""Concurrent one-row appends joined into one WAL record per group (wal/group_records.py,
sediment/arrow_codec.py group bodies): every append's rows stored once, in each writer's order
on the feed, counted once each, visible when ``append`` returns, kept across a reopen and
through compaction from memory and from the log; a refused append leaves its group's others
applied; a group body that does not decode to its header's rows is refused naming its LSN."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

import sediment
from sediment.arrow_codec import (
    GROUP_HEADER,
    GROUP_MAGIC,
    decode_updates,
    decode_updates_many,
    encode_updates,
    is_group_body,
    join_updates,
)
from sediment.clock import ManualClock
from sediment.errors import CompactionFailed, TimeAlreadySealed, WalCorruption
from sediment.wal.record import Record, RecordKind

SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.binary())])
UPDATES = pa.schema([("id", pa.int64()), ("payload", pa.binary()), ("time", pa.int64()), ("diff", pa.int64())])


def _row(k: int, t: int = 1) -> pa.Table:
    return pa.table({"id": pa.array([k], pa.int64()), "payload": pa.array([b"p%d" % k], pa.binary()),
                     "time": pa.array([t], pa.int64()), "diff": pa.array([1], pa.int64())})


def _body(k: int) -> bytes:
    return encode_updates(_row(k).to_batches()[0]).to_pybytes()


def _counter(engine, name: str) -> float:
    for family in text_string_to_metric_families(engine.metrics.exposition().decode()):
        for s in family.samples:
            if s.name == name and s.labels.get("relation") == "r":
                return s.value
    raise AssertionError(f"no {name}")


def _joined_records(engine) -> list[Record]:
    return [r for r in engine.writer.log.scan() if r.kind == RecordKind.UPDATES and r.count > 1]


def _tail_rows(engine) -> int:
    with engine.writer.view.lock:
        return sum(e.rows for e in engine.writer.view.relations.get("r").tail)


def _run_writers(engine, writers: int, each: int, first: int, bad=None, t: int = 1) -> list[str]:
    """``writers`` threads append ids ``first + w * each + i``, one row each, in order; each
    checks its rows are visible on return. ``bad(i)``, when given, runs ``each`` times in one
    more thread beside them. The problems seen (empty when none)."""
    start = threading.Barrier(writers + (bad is not None))
    returned = [0]
    count = threading.Lock()
    problems: list[str] = []

    def work(w: int) -> None:
        start.wait()
        try:
            for i in range(each):
                engine.append("r", _row(first + w * each + i, t))
                with count:
                    returned[0] += 1
                    seen = returned[0]
                if _tail_rows(engine) < seen:
                    problems.append(f"writer {w}: append {i} returned before its rows were visible")
        except Exception as exc:  # noqa: BLE001 - the test reports it
            problems.append(f"writer {w}: {exc!r}")

    def refuse() -> None:
        start.wait()
        try:
            for i in range(each):
                bad(i)
        except BaseException as exc:  # noqa: BLE001 - pytest's failures too
            problems.append(f"refused appends: {exc!r}")

    threads = [threading.Thread(target=work, args=(w,)) for w in range(writers)]
    if bad is not None:
        threads.append(threading.Thread(target=refuse))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return problems


def _until_joined(engine, writers: int, each: int, bad=None, t: int = 1) -> int:
    """Rounds of concurrent appends until the log holds a joined record (the grouping is
    the scheduler's); the ids appended, 0 to n - 1."""
    n = 0
    deadline = time.monotonic() + 60
    while not _joined_records(engine):
        assert time.monotonic() < deadline, "no group of appends was joined in 60 s"
        assert _run_writers(engine, writers, each, n, bad, t) == []
        n += writers * each
    return n


def test_joined_appends_keep_every_row_in_order_and_count_each(tmp_path):
    with sediment.open(tmp_path / "d", clock=ManualClock()) as engine:
        engine.add_relation("r", SCHEMA)
        with engine.subscribe("r") as feed:
            assert feed.next(timeout=10).kind == "snapshot"
            n = _until_joined(engine, 16, 40)
            joined = _joined_records(engine)
            for r in joined:  # the leader encoded the run's rows as one plain body (one message)
                assert not is_group_body(r.body)
                assert decode_updates(r.body, UPDATES).num_rows == r.count
            assert sum(r.count for r in engine.writer.log.scan() if r.kind == RecordKind.UPDATES) == n
            engine.seal("r", 1)
            ids = []
            while True:
                event = feed.next(timeout=10)
                if event.kind == "progress":
                    break
                ids += event.table.column("id").to_pylist()
        assert sorted(ids) == list(range(n))  # every row once
        by_writer: dict[int, list[int]] = {}  # a writer appends ids w * 40 to w * 40 + 39 in order
        for k in ids:
            by_writer.setdefault(k // 40, []).append(k)
        assert all(mine == sorted(mine) for mine in by_writer.values())
        assert _counter(engine, "sediment_appends_total") == n
        assert _counter(engine, "sediment_rows_appended_total") == n
    with sediment.open(tmp_path / "d", clock=ManualClock()) as engine:  # compaction reads the joined bodies back
        assert _joined_records(engine)
        engine.compact()
        got = engine.snapshot("r", as_of=1).sort_by("id")
        assert got.column("id").to_pylist() == list(range(n))
        assert got.column("payload").to_pylist() == [b"p%d" % k for k in range(n)]


def test_a_refused_append_leaves_its_groups_others_applied(tmp_path):
    with sediment.open(tmp_path / "d", clock=ManualClock()) as engine:
        engine.add_relation("r", SCHEMA)
        engine.seal("r", 5)
        refused = []

        def sealed_time(i: int) -> None:
            with pytest.raises(TimeAlreadySealed):
                engine.append("r", _row(10_000_000 + i, t=3))
            refused.append(i)

        n = _until_joined(engine, 8, 30, bad=sealed_time, t=10)
        assert len(refused) == 30 * (n // (8 * 30))  # every refusal raised, in the same rounds
        engine.seal("r", 10)
        engine.compact()
        got = engine.snapshot("r", as_of=10)
        assert sorted(got.column("id").to_pylist()) == list(range(n))  # no refused row, every other one


def test_group_bodies_decode_alone_and_among_plain_bodies():
    plain = [_body(k) for k in range(7)]
    group = join_updates(plain[1:4])
    assert GROUP_HEADER.unpack_from(group)[:4] == (GROUP_MAGIC, 2, 0, 3)
    assert decode_updates(group, UPDATES).column("id").to_pylist() == [1, 2, 3]
    mixed = [plain[0], group, plain[4], join_updates(plain[5:7])]
    assert decode_updates_many(mixed, UPDATES).column("id").to_pylist() == list(range(7))
    for n in (2, 4):  # a header that disagrees with its messages
        wrong = GROUP_HEADER.pack(GROUP_MAGIC, 2, 0, n) + group[GROUP_HEADER.size:]
        with pytest.raises(ValueError):
            decode_updates(wrong, UPDATES)
        with pytest.raises(ValueError):
            decode_updates_many([plain[0], wrong], UPDATES)


def test_a_newer_group_body_version_is_refused_typed(tmp_path):
    newer = GROUP_HEADER.pack(GROUP_MAGIC, 3, 0, 1) + _body(1)
    with sediment.open(tmp_path / "d", clock=ManualClock()) as engine:
        engine.add_relation("r", SCHEMA)
        rel = engine.writer.view.relations.get("r")
        with pytest.raises(WalCorruption, match="version 3"):
            rel.decode_body(newer, 0)
        assert rel.decode_body(join_updates([_body(1), _body(2)]), 0).num_rows == 2


@pytest.mark.parametrize("read", ["snapshot", "replay"])
def test_reads_refuse_a_newer_group_body_version_typed(tmp_path, read):
    newer = GROUP_HEADER.pack(GROUP_MAGIC, 3, 0, 1) + _body(1)
    with sediment.open(tmp_path / "d", clock=ManualClock(), compact_interval=None) as engine:
        engine.add_relation("r", SCHEMA)
        rid = engine.writer.view.relations.get("r").entry.id
        engine.writer.log.submit([Record(RecordKind.UPDATES, rid, 0, 1, 1, 1, newer)],
                                 engine.writer.view.on_durable).wait()
        engine.seal("r", 1)
        with pytest.raises(WalCorruption, match="version 3"):
            engine.snapshot("r", as_of=1) if read == "snapshot" else list(engine.replay("r"))


def test_a_joined_record_that_decodes_to_other_rows_than_its_header_counts_is_refused(tmp_path):
    with sediment.open(tmp_path / "d", clock=ManualClock()) as engine:
        engine.add_relation("r", SCHEMA)
        rid = engine.writer.view.relations.get("r").entry.id
        engine.append("r", _row(0))
        body = join_updates([_body(1), _body(2)])
        lsn = engine.writer.log.submit([Record(RecordKind.UPDATES, rid, 0, 1, 1, 3, body)],
                                       engine.writer.view.on_durable).wait()
        engine.seal("r", 1)
        with pytest.raises(CompactionFailed, match=f"WalCorruption: .*UPDATES record at LSN {lsn} does not decode to the 3 rows"):
            engine.compact()
