"""Bad input gets a typed error, and nothing else happens (issue 12, finding 7).

Each test makes the bad call, asserts the sediment.errors type (still a ValueError where
old callers caught one) and a one-line message, and that nothing changed: relations,
frontiers, snapshots, the trace and the WAL's end LSN (and, embedded, every file).
"""

from __future__ import annotations

import math
import os
import random

import pyarrow as pa
import pytest
from test_engine import SCHEMA, dir_digest, rows, ups

import sediment
from sediment import errors
from sediment.cli import main as cli_main
from sediment.trace.consolidate import consolidate, snapshot
from sediment.trace.merge import merge_sorted

FILE_ONLY = [pytest.mark.parametrize("wal_backend", ["file"], indirect=True),
             pytest.mark.parametrize("blob_options", ["file"], indirect=True)]


def file_only(f):
    for mark in FILE_ONLY:
        f = mark(f)
    return f


def observe(eng, names=("orders",)) -> tuple:
    """Everything a caller can see, plus the WAL's end when the engine is in this process."""
    out = [eng.relations()]
    for name in names:
        sealed = eng.sealed(name)
        out += [sealed, eng.since(name), eng.trace_info(name)]
        out.append(rows(eng.snapshot(name, sealed)) if sealed >= eng.since(name) else None)
    wal = getattr(eng, "wal", None)
    out.append(wal.end_lsn if wal is not None else None)
    return tuple(out)


@pytest.fixture
def seeded(open_engine):
    eng = open_engine(compact_interval=None)
    eng.add_relation("orders", SCHEMA)
    eng.append("orders", ups([(1, "a", 1, 1), (2, "b", 3, 2)]))
    eng.seal("orders", 5)
    eng.set_since("orders", 1)
    return eng


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert text and "\n" not in text, text
    return text


BAD_TIMES = [-1, 2**63, 2**64, 1.0, 7.5, True, False, "7", [7], {"t": 7}]
TIME_CALLS = {
    "seal": lambda e, t: e.seal("orders", t),
    "set_since": lambda e, t: e.set_since("orders", t),
    "snapshot": lambda e, t: e.snapshot("orders", t),
    "subscribe as_of": lambda e, t: e.subscribe("orders", t),
    "plan_read as_of": lambda e, t: e.plan_read("orders", t),
    "plan_read from_t": lambda e, t: e.plan_read("orders", 5, from_t=t),
}
NONE_ALLOWED = {"subscribe as_of", "plan_read from_t"}


@file_only
@pytest.mark.parametrize("call", sorted(TIME_CALLS))
def test_bad_times_are_invalid_time_and_change_nothing(seeded, tmp_path, access, call):
    eng = seeded
    before = observe(eng)
    digest = dir_digest(tmp_path / "data")
    for bad in BAD_TIMES + ([] if call in NONE_ALLOWED else [None]):
        with pytest.raises(errors.InvalidTime) as err:
            TIME_CALLS[call](eng, bad)
        assert isinstance(err.value, ValueError) and isinstance(err.value, errors.InvalidArgument)
        assert "[0, 2**63)" in _one_line(err.value) and repr(bad) in str(err.value), (bad, err.value)
        assert observe(eng) == before
    assert dir_digest(tmp_path / "data") == digest


