"""A long-running engine keeps bounded state: what it holds for a relation goes with the
relation's drop, and a transaction whose object was dropped while open is aborted, so that
an engine that adds and drops relations and begins transactions for weeks does not keep
something of each (nor a WAL that can no longer be trimmed)."""

from __future__ import annotations

import gc
import threading
import weakref

import pyarrow as pa
from support.waiting import poll_until

import sediment
from sediment.clock import ManualClock
from sediment.engine import writer as writer_module
from sediment.engine.small_encode import SmallBodyEncoder
from sediment.wal.record import RecordKind, decode_frontiers

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


def rows(ids: list[int], t: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array([f"v{i}" for i in ids], pa.string()),
                     "time": pa.array([t] * len(ids), pa.int64()), "diff": pa.array([1] * len(ids), pa.int64())})


class _Recorded(SmallBodyEncoder):
    """The writer's small-body encoder, each one made also noted by a weak reference."""

    made: list[weakref.ref] = []

    def __init__(self, schema: pa.Schema) -> None:
        super().__init__(schema)
        _Recorded.made.append(weakref.ref(self))


def _concurrent_small_appends(engine, name: str) -> list[weakref.ref]:
    """Appends from several threads at once until the writer has made a small-body encoder for
    the relation (engine/small_encode.py: only used while appends overlap); weak references
    to the encoders made."""
    _Recorded.made = []
    stop = threading.Event()

    def work(w: int) -> None:
        t = 1
        while not stop.is_set():
            engine.append(name, rows([w], t))
            t += 1

    threads = [threading.Thread(target=work, args=(w,)) for w in range(6)]
    for th in threads:
        th.start()
    try:
        poll_until(lambda: _Recorded.made, 20, "a small-body encoder made by overlapping appends")
    finally:
        stop.set()
        for th in threads:
            th.join()
    assert _Recorded.made, "the concurrent small-append path never ran"
    return list(_Recorded.made)


def _last_frontiers(engine) -> dict[int, int]:
    """The FRONTIERS record the log writes at a segment boundary, one made now (after a seal of
    relation ``tick``, left out: the log finishes no segment that holds nothing new)."""
    if "tick" not in engine.relations():
        engine.add_relation("tick", SCHEMA)
    engine.seal("tick", engine.sealed("tick") + 1)
    engine.wal.finish_segment()
    found = [r for r in engine.wal.scan(engine.wal.finished_lsn) if r.kind == RecordKind.FRONTIERS]
    assert found[-1].lsn == engine.wal.finished_lsn
    tick = engine.view.relations["tick"].entry.id
    return {rel: t for rel, t in decode_frontiers(bytes(found[-1].body)).items() if rel != tick}


def _tracked(engine, rel_id: int) -> dict[str, bool]:
    """Which of the engine's per-relation structures hold something for ``rel_id``."""
    traces = engine.traces
    return {"trace versions": rel_id in traces._versions, "trace schemas": traces.schema_of(rel_id) is not None,
            "trace layouts": rel_id in traces._layouts, "trace accepted": rel_id in traces._accepted,
            "trace unresolved": rel_id in traces._unresolved, "frontiers record": rel_id in _last_frontiers(engine)}


def test_a_dropped_relation_leaves_nothing_behind(tmp_path, monkeypatch):
    """Each relation added and dropped (after appends, concurrent ones too, a seal, a
    subscription, a transaction and a compaction) leaves no entry under its id, and the
    objects made for it (its Relation, schema layout, small-body encoders) are freed."""
    monkeypatch.setattr(writer_module, "SmallBodyEncoder", _Recorded)
    with sediment.open(tmp_path / "d", clock=ManualClock(), compact_interval=None) as engine:
        engine.add_relation("kept", SCHEMA)
        engine.append("kept", rows([1], 1))
        engine.seal("kept", 1)
        kept_id = engine.view.relations["kept"].entry.id
        for i in range(5):
            name = f"r{i}"
            engine.add_relation(name, SCHEMA)
            rel = engine.view.relations[name]
            rel_id = rel.entry.id
            encoders = _concurrent_small_appends(engine, name)
            engine.seal(name, engine.sealed(name) + 1_000_000)
            with engine.subscribe(name) as feed:
                assert next(iter(feed)).kind == "snapshot"
            with engine.transaction() as tx:
                tx.append(name, rows([7], 2_000_000))
            del feed, tx  # a subscription kept (even closed) keeps its relation: these are not kept
            engine.compact(name)
            held = _tracked(engine, rel_id)
            assert all(v for k, v in held.items() if k != "trace unresolved"), held  # (only after a lost answer)
            made = [weakref.ref(rel), weakref.ref(rel.layout), *encoders]
            del rel
            engine.drop_relation(name)
            gc.collect()
            held = _tracked(engine, rel_id)
            assert not any(held.values()), held
            assert [r() for r in made if r() is not None] == []
        assert _tracked(engine, kept_id)["frontiers record"] and engine.snapshot("kept", 1).num_rows == 1


