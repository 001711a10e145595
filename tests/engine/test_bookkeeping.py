"""The engine's bookkeeping structures (engine/view.py, engine/collector.py) against plain models: each one
answers every question exactly as the two dictionaries it replaced would have, kept in step
by hand, after any sequence of operations."""

from __future__ import annotations

import random

import pyarrow as pa

from sediment.engine.catalog import RelationEntry
from sediment.engine.relation import Relation, TailEntry
from sediment.engine.view import OpenTxns, Relations
from sediment.trace.state import TraceState


def relation(rel_id: int, name: str) -> Relation:
    entry = RelationEntry(name=name, id=rel_id, schema=pa.schema([("k", pa.int64())]))
    return Relation(entry, entry.schema, TraceState(rel_id))


def test_relations_by_name_and_by_id_never_disagree() -> None:
    for seed in range(300):
        rnd = random.Random(seed)
        rels = Relations()
        by_name: dict[str, Relation] = {}
        by_id: dict[int, Relation] = {}
        next_id = 1
        for _ in range(30):
            if by_name and rnd.random() < 0.4:
                name = rnd.choice(sorted(by_name))
                rel = by_name.pop(name)
                del by_id[rel.entry.id]
                rels.remove(rel)
            else:
                name = rnd.choice("abcdefgh")
                if name in by_name:
                    continue
                rel = relation(next_id, name)
                next_id += 1
                by_name[name] = by_id[rel.entry.id] = rel
                rels.add(rel)
            assert dict(rels) == by_name and len(rels) == len(by_name) and sorted(rels) == sorted(by_name)
            for rid in range(next_id + 1):
                assert rels.by_id(rid) is by_id.get(rid)
            for name in "abcdefgh":
                assert (name in rels) == (name in by_name) and rels.get(name) is by_name.get(name)


def test_open_transactions_against_the_two_dicts_they_replace() -> None:
    """The model is the engine's former ``_open_txns`` (updates) and ``_txn_first`` (first LSN)."""
    for seed in range(300):
        rnd = random.Random(seed)
        txns = OpenTxns()
        updates: dict[int, list[tuple[int, TailEntry]]] = {}
        first: dict[int, int] = {}
        for lsn in range(40):
            txn = rnd.randrange(1, 6)
            op = rnd.randrange(4)
            if op == 0:  # BEGIN
                txns.begin(txn, lsn)
                updates.setdefault(txn, [])
                first.setdefault(txn, lsn)
            elif op == 1:  # UPDATES in a transaction
                entry = TailEntry(lsn, lsn, lsn, 1)
                rel_id = rnd.randrange(3)
                if rnd.random() < 0.5:
                    txns.add(txn, lsn, rel_id, entry)
                else:  # the bulk form an open's replay uses
                    txns.extend(txn, lsn, [rel_id], [entry])
                updates.setdefault(txn, []).append((rel_id, entry))
                first.setdefault(txn, lsn)
            else:  # COMMIT or ABORT
                first.pop(txn, None)
                assert txns.finish(txn) == updates.pop(txn, [])
            assert sorted(txns.first_lsns()) == sorted(first.values())
            assert txns.ids() == sorted(updates) and len(txns) == len(updates)
            lsn_of = lambda e: e.lsn  # noqa: E731
            assert sorted(txns.entries(), key=lsn_of) == sorted((e for es in updates.values() for _r, e in es),
                                                              key=lsn_of)