@pytest.mark.embedded_only
@file_only
def test_bad_arguments_are_invalid_argument_and_change_nothing(seeded, tmp_path):
    eng = seeded
    other = sediment.open(tmp_path / "other", compact_interval=None)
    foreign = other.transaction()
    txn = eng.transaction()
    txn.append("orders", ups([(9, "z", 7, 1)]))
    calls = {
        "replay batch_rows 0": lambda: eng.replay("orders", batch_rows=0),
        "replay batch_rows str": lambda: eng.replay("orders", batch_rows="10"),
        "replay batch_rows float": lambda: eng.replay("orders", batch_rows=1.5),
        "replay batch_rows bool": lambda: eng.replay("orders", batch_rows=True),
        "replay ordered str": lambda: eng.replay("orders", ordered="no"),
        "subscribe resume str": lambda: eng.subscribe("orders", resume="yes"),
        "plan_read lease 0": lambda: eng.plan_read("orders", 5, lease_seconds=0),
        "plan_read lease nan": lambda: eng.plan_read("orders", 5, lease_seconds=math.nan),
        "plan_read lease str": lambda: eng.plan_read("orders", 5, lease_seconds="60"),
        "plan_read lease over a day": lambda: eng.plan_read("orders", 5, lease_seconds=86400.5),
        "release_read str": lambda: eng.release_read("1"),
        "release_read negative": lambda: eng.release_read(-1),
        "append locks str": lambda: eng.append("orders", ups([(3, "c", 8, 1)]), locks="w"),
        "append_many list": lambda: eng.append_many([("orders", ups([(3, "c", 8, 1)]))]),
        "append_many locks": lambda: eng.append_many({"orders": ups([(3, "c", 8, 1)])}, locks=5),
        "commit_all str": lambda: eng.commit_all("txn"),
        "commit_all ids": lambda: eng.commit_all([txn.id]),
        "commit_all one txn": lambda: eng.commit_all(txn),
    }
    before = observe(eng)
    for what, call in calls.items():
        with pytest.raises(errors.InvalidArgument) as err:
            call()
        assert isinstance(err.value, ValueError), what
        _one_line(err.value)
        assert observe(eng) == before, what
    with pytest.raises(errors.TransactionError, match="another engine"):
        eng.commit_all([foreign])
    assert txn.state == "open"
    txn.commit()  # the refused calls left the transaction usable
    eng.seal("orders", 7)
    assert (9, "z", 1) in rows(eng.snapshot("orders", 7))
    other.close()


BAD_OPTIONS = {
    "segment_bytes 0": {"segment_bytes": 0},
    "segment_bytes str": {"segment_bytes": "64M"},
    "wal_capacity negative": {"wal": "device:{d}.ring", "wal_capacity": -1},
    "wal not str": {"wal": 1},
    "wal empty": {"wal": ""},
    "wal unknown": {"wal": "bogus"},
    "wal device without path": {"wal": "device:"},
    "replicas without metadata": {"replicas": ["127.0.0.1:1"]},
    "compact str": {"compact": "yes"},
    "compact_interval negative": {"compact_interval": -1},
    "compact_interval nan": {"compact_interval": math.nan},
    "merge_factor below 1": {"merge_factor": 0.5},
    "merge_factor inf": {"merge_factor": math.inf},
    "major_compaction_quiet negative": {"major_compaction_quiet": -1},
    "major_compaction_quiet str": {"major_compaction_quiet": "10"},
    "memory_bound 0": {"memory_bound": 0},
    "lock_slots 0": {"lock_slots": 0},
    "lock_slots float": {"lock_slots": 4.0},
    "repair str": {"repair": "no"},
    "replicas str": {"replicas": "127.0.0.1:1"},
    "replicas ints": {"replicas": [1, 2]},
    "replicas not host:port": {"replicas": ["notanaddr"], "metadata": "memory://"},
    "replicas port 0": {"replicas": ["127.0.0.1:0"], "metadata": "memory://"},
    "replicas port past 65535": {"replicas": ["127.0.0.1:70000"], "metadata": "memory://"},
    "replicas one node twice": {"replicas": ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7001"],
                                "metadata": "memory://"},
    "cluster_key not a uuid": {"cluster_key": "k"},
    "cluster_key int": {"cluster_key": 7},
    "metadata int": {"metadata": 5},
    "blob int": {"blob": 5},
    "s3_endpoint int": {"s3_endpoint": 9000},
    "metadata unknown scheme": {"metadata": "nope://"},
    "metadata zk without host": {"metadata": "zk:///sediment"},
    "blob unknown scheme": {"blob": "ftp://x"},
    "blob file with a host": {"blob": "file://elsewhere/x"},
    "blob s3 without bucket": {"blob": "s3:///prefix"},
    "arrow_memory_pool unknown": {"arrow_memory_pool": "nope"},
    "arrow_memory_pool int": {"arrow_memory_pool": 1},
    "clock int": {"clock": 5},
    "take_over_blob_prefix str": {"take_over_blob_prefix": "yes"},
    "wal_capacity str": {"wal": "device:{d}.ring", "wal_capacity": "1G"},
    "max_record_bytes negative": {"max_record_bytes": -1},
    "max_wal_backlog str": {"max_wal_backlog": "1G"},
    "log_partition negative": {"log_partition": -1},
    "wal_capacity of the file log": {"wal_capacity": 1 << 20},  # another log's options: refused, not recorded
    "cluster_key without replicas": {"cluster_key": "0b7b0c2e-8a35-4f0e-9f43-5b8d5c0e7a11"},
    "log_partition without replicas": {"log_partition": 1},
    "unknown option": {"segment_size": 1 << 20},
    "misspelt option": {"compact_intervall": 1.0},
}


