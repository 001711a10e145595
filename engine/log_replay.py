"""An open's replay of the log, in bulk: what applying every record with ``RelationView.apply``
would leave behind (relation tails, progress lists, sealed frontiers, open transactions,
the backlog's bytes, the greatest visible time), computed per chunk of records with
C-level passes (sorts, ``groupby``, ``map`` over ``itemgetter``) instead of a Python
call chain per record.

Why: an open of a log of 10 KB records spent about 2 us per record in the engine
(a frozen dataclass per tail entry, a lock per feed event, method calls per record), as
much CPU as the log's own verified scan. Here the per-record work is a few C calls.

Records are the header tuples a file log's recovery hands over
(:class:`sediment.wal.record.HeadRecord`); records of other logs' ``scan()`` are turned
into the same tuples by :func:`head_of`. Order is kept where it is observable: a
relation's tail lists its entries in the order they became visible (an update outside
a transaction at its own LSN, a transaction's updates at its COMMIT), its progress list
in log order. Pure: no I/O, no locking beyond the structures' own; called before the
engine serves anyone.
"""

from __future__ import annotations

import gc
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain, islice, repeat
from operator import itemgetter
from typing import Any

from sediment.engine.frontiers import SealedFrontiers
from sediment.engine.relation import Relation, TailEntry
from sediment.engine.view import OpenTxns, Relations
from sediment.wal.record import HeadRecord, Record, RecordKind, committed_txn_ids

_UPDATES = int(RecordKind.UPDATES)
_PROGRESS = int(RecordKind.PROGRESS)
_BEGIN = int(RecordKind.BEGIN)
_COMMIT = int(RecordKind.COMMIT)
_ABORT = int(RecordKind.ABORT)
_FRONTIERS = int(RecordKind.FRONTIERS)

# positions in a HeadRecord (the fields of wal.record.HEADER, then the kept body)
_kind = itemgetter(3)
_body_len = itemgetter(4)
_lsn = itemgetter(6)
_rel = itemgetter(7)
_txn = itemgetter(8)
_t_hi = itemgetter(10)
_entry_fields = itemgetter(6, 9, 10, 11, 4, 12)  # TailEntry: lsn, t_lo, t_hi, rows, bytes, schema_version
_progress_fields = itemgetter(6, 10)  # (lsn, t)
_first = itemgetter(0)
_second = itemgetter(1)
_entry_t_hi = itemgetter(2)
_entry_bytes = itemgetter(4)
_new = tuple.__new__

CHUNK = 1024  # records per pass: few enough that a chunk's short-lived tuples reuse warm memory


def _runs(items: list[Any], key: Callable[[Any], int]) -> Iterator[tuple[int, list[Any]]]:
    """``items`` grouped by ``key``, each group in its original order, as list slices (a
    stable sort, then bisection: C-level work per item, Python work per group)."""
    if not items:
        return
    ordered = sorted(items, key=key)
    keys = list(map(key, ordered))
    i, n = 0, len(keys)
    while i < n:
        k = keys[i]
        j = n if keys[-1] == k else bisect_right(keys, k, i)
        yield k, ordered[i:j] if i or j < n else ordered
        i = j


def head_of(r: Record) -> HeadRecord:
    """A record read back by a log's ``scan()``, as the header tuple a file log's recovery
    yields. UPDATES bodies are dropped: the replay needs only their length."""
    kind = int(r.kind)
    size = len(memoryview(r.body))
    fields = (0, 0, 0, kind, size, 0, r.lsn, r.relation_id, r.txn_id, r.t_lo, r.t_hi, r.count, r.schema_version)
    if kind != _UPDATES and size:
        fields += (bytes(r.body),)
    return _new(HeadRecord, fields)


@dataclass
class Replayed:
    """What a replay found beyond the structures it changed in place."""

    records: int = 0
    max_time: int = -1  # greatest t_hi of an update made visible (committed), -1 if none
    backlog: int = 0  # bytes of UPDATES records left in tails and open transactions
    feed_events: dict[int, int] = field(default_factory=dict)  # relation id -> events made visible


def replay(records: Iterable[Any], relations: Relations, txns: OpenTxns, book: SealedFrontiers,
           *, chunk: int = CHUNK) -> Replayed:
    """Apply ``records`` (HeadRecords in log order) to the relations' tails and progress,
    the open transactions and the frontier book, as ``RelationView.apply`` would one by one;
    advance each relation's feed by the events it made visible."""
    out = Replayed()
    it = iter(records)
    collect = gc.isenabled()
    gc.disable()  # only acyclic tuples are made; its passes over the growing tails cost ~1 us a record
    try:
        while batch := list(islice(it, chunk)):
            out.records += len(batch)
            _Chunk(relations, txns, out).apply(batch, book)
    finally:
        if collect:
            gc.enable()
    txns.order_by_first_lsn()
    for rel_id, n in out.feed_events.items():
        rel = relations.by_id(rel_id)
        if rel is not None and rel.feed is not None:
            rel.feed.skip(n)
    return out