def test_the_frontiers_record_carries_live_relations_only(tmp_path):
    """The FRONTIERS record written at every segment boundary names the live relations only,
    also after an open that replays the PROGRESS records of relations dropped since."""
    with sediment.open(tmp_path / "d", clock=ManualClock()) as engine:
        engine.add_relation("pin", SCHEMA)
        pin = engine.transaction()  # left open: it holds the log's cut, so the reopen replays it all
        pin.append("pin", rows([1], 1))
        for i in range(6):
            engine.add_relation(f"r{i}", SCHEMA)
            engine.seal(f"r{i}", i + 1)
        ids = {f"r{i}": engine.view.relations[f"r{i}"].entry.id for i in range(6)}
        for i in (1, 3, 4):
            engine.drop_relation(f"r{i}")
        live = {ids["r0"]: 1, ids["r2"]: 3, ids["r5"]: 6}
        assert _last_frontiers(engine) == live
    with sediment.open(tmp_path / "d", clock=ManualClock()) as engine:
        assert engine.wal.start_lsn == 0  # no trim: the dropped relations' PROGRESS records are replayed
        assert _last_frontiers(engine) == live
        assert {n: engine.sealed(n) for n in engine.relations() if n not in ("tick", "pin")} == \
            {"r0": 1, "r2": 3, "r5": 6}


def test_a_transaction_dropped_while_open_is_aborted(tmp_path):
    """An open transaction holds back the WAL cut of every relation; one whose object was
    garbage collected can never be committed, so the next compaction aborts it (and the log is
    trimmed past it). A transaction still referenced stays open and commits."""
    with sediment.open(tmp_path / "d", clock=ManualClock(), compact_interval=None, segment_bytes=1 << 16) as engine:
        engine.add_relation("r", SCHEMA)
        held = engine.transaction()
        held.append("r", rows([1], 1))
        for t in range(2, 40):
            tx = engine.transaction()
            tx.append("r", rows([t], t))
            del tx
            engine.append("r", rows([1000 + t], t))
        gc.collect()
        assert len(engine.view.txns) == 39
        engine.compact()
        assert engine.view.txns.ids() == [held.id] and held.state == "open"
        held.commit()
        engine.seal("r", 40)
        engine.compact()
        assert engine.stats()["wal"]["open_transactions"] == 0
        assert engine.wal.start_lsn > 0  # trimmed past the aborted ones' records
        got = sorted(engine.snapshot("r", 40).column("id").to_pylist())
        assert got == [1] + [1000 + t for t in range(2, 40)]


def test_the_background_pass_aborts_dropped_transactions(tmp_path):
    clock = ManualClock()
    with sediment.open(tmp_path / "d", clock=clock, compact_interval=5.0) as engine:
        engine.add_relation("r", SCHEMA)
        tx = engine.transaction()
        tx.append("r", rows([1], 1))
        assert len(engine.view.txns) == 1
        del tx
        gc.collect()
        assert len(engine.view.txns) == 1, "collected, not yet aborted: the pass does that"
        passes = engine.scheduler.passes
        clock.advance(5.0)
        assert engine.scheduler.wait_passes(passes + 1, 30)
        assert len(engine.view.txns) == 0
        engine.seal("r", 1)
        assert engine.snapshot("r", 1).num_rows == 0