@pytest.mark.parametrize("case", sorted(BAD_OPTIONS))
def test_bad_open_options_create_nothing(tmp_path, case):
    data = tmp_path / "data"
    options = {k: v.format(d=data) if isinstance(v, str) else v for k, v in BAD_OPTIONS[case].items()}
    with pytest.raises(errors.InvalidArgument) as err:
        sediment.open(data, **options)
    assert isinstance(err.value, ValueError)
    text = _one_line(err.value)
    assert next(iter(options)) in text
    assert not data.exists() and os.listdir(tmp_path) == []


@pytest.mark.parametrize("data_dir", [None, "", 5, b"bytes", "a\0b"])
def test_bad_data_dir_is_refused(tmp_path, data_dir):
    with pytest.raises(errors.InvalidArgument, match="data directory"):
        sediment.open(data_dir)


def test_bad_options_keep_an_existing_dir_as_it_was(tmp_path):
    data = tmp_path / "data"
    with sediment.open(data, compact_interval=None) as eng:
        eng.add_relation("orders", SCHEMA)
        eng.append("orders", ups([(1, "a", 1, 1)]))
        eng.seal("orders", 1)
    digest = dir_digest(data)
    for options in ({"segment_bytes": -5}, {"merge_factor": "2"}, {"bogus": 1}, {"wal_capacity": 1 << 20}):
        with pytest.raises(errors.InvalidArgument):
            sediment.open(data, **options)
    assert dir_digest(data) == digest
    with sediment.open(data, compact_interval=None) as eng:
        assert rows(eng.snapshot("orders", 1)) == [(1, "a", 1)]


# --- one relation that cannot be compacted never stops the others -------------------------------

BIG = 2**62


