"""The compacter: WAL to batches, pending updates, since consolidation, merges, trims, crashes."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

from sediment import errors
from sediment.clock import ManualClock

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])


def ups(rows):
    ks, vs, ts, ds = zip(*rows, strict=True)
    return pa.table({"k": pa.array(ks, pa.int64()), "v": pa.array(vs, pa.string()),
                     "time": pa.array(ts, pa.int64()), "diff": pa.array(ds, pa.int64())})


def rows(table):
    return [tuple(r.values()) for r in table.to_pylist()]


def segments(data_dir):
    d = os.path.join(data_dir, "wal", "0")
    return sorted(n for n in os.listdir(d) if n.endswith(".seg"))


def save_wal(data, to):
    """Copy whatever holds the WAL (segment directory or device ring) aside."""
    if os.path.isdir(os.path.join(data, "wal", "0")):
        shutil.copytree(os.path.join(data, "wal"), str(to))
    else:
        shutil.copyfile(data + ".ring", str(to))


def restore_wal(data, saved):
    if os.path.isdir(saved):
        shutil.rmtree(os.path.join(data, "wal"))
        shutil.copytree(str(saved), os.path.join(data, "wal"))
    else:
        shutil.copyfile(str(saved), data + ".ring")


def blob_keys(engine):
    return engine.storage.blobs.list("")


@pytest.fixture
def eng(open_engine):
    e = open_engine(clock=ManualClock(), segment_bytes=1 << 14)  # background passes on finished segments only
    e.add_relation("r", SCHEMA)
    return e


@pytest.mark.embedded_only  # eng.view.relations
def test_compaction_moves_the_wal_into_batches_and_trims_it(eng, open_engine, tmp_path):
    data = str(tmp_path / "data")
    for t in range(1, 30):
        eng.append("r", ups([(t % 7, "x" * 900, t, 1), (t % 5, "y", t, 1)]))
        eng.seal("r", t)
    before = {t: rows(eng.snapshot("r", t)) for t in (1, 10, 29)}
    start = eng.wal.start_lsn
    eng.compact()
    assert eng.wal.start_lsn > start, "the compacted WAL was trimmed"
    if os.path.isdir(os.path.join(data, "wal", "0")):
        assert len(segments(data)) == 1, "every finished segment was compacted and trimmed"
    trace = eng.view.relations["r"].trace
    assert trace.upper == 30 and trace.batches and not eng.view.relations["r"].tail
    assert {t: rows(eng.snapshot("r", t)) for t in (1, 10, 29)} == before
    eng.close()
    again = open_engine(clock=ManualClock(), segment_bytes=1 << 14)
    assert again.sealed("r") == 29
    assert {t: rows(again.snapshot("r", t)) for t in (1, 10, 29)} == before


@pytest.mark.embedded_only  # eng.view.relations
def test_updates_at_unsealed_times_wait_in_pending_until_sealed(eng, open_engine):
    eng.append("r", ups([(1, "now", 1, 1), (2, "later", 10, 1), (3, "later", 12, 1)]))
    eng.seal("r", 2)
    eng.compact()
    trace = eng.view.relations["r"].trace
    assert trace.upper == 3 and len(trace.pending) == 1
    assert (trace.pending[0].lower, trace.pending[0].upper) == (10, 13)
    assert rows(eng.snapshot("r", 2)) == [(1, "now", 1)]
    eng.seal("r", 10)
    eng.compact()
    trace = eng.view.relations["r"].trace
    assert trace.upper == 11 and len(trace.pending) == 1 and trace.pending[0].lower == 12
    assert rows(eng.snapshot("r", 10)) == [(1, "now", 1), (2, "later", 1)]
    eng.seal("r", 12)
    eng.compact()
    assert not eng.view.relations["r"].trace.pending
    assert rows(eng.snapshot("r", 12)) == [(1, "now", 1), (2, "later", 1), (3, "later", 1)]
    assert sorted(rows(pa.Table.from_batches(list(eng.replay("r"))))) == [
        (1, "now", 1, 1), (2, "later", 10, 1), (3, "later", 12, 1)]


def test_since_consolidates_history_away(eng):
    for t in range(1, 41):
        eng.append("r", ups([(1, "hot", t, 1 if t % 2 else -1), (2, "cold", t, 1)]))
    eng.seal("r", 40)
    eng.set_since("r", 40)
    eng.compact()
    stored = pa.Table.from_batches(list(eng.replay("r")))
    assert rows(stored) == [(2, "cold", 40, 40)]
    assert rows(eng.snapshot("r", 40)) == [(2, "cold", 40)]


@pytest.mark.embedded_only  # eng.view.relations
def test_merges_keep_the_batch_count_logarithmic(eng):
    for t in range(1, 65):
        eng.append("r", ups([(t, "v" * 20, t, 1)]))
        eng.seal("r", t)
        eng.compact()
    batches = eng.view.relations["r"].trace.batches
    assert len(batches) <= 8, [b.rows for b in batches]
    assert sum(b.rows for b in batches) == 64
    assert rows(eng.snapshot("r", 64)) == [(t, "v" * 20, 1) for t in range(1, 65)]


@pytest.mark.embedded_only  # eng.view.relations
def test_open_transaction_holds_back_the_cut(eng):
    tx = eng.transaction()
    tx.append("r", ups([(9, "tx", 5, 1)]))
    eng.append("r", ups([(1, "a", 1, 1)]))
    eng.seal("r", 1)
    eng.compact()
    assert eng.view.relations["r"].tail, "records after an open BEGIN stay in the WAL"
    tx.commit()
    eng.seal("r", 5)
    eng.compact()
    assert not eng.view.relations["r"].tail
    assert rows(eng.snapshot("r", 5)) == [(1, "a", 1), (9, "tx", 1)]


@pytest.mark.embedded_only  # eng.wal
def test_crash_after_commit_before_trim_counts_nothing_twice(open_engine, tmp_path):
    """The compactions here are the test's own (``compact()``): a background one would trim
    the log this test restores before it is saved."""
    data = str(tmp_path / "data")
    eng = open_engine(compact=False, segment_bytes=1 << 14)
    eng.add_relation("r", SCHEMA)
    for t in range(1, 20):
        eng.append("r", ups([(t % 3, "x", t, 1)]))
    eng.seal("r", 19)
    expected = rows(eng.snapshot("r", 19))
    eng.wal.finish_segment()
    eng.close()
    save_wal(data, tmp_path / "wal-before")
    eng = open_engine(compact=False, segment_bytes=1 << 14)
    eng.compact()
    eng.close()
    restore_wal(data, tmp_path / "wal-before")  # the trim never happened
    again = open_engine(compact=False, segment_bytes=1 << 14)
    assert rows(again.snapshot("r", 19)) == expected
    again.compact()
    assert rows(again.snapshot("r", 19)) == expected


@pytest.mark.embedded_only  # eng.storage.blobs, eng.swept
def test_orphan_batches_from_a_crash_before_commit_are_swept(eng, open_engine):
    eng.append("r", ups([(1, "a", 1, 1)]))
    eng.seal("r", 1)
    eng.compact()
    kept = blob_keys(eng)
    mine = f"trace/{999:016x}/{0:016x}-{5:016x}-{eng.traces.owner_tag}abc.parquet"
    eng.storage.blobs.put(mine, b"half a batch")
    foreign = f"trace/{999:016x}/{0:016x}-{5:016x}-abc.parquet"  # another writer's: never swept
    eng.storage.blobs.put(foreign, b"someone else's")
    eng.close()
    again = open_engine(clock=ManualClock(), segment_bytes=1 << 14)
    assert blob_keys(again) == sorted([*kept, foreign])
    assert again.swept == [mine] and rows(again.snapshot("r", 1)) == [(1, "a", 1)]


@pytest.mark.embedded_only  # eng.view.relations, eng.storage.blobs
def test_missing_or_damaged_batch_is_reported_with_its_key(eng):
    eng.append("r", ups([(1, "a", 1, 1)]))
    eng.seal("r", 1)
    eng.compact()
    (key,) = [b.key for b in eng.view.relations["r"].trace.batches if b.key]
    data = bytearray(eng.storage.blobs.get(key))
    data[8:12] = b"\x00\x01\x02\x03"
    eng.storage.blobs.put(key, bytes(data))
    with pytest.raises(errors.BatchCorruption) as err:
        eng.snapshot("r", 1)
    assert key in str(err.value)
    eng.storage.blobs.delete(key)
    with pytest.raises(errors.BatchCorruption) as err:
        eng.snapshot("r", 1)
    assert key in str(err.value)


@pytest.mark.embedded_only  # eng.storage.blobs, eng.storage.meta
def test_drop_relation_removes_its_trace(eng):
    eng.append("r", ups([(1, "a", 1, 1)]))
    eng.seal("r", 1)
    eng.compact()
    assert blob_keys(eng)
    eng.drop_relation("r")
    assert blob_keys(eng) == ["sediment-owner"]  # only the prefix's owner marker is left
    assert eng.storage.meta.list("trace/") == []


@pytest.mark.embedded_only  # eng.scheduler, eng.view.relations
def test_background_compacter_wakes_on_finished_segments(open_engine):
    eng = open_engine(segment_bytes=1 << 13, compact_interval=None)
    eng.add_relation("r", SCHEMA)
    for t in range(1, 40):
        eng.append("r", ups([(t, "z" * 100, t, 1)]))
        eng.seal("r", t)
    eng.scheduler.stop()  # finishes the pass under way
    assert eng.scheduler.passes >= 1 and eng.scheduler.last_error is None
    assert eng.view.relations["r"].trace.batches
    assert rows(eng.snapshot("r", 39)) == [(t, "z" * 100, 1) for t in range(1, 40)]


CRASHER = textwrap.dedent("""
    import json, sys, pyarrow as pa, sediment
    eng = sediment.open(sys.argv[1], segment_bytes=1 << 13, compact_interval=0.01, **json.loads(sys.argv[2]))
    if "r" not in eng.relations():
        eng.add_relation("r", pa.schema([("k", pa.int64())]))
    stored = [b.column("time") for b in eng.replay("r")]  # an append may be durable without its seal
    t = max([1, eng.sealed("r") + 1] + [max(c.to_pylist()) + 1 for c in stored if len(c)])
    while True:
        eng.append("r", pa.table({"k": [t % 13, t % 7], "time": [t, t], "diff": [1, 1]}))
        eng.seal("r", t)
        if t % 5 == 0:
            eng.set_since("r", t - 3)
        if t % 9 == 0:
            eng.compact()
        print(t, flush=True)
        t += 1
