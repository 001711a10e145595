"""An open's bulk replay (engine/log_replay.py) against the record-by-record one it replaces:
random logs of every record kind, cut into chunks of every size, must leave the relations'
tails (in the same order), progress lists, frontiers and feeds, the open transactions, the
backlog and the greatest visible time exactly as applying the records one at a time does.
Then the same through real engines: reopened logs (file and device WAL) give back the tails,
progress, frontiers, snapshots and feeds that were there before the restart."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pyarrow as pa
import pytest

import sediment
from sediment.clock import ManualClock
from sediment.engine import log_replay as recovery
from sediment.engine.catalog import RelationEntry
from sediment.engine.frontiers import SealedFrontiers
from sediment.engine.relation import Relation, TailEntry
from sediment.engine.view import OpenTxns, Relations
from sediment.trace.state import TraceState
from sediment.wal import record as rec
from sediment.wal.record import HeadRecord, Record, RecordKind

K = RecordKind


def relations(through: dict[int, int]) -> Relations:
    rels = Relations()
    for rel_id, wal_through in through.items():
        entry = RelationEntry(name=f"r{rel_id}", id=rel_id, schema=pa.schema([("k", pa.int64())]))
        rel = Relation(entry, entry.schema, TraceState(rel_id, wal_through=wal_through))
        rel.feed = sediment.engine.feed.FeedLog()
        rels.add(rel)
    return rels


@dataclass
class Model:
    """Record-by-record application, as RelationView.apply and RelationView.add_tail do it (the code
    the bulk replay replaced), written plainly."""

    rels: Relations
    txns: OpenTxns = field(default_factory=OpenTxns)
    book: dict[int, int] = field(default_factory=dict)
    backlog: int = 0
    max_time: int = -1

    def add_tail(self, rel_id: int, entry: TailEntry) -> None:
        self.max_time = max(self.max_time, entry.t_hi)
        rel = self.rels.by_id(rel_id)
        if rel is not None and entry.lsn >= rel.trace.wal_through:
            rel.tail.append(entry)
            rel.feed.add("updates", entry.lsn)
            self.backlog += entry.bytes

    def apply(self, r: Record) -> None:
        if r.kind == K.UPDATES:
            entry = TailEntry(r.lsn, r.t_lo, r.t_hi, r.count, len(r.body))
            if r.txn_id == 0:
                self.add_tail(r.relation_id, entry)
            else:
                self.txns.add(r.txn_id, r.lsn, r.relation_id, entry)
                self.backlog += entry.bytes
        elif r.kind == K.PROGRESS:
            self.book[r.relation_id] = max(self.book.get(r.relation_id, -1), r.t_hi)
            rel = self.rels.by_id(r.relation_id)
            if rel is not None and r.lsn >= rel.trace.wal_through:
                rel.sealed = max(rel.sealed, r.t_hi)
                rel.sealed_durable = max(rel.sealed_durable, r.t_hi)
                rel.progress.append((r.lsn, r.t_hi))
                rel.feed.add("progress", r.lsn, r.t_hi)
        elif r.kind == K.FRONTIERS:
            for rel_id, t in rec.decode_frontiers(r.body).items():
                self.book[rel_id] = max(self.book.get(rel_id, -1), t)
        elif r.kind == K.BEGIN:
            self.txns.begin(r.txn_id, r.lsn)
        elif r.kind == K.COMMIT:
            for txn in rec.committed_txn_ids(r) if r.body else (r.txn_id,):
                for rel_id, entry in self.txns.finish(txn):
                    self.backlog -= entry.bytes
                    self.add_tail(rel_id, entry)
        elif r.kind == K.ABORT:
            self.backlog -= sum(e.bytes for _r, e in self.txns.finish(r.txn_id))


def random_log(rng: random.Random, n: int) -> list[Record]:
    """Records of every kind the engine applies, in log order (LSNs 0..): plain updates over
    known and unknown relations, transactions (interleaved, over several relations,
    committed alone or several by one COMMIT, aborted, left open, touched again after their
    end), progress and frontiers records; a PADDING record now and then."""
    out: list[Record] = []
    open_txns: list[int] = []
    next_txn = 1
    rels = [1, 2, 3, 9]  # 9: not a relation (dropped)
    while len(out) < n:
        roll = rng.random()
        t = rng.randint(0, 50)
        if roll < 0.35:
            out.append(Record(K.UPDATES, rng.choice(rels), 0, t, t + rng.randint(0, 3), rng.randint(1, 300),
                              b"x" * rng.choice([0, 1, 10, 500])))
        elif roll < 0.45 or not open_txns and roll < 0.6:
            txn = next_txn
            next_txn += 1
            open_txns.append(txn)
            if rng.random() < 0.5:
                out.append(Record(K.BEGIN, txn_id=txn))
        elif roll < 0.7 and open_txns:
            out.append(Record(K.UPDATES, rng.choice(rels), rng.choice(open_txns), t, t + 1, rng.randint(1, 9),
                              b"y" * rng.randint(0, 50)))
        elif roll < 0.8 and open_txns:
            ends = rng.sample(open_txns, rng.randint(1, len(open_txns)))
            for txn in ends:
                open_txns.remove(txn)
            if rng.random() < 0.8:
                out.append(Record(K.COMMIT, txn_id=ends[0], body=rec.encode_txn_ids(ends[1:])))
            else:
                out += [Record(K.ABORT, txn_id=txn) for txn in ends]
        elif roll < 0.9:
            out.append(Record(K.PROGRESS, rng.choice(rels), 0, t, t))
        elif roll < 0.94:
            out.append(Record(K.FRONTIERS, body=rec.encode_frontiers({rng.choice(rels): t, 7: t // 2})))
        elif roll < 0.97 and next_txn > 1:  # a record naming a transaction that already ended
            out.append(Record(K.UPDATES, rng.choice(rels), rng.randrange(1, next_txn), t, t, 1, b"z"))
        else:
            out.append(Record(K.PADDING))
    for lsn, r in enumerate(out):
        r.lsn = lsn
    return out


def state(rels: Relations, txns: OpenTxns) -> dict:
    return {"rels": {rel.entry.id: (list(rel.tail), list(rel.progress), rel.sealed, rel.sealed_durable,
                                    rel.feed.next_seq) for rel in (rels[name] for name in rels)},
            "txns": (txns.ids(), sorted(txns.first_lsns()), txns.entries())}


@pytest.mark.parametrize("seed", range(60))
def test_bulk_replay_leaves_what_record_by_record_application_leaves(seed):
    rng = random.Random(seed)
    log = random_log(rng, rng.choice([5, 40, 300, 2000]))
    through = {1: 0, 2: rng.randint(0, len(log)), 3: rng.randint(0, len(log) // 3)}
    model = Model(relations(through))
    for r in log:
        model.apply(r)
    heads = [recovery.head_of(r) for r in log]
    assert all(isinstance(h, HeadRecord) for h in heads)
    for chunk in (1, 2, 3, 7, 64, recovery.CHUNK):
        rels, txns, book = relations(through), OpenTxns(), SealedFrontiers()
        done = recovery.replay(iter(heads), rels, txns, book, chunk=chunk)
        assert done.records == len(log)
        assert state(rels, txns) == state(model.rels, model.txns), f"chunk {chunk}"
        assert (done.backlog, done.max_time) == (model.backlog, model.max_time), f"chunk {chunk}"
        assert book.frontiers() == model.book, f"chunk {chunk}"


def test_a_tail_lists_entries_in_the_order_they_became_visible():
    """A transaction's updates join the tail at its COMMIT, after plain updates appended
    later but committed earlier; several transactions in one COMMIT keep the COMMIT's order."""
    log = [Record(K.UPDATES, 1, 5, 1, 1, 1, b"a"),  # 0: txn 5
           Record(K.UPDATES, 1, 0, 2, 2, 1, b"b"),  # 1: plain
           Record(K.UPDATES, 1, 6, 3, 3, 1, b"c"),  # 2: txn 6
           Record(K.COMMIT, txn_id=6, body=rec.encode_txn_ids([5])),  # 3: commits 6, then 5
           Record(K.UPDATES, 1, 0, 4, 4, 1, b"d")]  # 4: plain
    for lsn, r in enumerate(log):
        r.lsn = lsn
    for chunk in (1, 2, 5):
        rels = relations({1: 0})
        recovery.replay(map(recovery.head_of, log), rels, OpenTxns(), SealedFrontiers(), chunk=chunk)
        assert [e.lsn for e in rels["r1"].tail] == [1, 2, 0, 4]