@pytest.mark.embedded_only
@file_only
def test_relation_that_cannot_compact_is_reported_retried_and_keeps_its_wal(open_engine, tmp_path, caplog):
    """Two diffs of 2^62 for one row: that relation's compaction fails (DiffOverflow) on every
    pass, is logged and reported, keeps its WAL records; the other relation is compacted and
    the log trimmed below the failed one only. A compensating diff lets it compact again."""
    eng = open_engine(compact_interval=None)
    eng.add_relation("good", SCHEMA)
    eng.add_relation("bad", SCHEMA)
    eng.append("good", ups([(1, "a", 1, 1)]))
    eng.seal("good", 1)
    passes = eng.scheduler.passes
    eng.wal.finish_segment()  # good's first records in a segment of their own: trimmable
    assert eng.scheduler.wait_passes(passes + 1, 60)  # the pass the finished segment wakes, done
    bad_lsn = eng.wal.end_lsn
    eng.append("bad", ups([(1, "x", 1, BIG)]))
    eng.append("bad", ups([(1, "x", 1, BIG), (2, "y", 1, 1)]))
    eng.seal("bad", 1)
    before = observe(eng, ("good",))
    with pytest.raises(errors.DiffOverflow) as err:
        eng.snapshot("bad", 1)
    assert err.value.relation == "bad" and "'x'" in err.value.row and "'bad'" in _one_line(err.value)
    assert observe(eng, ("good",)) == before
    eng.append("good", ups([(2, "b", 2, 1)]))
    eng.seal("good", 2)
    for attempt in range(2):
        with pytest.raises(errors.CompactionFailed) as err:
            eng.compact()
        assert list(err.value.failures) == ["bad"] and "DiffOverflow" in err.value.failures["bad"]
        assert "'bad'" in _one_line(err.value)
        good, bad = eng.trace_info("good"), eng.trace_info("bad")
        assert good["tail_records"] == 0 and good["upper"] == 3 + attempt and good["compaction_failures"] == 0
        assert bad["tail_records"] == 2 and bad["batches"] == 0 and bad["compaction_failures"] >= attempt + 1
        assert set(eng.compaction_errors()) == {"bad"}
        assert 0 < eng.wal.start_lsn <= bad_lsn  # good's first segment went; bad's records stayed
        assert rows(eng.snapshot("good", 2 + attempt))[: 2] == [(1, "a", 1), (2, "b", 1)]
        eng.append("good", ups([(3 + attempt, "c", 3 + attempt, 1)]))
        eng.seal("good", 3 + attempt)
    assert any("'bad'" in r.getMessage() and "DiffOverflow" in r.getMessage() for r in caplog.records)
    eng.close()
    eng = open_engine(compact_interval=None)  # nothing of bad was lost meanwhile
    with pytest.raises(errors.DiffOverflow):
        eng.snapshot("bad", 1)
    eng.append("bad", ups([(1, "x", 2, -BIG)]))  # the compensating diff
    eng.seal("bad", 2)
    eng.set_since("bad", 2)
    eng.compact()
    assert eng.compaction_errors() == {}
    assert eng.trace_info("bad")["tail_records"] == 0 and eng.trace_info("bad")["compaction_failures"] == 0
    assert rows(eng.snapshot("bad", 2)) == [(1, "x", BIG), (2, "y", 1)]
    assert eng.wal.start_lsn > bad_lsn


@pytest.mark.embedded_only
@file_only
def test_unreadable_pending_batch_fails_one_relation_only(open_engine, tmp_path):
    eng = open_engine(compact_interval=None)
    eng.add_relation("good", SCHEMA)
    eng.add_relation("bad", SCHEMA)
    eng.append("bad", ups([(1, "x", 5, 1)]))  # above the seal: becomes a pending batch
    eng.seal("bad", 1)
    eng.compact()
    pending = eng.view.relations["bad"].trace.pending[0].key
    path = tmp_path / "data" / "blobs" / pending
    aside = tmp_path / "aside"
    os.rename(path, aside)
    bad_lsn = eng.wal.end_lsn
    eng.append("bad", ups([(2, "y", 6, 1)]))
    eng.seal("bad", 6)
    eng.append("good", ups([(1, "a", 1, 1)]))
    eng.seal("good", 1)
    with pytest.raises(errors.CompactionFailed) as err:
        eng.compact()
    assert list(err.value.failures) == ["bad"] and "BatchCorruption" in err.value.failures["bad"]
    assert pending in err.value.failures["bad"]
    assert eng.trace_info("good")["tail_records"] == 0 and eng.trace_info("good")["batches"] == 1
    assert eng.trace_info("bad")["tail_records"] == 1 and eng.trace_info("bad")["compaction_failures"] >= 1
    assert eng.wal.start_lsn <= bad_lsn
    os.rename(aside, path)  # the blob is back: the next pass compacts it
    eng.compact()
    assert eng.compaction_errors() == {} and eng.trace_info("bad")["tail_records"] == 0
    assert rows(eng.snapshot("bad", 6)) == [(1, "x", 1), (2, "y", 1)]
    assert eng.wal.start_lsn > bad_lsn


# --- checked diff sums ------------------------------------------------------------------------

EXTREMES = [-(2**63), -(2**63) + 1, -BIG, -1, 0, 1, BIG, 2**63 - 1]


def _model(updates: list[tuple[int, int, int]]) -> dict[tuple[int, int], int]:
    out: dict[tuple[int, int], int] = {}
    for k, t, d in updates:
        out[(k, t)] = out.get((k, t), 0) + d
    return out