class _Chunk:
    """One chunk's replay: records split by kind, then each kind handled in bulk."""

    def __init__(self, relations: Relations, txns: OpenTxns, out: Replayed) -> None:
        self.relations = relations
        self.txns = txns
        self.out = out
        self.visible: dict[int, list[tuple[list[TailEntry], int | None]]] = {}  # rel id -> pieces

    def apply(self, batch: list[Any], book: SealedFrontiers) -> None:
        parts = dict(_runs(batch, _kind))  # each kind in log order
        updates = parts.get(_UPDATES, [])
        if updates and not any(map(_txn, updates)):
            plain, by_txn = updates, {}
        else:
            by_txn = dict(_runs(updates, _txn))
            plain = by_txn.pop(0, [])
        self._plain(plain)
        control = parts.get(_BEGIN, []) + parts.get(_COMMIT, []) + parts.get(_ABORT, [])
        control.sort(key=_lsn)
        self._transactions(by_txn, control)
        self._progress(parts.get(_PROGRESS, []), book)
        frontiers = parts.get(_FRONTIERS)
        if frontiers:
            book.observe(frontiers)
        self._publish()

    def _plain(self, updates: list[Any]) -> None:
        """UPDATES outside transactions: visible at their own LSN."""
        if not updates:
            return
        out = self.out
        out.max_time = max(out.max_time, max(map(_t_hi, updates)))
        for rel_id, group in _runs(updates, _rel):
            entries = list(map(_new, repeat(TailEntry), map(_entry_fields, group)))
            self._show(rel_id, entries, None)

    def _transactions(self, by_txn: dict[int, list[Any]], control: list[Any]) -> None:
        """Transactions' UPDATES join the open transactions, in bulk, just before the first
        BEGIN/COMMIT/ABORT record after them that names their transaction (so a COMMIT takes
        exactly the records before it), the rest at the chunk's end."""
        taken = dict.fromkeys(by_txn, 0)
        txns = self.txns

        def join(txn: int, before: int | None) -> None:
            group = by_txn.get(txn)
            if group is None:
                return
            i = taken[txn]
            j = len(group) if before is None or group[-1][6] < before else \
                bisect_left(list(map(_lsn, group)), before, i)
            if j > i:
                part = group[i:j] if i or j < len(group) else group
                txns.extend(txn, part[0][6], map(_rel, part), map(_new, repeat(TailEntry), map(_entry_fields, part)))
                self.out.backlog += sum(map(_body_len, part))
                taken[txn] = j

        for r in control:
            kind, lsn = r[3], r[6]
            if kind == _BEGIN:
                join(r[8], lsn)
                txns.begin(r[8], lsn)
            elif kind == _COMMIT:
                for txn in (committed_txn_ids(r) if r.body else (r[8],)):
                    join(txn, lsn)
                    self._commit(*txns.finish_columns(txn), lsn)
            else:
                join(r[8], lsn)
                self.out.backlog -= sum(map(_entry_bytes, txns.finish_columns(r[8])[1]))
        for txn in by_txn:
            join(txn, None)

    def _commit(self, relation_ids: list[int], entries: list[TailEntry], lsn: int) -> None:
        """A committed transaction's updates: visible at the COMMIT's LSN, in their order."""
        if not entries:
            return
        out = self.out
        out.backlog -= sum(map(_entry_bytes, entries))
        out.max_time = max(out.max_time, max(map(_entry_t_hi, entries)))
        first = relation_ids[0]
        if relation_ids.count(first) == len(relation_ids):
            self._show(first, entries, lsn)
            return
        for rel_id, pairs in _runs(list(zip(relation_ids, entries, strict=True)), _first):
            self._show(rel_id, list(map(_second, pairs)), lsn)

    def _show(self, rel_id: int, entries: list[TailEntry], at: int | None) -> None:
        """Entries of one relation that became visible (``at``: their COMMIT's LSN; None: each
        its own), unless the relation is gone or its trace already holds them."""
        rel = self.relations.by_id(rel_id)
        if rel is None:
            return
        through = rel.trace.wal_through
        if entries[0].lsn < through:
            entries = [e for e in entries if e.lsn >= through]
            if not entries:
                return
        self.out.backlog += sum(map(_entry_bytes, entries))
        self.visible.setdefault(rel_id, []).append((entries, at))

    def _publish(self) -> None:
        """Each relation's visible entries onto its tail, in the order they became visible."""
        events = self.out.feed_events
        for rel_id, pieces in self.visible.items():
            rel: Relation = self.relations.by_id(rel_id)  # type: ignore[assignment]
            if len(pieces) == 1:
                entries = pieces[0][0]
            else:
                keys = list(chain.from_iterable(map(_first, e) if at is None else repeat(at, len(e))
                                                for e, at in pieces))
                flat = list(chain.from_iterable(e for e, _at in pieces))
                entries = list(map(flat.__getitem__, sorted(range(len(flat)), key=keys.__getitem__)))
            rel.tail.extend(entries)
            events[rel_id] = events.get(rel_id, 0) + len(entries)

    def _progress(self, records: list[Any], book: SealedFrontiers) -> None:
        """PROGRESS records: each relation's greatest ``close t`` into the book (dropped
        relations too); those not yet in a trace into the relation's progress list."""
        if not records:
            return
        highest: dict[int, int] = {}
        events = self.out.feed_events
        for rel_id, group in _runs(records, _rel):
            t = max(map(_t_hi, group))
            highest[rel_id] = t
            rel = self.relations.by_id(rel_id)
            if rel is None:
                continue
            through = rel.trace.wal_through
            if group[0][6] < through:
                group = [r for r in group if r[6] >= through]
                if not group:
                    continue
                t = max(map(_t_hi, group))
            rel.sealed = max(rel.sealed, t)
            rel.sealed_durable = max(rel.sealed_durable, t)
            rel.progress.extend(map(_progress_fields, group))
            events[rel_id] = events.get(rel_id, 0) + len(group)
        book.raise_to(highest)
