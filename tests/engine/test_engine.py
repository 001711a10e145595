"""The engine's public API: relations, appends, frontiers, reads, transactions, restarts, bad input.

The tests marked ``every_log`` show that the engine's behaviour does not depend on its log: they
also run on the replicated log and the log on S3 (tests/support/fixtures_engine.py)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest
from support.frontier_race import race_appends_and_seals

from sediment import errors
from sediment.wal.record import RecordKind

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def ups(rows):
    """[(id, name, time, diff)] as an updates table."""
    ids, names, times, diffs = zip(*rows, strict=True) if rows else ((), (), (), ())
    return pa.table({"id": pa.array(ids, pa.int64()), "name": pa.array(names, pa.string()),
                     "time": pa.array(times, pa.int64()), "diff": pa.array(diffs, pa.int64())})


def rows(table):
    return [tuple(r.values()) for r in table.to_pylist()]


def dir_digest(path) -> dict[str, str]:
    out = {}
    for root, _dirs, files in os.walk(path):
        for name in files:
            if name in ("LOCK", "lock"):
                continue
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = hashlib.sha256(f.read()).hexdigest()
    return out


@pytest.mark.every_log
def test_relations_add_list_schema_drop(open_engine):
    eng = open_engine()
    eng.add_relation("orders", SCHEMA)
    eng.add_relation("b.x-1", pa.schema([("k", pa.string())]))
    assert eng.relations() == ["b.x-1", "orders"]
    assert eng.schema("orders") == SCHEMA
    assert eng.since("orders") == 0 and eng.sealed("orders") == -1
    eng.drop_relation("b.x-1")
    assert eng.relations() == ["orders"]
    with pytest.raises(errors.UnknownRelation):
        eng.schema("b.x-1")


@pytest.mark.every_log
def test_snapshot_consolidates_and_sorts(open_engine):
    eng = open_engine()
    eng.add_relation("orders", SCHEMA)
    eng.append("orders", ups([(3, "c", 1, 1), (1, "a", 1, 1), (2, "b", 2, 2)]))
    eng.append("orders", ups([(2, "b", 3, -2), (1, "a", 3, 1), (4, "d", 4, 1)]))
    eng.seal("orders", 4)
    assert rows(eng.snapshot("orders", 1)) == [(1, "a", 1), (3, "c", 1)]
    assert rows(eng.snapshot("orders", 2)) == [(1, "a", 1), (2, "b", 2), (3, "c", 1)]
    assert rows(eng.snapshot("orders", 3)) == [(1, "a", 2), (3, "c", 1)]
    assert rows(eng.snapshot("orders", 4)) == [(1, "a", 2), (3, "c", 1), (4, "d", 1)]
    assert eng.snapshot("orders", 4).column_names == ["id", "name", "diff"]


@pytest.mark.every_log
def test_state_survives_restart(open_engine, tmp_path):
    eng = open_engine()
    eng.add_relation("orders", SCHEMA)
    eng.append("orders", ups([(1, "a", 1, 1), (2, "b", 2, 1)]))
    eng.seal("orders", 2)
    eng.append("orders", ups([(2, "b", 5, -1)]))
    eng.seal("orders", 5)
    eng.set_since("orders", 2)
    before = [rows(eng.snapshot("orders", t)) for t in range(2, 6)]
    eng.close()
    eng = open_engine()
    assert eng.relations() == ["orders"]
    assert eng.sealed("orders") == 5 and eng.since("orders") == 2
    assert [rows(eng.snapshot("orders", t)) for t in range(2, 6)] == before
    with pytest.raises(errors.TimeAlreadySealed):
        eng.append("orders", ups([(9, "z", 5, 1)]))


@pytest.mark.every_log
def test_replay_is_time_ordered_and_complete(open_engine):
    eng = open_engine()
    eng.add_relation("r", SCHEMA)
    eng.append("r", ups([(i, "x", 10 - i % 7, 1) for i in range(50)]))
    eng.append("r", ups([(i, "y", 1 + i % 3, -1) for i in range(20)]))
    eng.append("r", ups([(0, "z", 20, 5)]))
    out = pa.Table.from_batches(list(eng.replay("r", batch_rows=16)))
    times = out.column("time").to_pylist()
    assert times == sorted(times)
    assert out.num_rows == 71
    assert sorted(rows(out)) == sorted(
        [(i, "x", 10 - i % 7, 1) for i in range(50)] + [(i, "y", 1 + i % 3, -1) for i in range(20)] + [(0, "z", 20, 5)]
    )


@pytest.mark.every_log
@pytest.mark.embedded_only  # reads eng.wal
def test_large_append_splits_into_one_atomic_transaction(open_engine):
    eng = open_engine(max_record_bytes=4096)
    eng.add_relation("r", SCHEMA)
    table = ups([(i, "n" * 20, 1 + i % 5, 1) for i in range(3000)])
    before = eng.wal.end_lsn
    eng.append("r", table)
    assert eng.wal.end_lsn - before > 3  # BEGIN, several UPDATES, COMMIT
    eng.seal("r", 5)
    assert eng.snapshot("r", 5).num_rows == 3000


@pytest.mark.every_log
@pytest.mark.embedded_only  # reads eng.wal
def test_an_append_that_fits_is_one_record_bounded_by_its_own_times(open_engine):
    """One UPDATES record per chunk that fits ``max_record_bytes``, whatever the buffers the
    table shares: a slice of a large table is sized by its own rows, and each record's time
    bounds are its rows' (the records the log keeps, read back)."""
    eng = open_engine(max_record_bytes=64 << 10)
    eng.add_relation("r", SCHEMA)

    def records_of(table) -> list:
        before = eng.wal.end_lsn
        eng.append("r", table)
        got = list(eng.wal.scan(before))
        return [(r.t_lo, r.t_hi, r.count) for r in got if r.kind == RecordKind.UPDATES]

    assert records_of(ups([(i, "a", 3 + i % 7, 1) for i in range(300)])) == [(3, 9, 300)]
    big = ups([(i, "b" * 40, 20 + i // 1000, 1) for i in range(20000)])  # its buffers: about 1 MB
    assert records_of(big.slice(5000, 300)) == [(25, 25, 300)]
    chunked = pa.concat_tables([ups([(i, "c", 40 + i, 1) for i in range(50)]), ups([(i, "d", 60 + i, 1) for i in range(80)])])
    assert records_of(chunked) == [(40, 89, 50), (60, 139, 80)]  # one per chunk, each its own bounds
    eng.seal("r", 200)
    assert eng.snapshot("r", 200).num_rows == 300 + 300 + 130


@pytest.mark.every_log
def test_transaction_visible_only_after_commit_and_abort_leaves_nothing(open_engine):
    eng = open_engine()
    eng.add_relation("a", SCHEMA)
    eng.add_relation("b", SCHEMA)
    tx = eng.transaction()
    tx.append("a", ups([(1, "a", 1, 1)]))
    tx.append("b", ups([(2, "b", 1, 1)]))
    eng.seal("a", 0)
    eng.seal("b", 0)
    assert eng.snapshot("a", 0).num_rows == 0
    tx.commit()
    eng.seal("a", 1)
    eng.seal("b", 1)
    assert rows(eng.snapshot("a", 1)) == [(1, "a", 1)] and rows(eng.snapshot("b", 1)) == [(2, "b", 1)]
    with pytest.raises(RuntimeError), eng.transaction() as tx2:
        tx2.append("a", ups([(3, "c", 2, 1)]))
        raise RuntimeError("job failed")
    assert tx2.state == "aborted"
    eng.seal("a", 2)
    assert rows(eng.snapshot("a", 2)) == [(1, "a", 1)]
    with pytest.raises(errors.TransactionError):
        tx.append("a", ups([(5, "e", 9, 1)]))


@pytest.mark.every_log
def test_commit_all_makes_several_transactions_visible_as_one_and_survives_restart(open_engine):
    eng = open_engine()
    eng.add_relation("a", SCHEMA)
    eng.add_relation("b", SCHEMA)
    first, second, loser, empty = eng.transaction(), eng.transaction(), eng.transaction(), eng.transaction()
    first.append("a", ups([(1, "first", 1, 1)]))
    loser.append("a", ups([(2, "loser", 1, 1)]))
    second.append("b", ups([(3, "second", 1, 1)]))
    second.append("a", ups([(4, "second", 1, 1)]))
    eng.commit_all([first, second, empty])
    assert (first.state, second.state, empty.state, loser.state) == ("committed", "committed", "committed", "open")
    eng.seal("a", 1)
    eng.seal("b", 1)
    assert rows(eng.snapshot("a", 1)) == [(1, "first", 1), (4, "second", 1)]
    assert rows(eng.snapshot("b", 1)) == [(3, "second", 1)]
    eng.close()  # loser stays open until the engine goes: replay discards it
    eng = open_engine()
    assert rows(eng.snapshot("a", 1)) == [(1, "first", 1), (4, "second", 1)]
    assert rows(eng.snapshot("b", 1)) == [(3, "second", 1)]


@pytest.mark.every_log
def test_commit_all_aborts_every_transaction_when_one_cannot_commit(open_engine):
    eng = open_engine()
    eng.add_relation("a", SCHEMA)
    eng.add_relation("b", SCHEMA)
    ok, late = eng.transaction(), eng.transaction()
    ok.append("a", ups([(1, "ok", 9, 1)]))
    late.append("b", ups([(2, "late", 3, 1)]))
    eng.seal("b", 5)  # late's time 3 is sealed now
    with pytest.raises(errors.TransactionError):
        eng.commit_all([ok, late])
    assert ok.state == late.state == "aborted"
    done, other = eng.transaction(), eng.transaction()
    done.append("a", ups([(3, "done", 9, 1)]))
    other.append("a", ups([(4, "other", 9, 1)]))
    done.commit()
    with pytest.raises(errors.TransactionError):
        eng.commit_all([other, done])  # done already finished: nothing of this call commits
    assert (other.state, done.state) == ("aborted", "committed")
    eng.seal("a", 9)
    assert rows(eng.snapshot("a", 9)) == [(3, "done", 1)]


@pytest.mark.every_log
def test_commit_fails_when_its_times_were_sealed_meanwhile(open_engine):
    eng = open_engine()
    eng.add_relation("a", SCHEMA)
    tx = eng.transaction()
    tx.append("a", ups([(1, "a", 3, 1)]))
    eng.seal("a", 5)
    with pytest.raises(errors.TransactionError):
        tx.commit()
    assert tx.state == "aborted"
    assert eng.snapshot("a", 5).num_rows == 0


@pytest.mark.every_log
def test_append_many_is_atomic_across_relations(open_engine):
    eng = open_engine()
    eng.add_relation("a", SCHEMA)
    eng.add_relation("b", SCHEMA)
    eng.seal("b", 3)
    with pytest.raises(errors.TimeAlreadySealed):
        eng.append_many({"a": ups([(1, "a", 5, 1)]), "b": ups([(1, "b", 2, 1)])})
    eng.append_many({"a": ups([(1, "a", 5, 1)]), "b": ups([(1, "b", 5, 1)])})
    eng.seal("a", 5)
    eng.seal("b", 5)
    assert rows(eng.snapshot("a", 5)) == [(1, "a", 1)] and rows(eng.snapshot("b", 5)) == [(1, "b", 1)]


@pytest.mark.every_log
@pytest.mark.embedded_only  # scans eng.wal
def test_concurrent_appends_and_seals_never_violate_the_frontier(open_engine):
    eng = open_engine()
    eng.add_relation("r", SCHEMA)
    race_appends_and_seals(eng, writers=6, last=60)
    # every accepted update is in the log after the last seal below its time
    seals, last_seal = {}, -1
    for r in eng.wal.scan():
        if r.kind == 2:
            last_seal = r.t_hi
        elif r.kind == 1:
            assert r.t_lo > last_seal
            seals[r.lsn] = last_seal


@pytest.mark.every_log
def test_set_since_rules(open_engine):
    eng = open_engine()
    eng.add_relation("r", SCHEMA)
    eng.append("r", ups([(1, "a", 1, 1), (1, "a", 3, -1)]))
    eng.seal("r", 4)
    eng.set_since("r", 2)
    with pytest.raises(errors.FrontierRegression):
        eng.set_since("r", 1)
    with pytest.raises(errors.FrontierRegression):
        eng.set_since("r", 5)
    with pytest.raises(errors.AsOfOutOfRange):
        eng.snapshot("r", 1)
    with pytest.raises(errors.AsOfOutOfRange):
        eng.snapshot("r", 5)
    assert rows(eng.snapshot("r", 2)) == [(1, "a", 1)]
    assert rows(eng.snapshot("r", 3)) == []


BAD_CALLS = {
    "unknown relation": (lambda e: e.append("nope", ups([(1, "a", 9, 1)])), errors.UnknownRelation),
    "existing relation": (lambda e: e.add_relation("orders", SCHEMA), errors.RelationExists),
    "path as name": (lambda e: e.add_relation("../etc", SCHEMA), errors.InvalidRelationName),
    "empty name": (lambda e: e.add_relation("", SCHEMA), errors.InvalidRelationName),
    "slash in name": (lambda e: e.add_relation("a/b", SCHEMA), errors.InvalidRelationName),
    "time column": (lambda e: e.add_relation("x", pa.schema([("time", pa.int64())])), errors.SchemaMismatch),
    "diff column": (lambda e: e.add_relation("x", pa.schema([("a", pa.int8()), ("diff", pa.int64())])),
                    errors.SchemaMismatch),
    "nested type": (lambda e: e.add_relation("x", pa.schema([("a", pa.list_(pa.int8()))])), errors.SchemaMismatch),
    "missing column": (lambda e: e.append("orders", ups([(1, "a", 9, 1)]).drop_columns(["name"])),
                       errors.SchemaMismatch),
    "extra column": (lambda e: e.append("orders", ups([(1, "a", 9, 1)]).append_column("x", pa.array([1]))),
                     errors.SchemaMismatch),
    "wrong type": (lambda e: e.append("orders", pa.table({"id": ["1"], "name": ["a"], "time": [9], "diff": [1]})),
                   errors.SchemaMismatch),
    "missing diff": (lambda e: e.append("orders", pa.table({"id": [1], "name": ["a"], "time": [9]})),
                     errors.InvalidUpdates),
    "negative time": (lambda e: e.append("orders", ups([(1, "a", -1, 1)])), errors.InvalidUpdates),
    "null diff": (lambda e: e.append("orders", pa.table({"id": [1], "name": ["a"], "time": [9],
                                                         "diff": pa.array([None], pa.int64())})),
                  errors.InvalidUpdates),
    "sealed time": (lambda e: e.append("orders", ups([(1, "a", 9, 1), (2, "b", 5, 1)])), errors.TimeAlreadySealed),
    "seal backwards": (lambda e: e.seal("orders", 4), errors.FrontierRegression),
    "since backwards": (lambda e: e.set_since("orders", 0), errors.FrontierRegression),
    "since past sealed": (lambda e: e.set_since("orders", 6), errors.FrontierRegression),
    "as_of below since": (lambda e: e.snapshot("orders", 0), errors.AsOfOutOfRange),
    "as_of above sealed": (lambda e: e.snapshot("orders", 6), errors.AsOfOutOfRange),
    "bad time type": (lambda e: e.seal("orders", "7"), ValueError),
    "not a table": (lambda e: e.append("orders", [1, 2]), errors.InvalidUpdates),
    "multi with bad part": (lambda e: e.append_many({"orders": ups([(1, "a", 9, 1)]), "nope": ups([])}),
                            errors.UnknownRelation),
}


# Refused by the writer at the log's door (a sealed time, one bad part of several): these run on
# every log; the others are refused before anything reaches a log or a blob store, so they run on
# the file log and file blob store, embedded and through the server.
AT_THE_LOG = ("sealed time", "multi with bad part")


@pytest.mark.every_log
@pytest.mark.parametrize("case", [c if c in AT_THE_LOG else pytest.param(c, marks=pytest.mark.backend_independent)
                                  for c in sorted(BAD_CALLS)])
def test_bad_input_is_a_typed_error_and_writes_nothing(open_engine, tmp_path, case):
    eng = open_engine()
    eng.add_relation("orders", SCHEMA)
    eng.append("orders", ups([(1, "a", 1, 1)]))
    eng.seal("orders", 5)
    eng.set_since("orders", 1)
    call, expected = BAD_CALLS[case]
    state = (eng.relations(), eng.sealed("orders"), eng.since("orders"), rows(eng.snapshot("orders", 5)))
    digest = dir_digest(tmp_path / "data")
    with pytest.raises(expected) as err:
        call(eng)
    assert isinstance(err.value, errors.SedimentError) or expected is ValueError
    assert str(err.value)
    assert (eng.relations(), eng.sealed("orders"), eng.since("orders"), rows(eng.snapshot("orders", 5))) == state
    assert dir_digest(tmp_path / "data") == digest


@pytest.mark.every_log
def test_second_engine_on_same_dir_is_refused(open_engine, tmp_path):
    open_engine()
    with pytest.raises(errors.DataDirLocked):
        open_engine()


CRASHER = textwrap.dedent("""
    import json, sys, pyarrow as pa, sediment
    eng = sediment.open(sys.argv[1], segment_bytes=1 << 16, **json.loads(sys.argv[2]))
    if "r" not in eng.relations():
        eng.add_relation("r", pa.schema([("k", pa.int64())]))
        eng.add_relation("s", pa.schema([("k", pa.int64())]))
    i = 0
    while True:
        t = 1 + i
        if i % 3 == 0:
            eng.append("r", pa.table({"k": [i], "time": [t], "diff": [1]}))
        elif i % 3 == 1:
            eng.append_many({"r": pa.table({"k": [i], "time": [t], "diff": [1]}),
                             "s": pa.table({"k": [i], "time": [t], "diff": [1]})})
        else:
            with eng.transaction() as tx:
                tx.append("r", pa.table({"k": [i], "time": [t], "diff": [1]}))
                tx.append("s", pa.table({"k": [i], "time": [t], "diff": [1]}))
        eng.seal("r", t)
        eng.seal("s", t)
        print(i, flush=True)
        i += 1
""")


@pytest.mark.every_log
def test_sigkill_mid_appends_keeps_acknowledged_and_no_partial_transaction(open_engine, engine_options, tmp_path):
    data = tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-c", CRASHER, str(data), json.dumps(engine_options(str(data)))],
                            stdout=subprocess.PIPE, text=True)
    acked = -1
    try:
        for line in proc.stdout:
            acked = int(line)
            if acked >= 400:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    eng = open_engine(data, segment_bytes=1 << 16)
    sealed = eng.sealed("r")
    assert sealed >= acked + 1
    r = {k for k, _d in rows(eng.snapshot("r", sealed))}
    s = {k for k, _d in rows(eng.snapshot("s", eng.sealed("s")))}
    assert set(range(acked + 1)) <= r
    assert {i for i in range(acked + 1) if i % 3} <= s
    # transactions are all-or-nothing: r holds every pair member that s holds and vice versa
    replay_r = {row[0] for row in rows(pa.Table.from_batches(list(eng.replay("r"))))}
    replay_s = {row[0] for row in rows(pa.Table.from_batches(list(eng.replay("s"))))}
    assert {k for k in replay_r if k % 3} == replay_s


@pytest.mark.embedded_only
def test_storage_options_are_remembered_by_the_data_directory(tmp_path):
    import sediment
    from sediment.cli import main

    data = tmp_path / "d"
    ring = tmp_path / "ring.dev"
    with sediment.open(data, wal=f"device:{ring}", wal_capacity=8 << 20) as eng:
        eng.add_relation("orders", SCHEMA)
        eng.append("orders", ups([(1, "a", 1, 1)]))
        eng.seal("orders", 1)
    with sediment.open(data) as eng:  # no options: the recorded device ring is used
        assert rows(eng.snapshot("orders", 1)) == [(1, "a", 1)]
    assert main(["--data-dir", str(data), "read", "orders", "--as-of", "1"]) == 0
    with pytest.raises(ValueError, match="was created with wal="):
        sediment.open(data, wal="file")
    with pytest.raises(ValueError):  # a bad option on a new directory records nothing
        sediment.open(tmp_path / "new", wal="bogus")
    with sediment.open(tmp_path / "new") as eng:
        assert eng.relations() == []
    for given in ({}, {"wal_capacity": 8 << 20}):  # the default file log is recorded too
        with pytest.raises(errors.InvalidArgument, match=r"created with the file log \(wal='file'\)"):
            sediment.open(tmp_path / "new", wal=f"device:{tmp_path / 'other.dev'}", **given)
    assert not (tmp_path / "other.dev").exists()


@pytest.mark.every_log
@pytest.mark.embedded_only  # reads eng.wal
def test_compaction_trims_the_log_and_a_restart_reads_the_same(open_engine, wal_backend):
    """Compaction moves sealed updates into batches and trims the log below them; the
    reopened engine answers exactly as before, from batches and the log's tail."""
    eng = open_engine(segment_bytes=1 << 14)
    eng.add_relation("r", pa.schema([("k", pa.int64())]))
    for t in range(1, 200):
        eng.append("r", pa.table({"k": [t % 17], "time": [t], "diff": [1]}))
        eng.seal("r", t)
    eng.compact()
    before = eng.snapshot("r", 199).sort_by("k").to_pylist()
    assert sum(r["diff"] for r in before) == 199
    assert eng.wal.start_lsn > 0, f"the {wal_backend} log was not trimmed after compaction"
    eng.close()
    eng = open_engine(segment_bytes=1 << 14)
    assert eng.sealed("r") == 199
    assert eng.snapshot("r", 199).sort_by("k").to_pylist() == before
    eng.append("r", pa.table({"k": [1], "time": [200], "diff": [1]}))
    eng.seal("r", 200)
    assert sum(r["diff"] for r in eng.snapshot("r", 200).to_pylist()) == 200