def _table(updates: list[tuple[int, int, int]]) -> pa.Table:
    ks, ts, ds = zip(*updates, strict=True)
    return pa.table({"k": pa.array(ks, pa.int64()), "time": pa.array(ts, pa.int64()),
                     "diff": pa.array(ds, pa.int64())})


def test_consolidate_sums_are_exact_or_diff_overflow_against_a_model():
    """Random updates with extreme diffs: consolidate (and snapshot, and the streamed merge)
    give exactly the model's sums, or DiffOverflow exactly when some sum leaves int64."""
    rng = random.Random(12)
    overflowed = exact_big = 0
    for _ in range(600):
        n = rng.randint(1, 10)
        updates = [(rng.randint(0, 2), rng.randint(0, 1),
                    rng.choice(EXTREMES) if rng.random() < 0.6 else rng.randint(-(2**40), 2**40)) for _ in range(n)]
        model = _model(updates)
        want = {k: v for k, v in model.items() if v}
        if any(not -(2**63) <= v < 2**63 for v in model.values()):
            overflowed += 1
            with pytest.raises(errors.DiffOverflow) as err:
                consolidate(_table(updates), ["k"])
            assert "outside int64" in _one_line(err.value) and "'k'" in err.value.row
            inputs = [[_table([u])] for u in updates]  # one update per input: none overflows alone
            with pytest.raises(errors.DiffOverflow):
                list(merge_sorted(inputs, ["k"], chunk_rows=2))
            continue
        exact_big += any(abs(v) > 2**62 for v in want.values())
        got = {(r["k"], r["time"]): r["diff"] for r in consolidate(_table(updates), ["k"]).to_pylist()}
        assert got == want, updates
        merged = [r for c in merge_sorted([[_table([u])] for u in updates], ["k"], chunk_rows=3) for r in c.to_pylist()]
        assert {(r["k"], r["time"]): r["diff"] for r in merged} == want
        totals: dict[int, int] = {}
        for (k, _t), v in model.items():
            totals[k] = totals.get(k, 0) + v
        if all(-(2**63) <= v < 2**63 for v in totals.values()):
            snap = snapshot(_table(updates), ["k"], 1)
            assert {r["k"]: r["diff"] for r in snap.to_pylist()} == {k: v for k, v in totals.items() if v}
    assert overflowed > 40 and exact_big > 5  # both paths were really exercised


def test_two_diffs_of_2_62_do_not_wrap_to_minus_2_63():
    table = _table([(7, 3, BIG), (7, 3, BIG)])
    with pytest.raises(errors.DiffOverflow, match="9223372036854775808"):
        consolidate(table, ["k"])
    assert consolidate(_table([(7, 3, BIG), (7, 3, BIG - 1), (7, 3, -BIG)]), ["k"]).to_pylist() == \
        [{"k": 7, "time": 3, "diff": BIG - 1}]


@file_only
def test_snapshot_overflow_is_typed_over_the_wire_and_changes_nothing(open_engine, tmp_path, access):
    eng = open_engine(compact_interval=None)
    eng.add_relation("orders", SCHEMA)
    eng.append("orders", ups([(1, "a", 1, BIG), (1, "a", 1, BIG), (2, "b", 1, 1)]))
    eng.seal("orders", 1)
    before = (eng.relations(), eng.sealed("orders"), eng.trace_info("orders"))
    digest = dir_digest(tmp_path / "data")
    with pytest.raises(errors.DiffOverflow) as err:
        eng.snapshot("orders", 1)
    assert isinstance(err.value, OverflowError) and err.value.relation == "orders"
    assert "'a'" in err.value.row and "relation 'orders'" in _one_line(err.value)
    assert (eng.relations(), eng.sealed("orders"), eng.trace_info("orders")) == before
    assert dir_digest(tmp_path / "data") == digest


# --- the CLI's --schema --------------------------------------------------------------------------