""")


def model(upto):
    acc = {}
    for t in range(1, upto + 1):
        for k in (t % 13, t % 7):
            acc[k] = acc.get(k, 0) + 1
    return sorted(acc.items())


@pytest.mark.parametrize("seed", range(4))
def test_sigkill_during_compaction_loses_nothing(open_engine, engine_options, tmp_path, seed):
    data = str(tmp_path / "data")
    rnd = random.Random(seed)
    acked = 0
    for _round in range(3):
        proc = subprocess.Popen([sys.executable, "-c", CRASHER, data, json.dumps(engine_options(str(data)))],
                                stdout=subprocess.PIPE, text=True)
        stop_after = rnd.randint(20, 120)
        try:
            for n, line in enumerate(proc.stdout):
                acked = max(acked, int(line))
                if n >= stop_after:
                    break
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
    eng = open_engine(data, segment_bytes=1 << 13, compact=False)
    sealed = eng.sealed("r")
    assert sealed >= acked
    assert [tuple(r.values()) for r in eng.snapshot("r", sealed).to_pylist()] == model(sealed)
    eng.compact()
    assert [tuple(r.values()) for r in eng.snapshot("r", sealed).to_pylist()] == model(sealed)


def test_cli_compact_then_verify_names_a_damaged_or_missing_batch(tmp_path, capsys):
    from sediment.cli import main

    data = str(tmp_path / "cli")
    csv = tmp_path / "u.csv"
    csv.write_text("k,v,time,diff\n1,a,1,1\n2,b,2,1\n")
    assert main(["--data-dir", data, "relation", "add", "r", "--schema", "k:int64,v:string"]) == 0
    assert main(["--data-dir", data, "append", "r", str(csv)]) == 0
    assert main(["--data-dir", data, "seal", "r", "2"]) == 0
    assert main(["--data-dir", data, "compact"]) == 0
    assert "compacted r: 1 batch, 2 rows, upper 3" in capsys.readouterr().out
    assert main(["--data-dir", data, "verify"]) == 0
    blobs = os.path.join(data, "blobs")
    (key,) = [os.path.relpath(os.path.join(b, f), blobs) for b, _d, fs in os.walk(blobs) for f in fs
              if f != "sediment-owner"]
    path = os.path.join(blobs, key)
    raw = bytearray(open(path, "rb").read())
    raw[len(raw) // 3] ^= 0xFF
    open(path, "wb").write(bytes(raw))
    capsys.readouterr()
    assert main(["--data-dir", data, "verify"]) == 1
    assert key in capsys.readouterr().out
    os.unlink(path)
    assert main(["--data-dir", data, "verify"]) == 1
    out = capsys.readouterr().out
    assert key in out and "missing" in out


@pytest.mark.embedded_only  # eng.view.relations, eng.storage.blobs
def test_read_plan_reproduces_the_snapshot_and_pins_its_batches(eng):
    from sediment.blob.uri import open_blob_store
    from sediment.trace.consolidate import changes, snapshot
    from sediment.trace.state import BatchRef
    from sediment.trace.store import TraceStore

    for t in range(1, 9):
        eng.append("r", ups([(t % 3, "a", t, 1), (t % 2, "b", t, -1 if t % 4 == 0 else 1)]))
        eng.seal("r", t)
        if t in (3, 6):
            eng.compact()
    plan = eng.plan_read("r", 7)
    store = TraceStore(None, open_blob_store(plan.blob_uri, s3_endpoint=plan.s3_endpoint)
                       if plan.blob_uri.startswith("s3://") else open_blob_store(plan.blob_uri))
    parts = [t for ref in plan.batches for t in store.read_stream(plan.relation_id, BatchRef(**ref))]
    everything = pa.concat_tables([*parts, plan.tail.select(parts[0].column_names)])
    assert rows(snapshot(everything, plan.key_columns, 7)) == rows(eng.snapshot("r", 7))
    keys = {ref["key"] for ref in plan.batches}
    for t in range(9, 40):  # enough compactions to merge (and replace) the planned batches
        eng.append("r", ups([(t, "c", t, 1)]))
        eng.seal("r", t)
        eng.compact()
    current = {b.key for b in eng.view.relations["r"].trace.batches}
    assert keys - current, "the planned batches were merged away"
    assert all(k in eng.storage.blobs.list("trace/") for k in keys), "a leased batch was deleted"
    eng.release_read(plan.lease)
    assert not (keys - current) & set(eng.storage.blobs.list("trace/"))
    delta = eng.plan_read("r", 8, from_t=6)
    got = [t for ref in delta.batches for t in store.read_stream(delta.relation_id, BatchRef(**ref))]
    table = pa.concat_tables([*got, delta.tail.select(got[0].column_names)]) if got else delta.tail
    assert rows(changes(table, delta.key_columns, 6, 8)) == [(0, "b", 8, -1), (1, "a", 7, 1), (1, "b", 7, 1), (2, "a", 8, 1)]
    eng.release_read(delta.lease)


@pytest.mark.embedded_only
def test_unordered_replay_holds_the_same_updates(eng):
    for t in range(1, 30):
        eng.append("r", ups([(t % 4, "u", t, 1), (t % 3, "w", 31 - t, 1)]))
    eng.seal("r", 15)
    eng.compact()
    ordered = rows(pa.Table.from_batches(list(eng.replay("r"))))
    unordered = rows(pa.Table.from_batches(list(eng.replay("r", ordered=False))))
    assert sorted(ordered) == sorted(unordered)
    assert [r[2] for r in ordered] == sorted(r[2] for r in ordered)


def test_compaction_component_on_its_own_seam(tmp_path):
    """The compaction component built from its parts, with no engine: records the log made
    durable (applied to the relation view by ``on_durable``) are taken into the trace by
    ``run_pass``, the log is trimmed below them, and the replaced blobs are collected."""
    import threading

    from sediment.blob.memory import MemoryBlobStore
    from sediment.clock import ManualClock
    from sediment.engine.backlog import BodyCache, WalBacklog
    from sediment.engine.catalog import Catalog
    from sediment.engine.collector import Collector, ReaderPins
    from sediment.engine.compaction import Compaction, CompactionSettings
    from sediment.engine.relation_registry import RelationRegistry
    from sediment.engine.view import RelationView
    from sediment.metadata.memory import MemoryMetadataStore
    from sediment.metrics import EngineMetrics
    from sediment.trace.store import TraceStore
    from sediment.wal.file_log import FileLog
    from sediment.wal.record import Record, RecordKind

    lock, clock, meta, metrics = threading.RLock(), ManualClock(), MemoryMetadataStore(), EngineMetrics()
    view = RelationView(str(tmp_path), lock, WalBacklog(lock, None, 1.0), BodyCache(1 << 20))
    traces = TraceStore(meta, MemoryBlobStore())
    catalog = Catalog(meta)
    rel = RelationRegistry(view, catalog, traces, meta, metrics).register(catalog.create("r", SCHEMA))
    log = FileLog.open(str(tmp_path / "wal"), create=True, segment_bytes=1 << 14)
    try:
        collector = Collector(lock, ReaderPins(clock), traces, log)
        compaction = Compaction(view, traces, log, collector, metrics, clock, CompactionSettings(), 0.0)
        for t in range(3):
            batch = ups([(t, f"v{t}", t, 1)]).to_batches()[0]
            log.submit([Record(RecordKind.UPDATES, rel.entry.id, 0, t, t, 1, batch.serialize())],
                       view.on_durable).wait()
        log.submit([Record(RecordKind.PROGRESS, rel.entry.id, 0, 1, 1)], view.on_durable).wait()
        assert len(rel.tail) == 3 and view.backlog.bytes > 0
        log.finish_segment()
        assert compaction.run_pass() == {}
        assert rel.trace.upper == 2 and len(rel.trace.batches) == 1 and len(rel.trace.pending) == 1
        assert not rel.tail and view.backlog.bytes == 0 and compaction.compaction_errors() == {}
        assert log.start_lsn == rel.trace.wal_through, "the log is trimmed below what the trace holds"
        assert traces.load(rel.entry.id) == rel.trace, "the trace state is committed"
        log.submit([Record(RecordKind.PROGRESS, rel.entry.id, 0, 5, 5)], view.on_durable).wait()
        log.finish_segment()
        compaction.run_pass(full=True)
        assert rel.trace.upper == 6 and not rel.trace.pending and len(rel.trace.batches) == 1
        live = {b.key for b in rel.trace.batches}
        assert set(traces.blobs.list("trace/")) == live, "replaced blobs are collected"
    finally:
        log.close()