def _fill(engine) -> None:
    """Plain appends, sealed times and transactions over two relations, and a dropped
    relation, in one log."""
    schema = pa.schema([("k", pa.int64())])
    for name in ("a", "b", "gone"):
        engine.add_relation(name, schema)
    rng = random.Random(3)
    for t in range(1, 80):
        if rng.random() < 0.3:
            with engine.transaction() as tx:
                for rel in ("a", "b"):
                    tx.append(rel, pa.table({"k": [t, -t], "time": [t + 1, t + 2], "diff": [1, 1]}))
        name = rng.choice(["a", "b", "gone"])
        engine.append(name, pa.table({"k": [t % 5], "time": [max(t, engine.sealed(name) + 1)], "diff": [1]}))
        if t % 7 == 0:
            engine.seal(name, t)
    engine.drop_relation("gone")


def _view(engine) -> dict:
    out = {}
    for name in engine.relations():
        rel = engine.view.relations[name]
        sealed = engine.sealed(name)
        out[name] = {"tail": list(rel.tail), "progress": list(rel.progress), "sealed": (rel.sealed, sealed),
                     "feed": rel.feed.next_seq,
                     "snap": [sorted(engine.snapshot(name, as_of=t).to_pylist(), key=str)
                              for t in (*range(0, sealed, 5), sealed)]}
    return out


@pytest.mark.parametrize("wal", ["file", "device"])
def test_reopen_gives_back_every_tail_in_order(tmp_path, wal):
    d = str(tmp_path / "data")
    options = {"clock": ManualClock(), "segment_bytes": 1 << 20}  # compaction on, never due; no segment fills
    if wal == "device":
        options.update(wal="device:" + str(tmp_path / "ring"), wal_capacity=8 << 20)
    with sediment.open(d, **options) as engine:
        _fill(engine)
        before = _view(engine)
    assert sum(len(v["tail"]) for v in before.values()) > 60 and before["a"]["progress"]
    options.pop("wal_capacity", None)
    with sediment.open(d, **options) as engine:
        assert _view(engine) == before
        sealed = before["a"]["sealed"][1]
        with engine.subscribe("a", as_of=0) as feed:  # the feed after a replay: snapshot, catch-up, then live
            events = [feed.next(timeout=10) for _ in range(3)]
            engine.append("a", pa.table({"k": [99], "time": [sealed + 50], "diff": [1]}))
            events.append(feed.next(timeout=10))
    assert [e.kind for e in events] == ["snapshot", "updates", "progress", "updates"]
    assert sorted(events[0].table.to_pylist(), key=str) == before["a"]["snap"][0]
    assert events[1].table.num_rows >= len(before["a"]["tail"]) and events[2].time == sealed
    assert events[3].table.column("k").to_pylist() == [99]