BAD_SPECS = {
    "trailing comma": ("id:int64,", "field 2"),
    "empty field": ("id:int64,,name:string", "field 2"),
    "leading comma": (",id:int64", "field 1"),
    "no name": (":int64", "NAME:TYPE"),
    "no type": ("id:", "NAME:TYPE"),
    "no colon": ("id", "NAME:TYPE"),
    "blank": ("  ", "empty schema"),
    "only commas": (",,", "field 1"),
    "duplicate": ("id:int64,id:string", "duplicate"),
    "duplicate spaced": ("id:int64, id :string", "duplicate"),
    "unknown type": ("id:int65", "unknown type 'int65'"),
    "nested type": ("id:list<int64>", "unknown type"),
    "reserved": ("time:int64", "reserved"),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_cli_refuses_malformed_schema_with_exit_2_and_creates_nothing(tmp_path, capsys, case):
    spec, words = BAD_SPECS[case]
    fresh = tmp_path / "fresh"
    assert cli_main(["--data-dir", str(fresh), "relation", "add", "t", "--schema", spec]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("sediment: error: --schema: ") and words in err, err
    assert not fresh.exists()
    existing = tmp_path / "existing"
    assert cli_main(["--data-dir", str(existing), "relation", "add", "orders", "--schema", "id:int64"]) == 0
    capsys.readouterr()
    digest = dir_digest(existing)
    assert cli_main(["--data-dir", str(existing), "relation", "add", "t", "--schema", spec]) == 2
    assert dir_digest(existing) == digest
    assert cli_main(["--data-dir", str(existing), "relation", "list"]) == 0
    assert capsys.readouterr().out.split("\t")[0] == "orders"


def test_cli_accepts_well_formed_schema_with_spaces(tmp_path, capsys):
    d = str(tmp_path / "d")
    assert cli_main(["--data-dir", d, "relation", "add", "t", "--schema", " id : int64 , name:STRING "]) == 0
    capsys.readouterr()
    with sediment.open(d, compact_interval=None) as eng:
        assert eng.schema("t") == pa.schema([("id", pa.int64()), ("name", pa.string())])


NAME_CALLS = {
    "drop_relation": lambda e, n: e.drop_relation(n),
    "append": lambda e, n: e.append(n, ups([(1, "a", 9, 1)])),
    "append_many": lambda e, n: e.append_many({n: ups([(1, "a", 9, 1)])}),
    "seal": lambda e, n: e.seal(n, 9),
    "set_since": lambda e, n: e.set_since(n, 5),
    "snapshot": lambda e, n: e.snapshot(n, 5),
    "subscribe": lambda e, n: e.subscribe(n),
    "plan_read": lambda e, n: e.plan_read(n, 5),
    "replay": lambda e, n: list(e.replay(n)),
    "trace_info": lambda e, n: e.trace_info(n),
    "compact": lambda e, n: e.compact(n),
    "schema": lambda e, n: e.schema(n),
    "since": lambda e, n: e.since(n),
    "sealed": lambda e, n: e.sealed(n),
    "transaction append": lambda e, n: e.transaction().append(n, ups([(1, "a", 9, 1)])),
}


@file_only
@pytest.mark.parametrize("call", sorted(NAME_CALLS))
def test_bad_relation_names_are_typed_and_change_nothing(seeded, tmp_path, access, call):
    eng = seeded
    before = observe(eng)
    digest = dir_digest(tmp_path / "data")
    for bad in [5, "", "../etc", "a/b", "x" * 200, ("orders",)] + ([] if call == "compact" else [None]):
        with pytest.raises(errors.InvalidRelationName) as err:
            NAME_CALLS[call](eng, bad)
        assert isinstance(err.value, ValueError) and "invalid relation name" in _one_line(err.value)
    with pytest.raises(errors.UnknownRelation, match="'nope'"):
        NAME_CALLS[call](eng, "nope")
    assert observe(eng) == before
    assert dir_digest(tmp_path / "data") == digest


BAD_LOCKS = {
    "high_water str": lambda: sediment.Locks(high_water="7", write=[("orders", 1)]),
    "high_water None": lambda: sediment.Locks(high_water=None, write=[("orders", 1)]),
    "high_water bool": lambda: sediment.Locks(high_water=True),
    "high_water below -1": lambda: sediment.Locks(high_water=-2),
    "one flat pair": lambda: sediment.Locks(high_water=7, write=("orders", 1)),
    "a name alone": lambda: sediment.Locks(high_water=7, read=["orders"]),
    "a triple": lambda: sediment.Locks(high_water=7, append=[("orders", 1, 2)]),
    "a name not str": lambda: sediment.Locks(high_water=7, write=[(1, 1)]),
    "a plain dict": lambda: {"high_water": 7, "write": [("orders", 1)]},
}


@file_only
@pytest.mark.parametrize("case", sorted(BAD_LOCKS))
def test_malformed_locks_are_invalid_argument_and_change_nothing(seeded, tmp_path, access, case):
    """A lock request the engine cannot check was a TypeError or ValueError from inside the lock
    table (an AttributeError on the client): it is refused in one typed line, nothing written."""
    eng = seeded
    before = observe(eng)
    digest = dir_digest(tmp_path / "data")
    for call in (lambda locks: eng.append("orders", ups([(3, "c", 8, 1)]), locks=locks),
                 lambda locks: eng.append_many({"orders": ups([(3, "c", 8, 1)])}, locks=locks)):
        with pytest.raises(errors.InvalidArgument) as err:
            call(BAD_LOCKS[case]())
        assert "lock" in _one_line(err.value).lower()
    assert observe(eng) == before
    assert dir_digest(tmp_path / "data") == digest
    eng.append("orders", ups([(3, "c", 8, 1)]), locks=sediment.Locks(high_water=-1, write=[["orders", 3]]))
    eng.seal("orders", 8)
    assert (3, "c", 1) in rows(eng.snapshot("orders", 8))


@file_only
def test_a_partition_outside_a_cluster_is_invalid_argument_and_changes_nothing(seeded, tmp_path, access):
    """``partition=`` is a cluster's; a single engine took it as a TypeError (across the wire too)."""
    eng = seeded
    before = observe(eng)
    digest = dir_digest(tmp_path / "data")
    for partition in (0, 3):
        with pytest.raises(errors.InvalidArgument, match="cluster") as err:
            eng.add_relation("placed", SCHEMA, partition=partition)
        _one_line(err.value)
    assert observe(eng) == before and "placed" not in eng.relations()
    assert dir_digest(tmp_path / "data") == digest
    eng.add_relation("placed", SCHEMA, partition=None)
    assert "placed" in eng.relations()


@file_only
def test_compaction_failure_is_typed_over_the_wire(open_engine, access):
    eng = open_engine(compact_interval=None)
    eng.add_relation("good", SCHEMA)
    eng.add_relation("bad", SCHEMA)
    eng.append("bad", ups([(1, "x", 1, BIG), (1, "x", 1, BIG)]))
    eng.append("good", ups([(1, "a", 1, 1)]))
    eng.seal("bad", 1)
    eng.seal("good", 1)
    with pytest.raises(errors.CompactionFailed) as err:
        eng.compact()
    assert set(err.value.failures) == {"bad"} and "DiffOverflow" in err.value.failures["bad"]
    assert set(eng.compaction_errors()) == {"bad"}
    assert eng.trace_info("good")["tail_records"] == 0 and eng.trace_info("good")["batches"] == 1
    assert eng.trace_info("bad")["tail_records"] == 1 and eng.trace_info("bad")["compaction_failures"] >= 1
    eng.compact("good")  # the failed relation is not in this pass: nothing to report
    assert rows(eng.snapshot("good", 1)) == [(1, "a", 1)]


def _spec_model(spec: str) -> list[tuple[str, str]] | None:
    """The reference reading of a --schema spec: NAME:TYPE fields separated by commas,
    nothing empty, known types, unique and unreserved names; None when malformed."""
    fields = []
    for part in spec.split(","):
        if part.count(":") != 1:
            return None
        name, type_name = (s.strip() for s in part.split(":"))
        if not name or type_name.lower() not in ("int64", "string"):
            return None
        fields.append((name, type_name.lower()))
    names = [n for n, _t in fields]
    if len(set(names)) != len(names) or {"time", "diff"} & set(names):
        return None
    return fields


def test_schema_spec_parser_against_a_model_exhaustively():
    import itertools

    from sediment.engine.schema_text import parse_schema_spec

    tokens = ["id", "time", ":", ",", " ", "int64", "String", "int65"]
    checked = accepted = 0
    for length in range(1, 6):
        for combo in itertools.product(tokens, repeat=length):
            spec = "".join(combo)
            want = _spec_model(spec)
            checked += 1
            try:
                got = parse_schema_spec(spec)
            except errors.SchemaMismatch as exc:
                assert want is None, spec
                _one_line(exc)
                continue
            accepted += 1
            assert want is not None, spec
            assert [(f.name, str(f.type)) for f in got] == [(n, "int64" if t == "int64" else "string")
                                                             for n, t in want], spec
    assert checked > 30000 and accepted > 50


@pytest.mark.parametrize("spec", [
    "a:decimal(\u00b2,1)",  # a digit to str.isdigit that int() refuses
    "a:fixed_size_binary[\u00b3]",
    "a:fixed_size_binary[2147483648]",  # past Arrow's int32 width
    "a:fixed_size_binary[99999999999999999999]",
    '"a\\ud800":int64',  # a JSON-quoted name with a lone surrogate: not storable as UTF-8
])
def test_schema_specs_that_python_refused_untyped_are_schema_mismatch(spec):
    from sediment.engine.schema_text import parse_schema_spec

    with pytest.raises(errors.SchemaMismatch) as got:
        parse_schema_spec(spec)
    _one_line(got.value)


def test_the_widest_fixed_size_binary_is_accepted():
    from sediment.engine.schema_text import parse_schema_spec

    assert parse_schema_spec("a:fixed_size_binary[2147483647]").field("a").type == pa.binary(2147483647)


def test_a_timestamp_with_an_unknown_time_zone_is_refused_with_nothing_changed(open_engine):
    """As the text grammar refuses it: stored, such a column could not be read back."""
    eng = open_engine(compact_interval=None)
    bad = pa.field("at", pa.timestamp("us", tz="Not/AZone"))
    with pytest.raises(errors.SchemaMismatch, match="unknown time zone 'Not/AZone'"):
        eng.add_relation("r", pa.schema([bad]))
    assert eng.relations() == []
    eng.add_relation("r", pa.schema([("k", pa.int64()), ("t", pa.timestamp("us", tz="Europe/Paris")),
                                     ("u", pa.timestamp("ms", tz="+05:30"))]))
    with pytest.raises(errors.SchemaChangeRefused):
        eng.alter_relation("r", add=[bad])
    assert eng.schema_version("r") == 0 and eng.schema("r").names == ["k", "t", "u"]


def test_cli_refuses_an_empty_data_dir_and_creates_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli_main(["--data-dir", "", "relation", "add", "t", "--schema", "id:int64"]) == 2
    assert "--data-dir is empty" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [], "an empty --data-dir made the working directory a data directory"


@file_only
def test_include_internal_must_be_a_bool_and_a_schema_mismatch_names_only_what_is_wrong(seeded, tmp_path, access):
    """``include_internal="yes"`` was taken as true (across the wire too); a mismatch said
    "missing []" beside the one column that was wrong."""
    eng = seeded
    before = observe(eng)
    for call in (eng.stats, eng.relations):
        with pytest.raises(errors.InvalidArgument, match="include_internal must be True or False") as err:
            call(include_internal="yes")
        _one_line(err.value)
    extra = ups([(3, "c", 8, 1)]).append_column("zz", pa.array([1], pa.int64()))
    with pytest.raises(errors.SchemaMismatch) as err:
        eng.append("orders", extra)
    assert "unexpected ['zz']" in _one_line(err.value) and "missing" not in str(err.value)
    assert observe(eng) == before
    assert eng.relations(include_internal=False) == ["orders"]
