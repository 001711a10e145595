"""The engine's view of its relations: each relation's frontiers and trace, the WAL
records not yet compacted (its tail), the transactions still open (:class:`OpenTxns`:
per transaction the LSN of its first record, where the compaction cut and the log trim
stop, and its UPDATES records, which join their relations' tails at COMMIT), and the WAL
backlog.

Why its own component: it is what every durable record changes (``on_durable`` applies
them as the log makes them durable; an open's bulk replay, engine/log_replay.py, leaves
exactly the same state), and what writes, reads and compaction all look at. Pure: no I/O;
the engine lock, passed in, guards it all.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from sediment.engine.backlog import BodyCache, WalBacklog
from sediment.engine.feed import PROGRESS, UPDATES
from sediment.engine.relation import Relation, TailEntry
from sediment.engine.schema import check_name
from sediment.errors import CoordinatorSuperseded, EngineClosed, EngineFailed, NothingWritten, UnknownRelation
from sediment.wal.record import Record, RecordKind, committed_txn_ids

log = logging.getLogger(__name__)
# Record kinds as plain names: an enum member's attribute access costs ~0.3 us, paid per record written
_UPDATES, _PROGRESS, _BEGIN, _COMMIT, _ABORT = (RecordKind.UPDATES, RecordKind.PROGRESS, RecordKind.BEGIN,
                                                RecordKind.COMMIT, RecordKind.ABORT)
# TailEntry((lsn, t_lo, ...)) without the named tuple's __new__, a Python function: half the cost, every append
_tail_entry = functools.partial(tuple.__new__, TailEntry)


class Relations(Mapping[str, "Relation"]):
    """The engine's relations: a mapping by name that also finds a relation by its id (WAL
    records carry ids). Adding and removing go through one call each, which keeps both
    indexes in step."""

    def __init__(self) -> None:
        self._by_name: dict[str, Relation] = {}
        self._by_id: dict[int, Relation] = {}
        self.named = self._by_name  # read-only: a lone append's lookup without a Python call (engine/writer.py)

    def __getitem__(self, name: str) -> Relation:
        return self._by_name[name]

    def get(self, name: str, default: Relation | None = None) -> Relation | None:
        """The relation named ``name``, or ``default`` (every append asks, twice: the
        Mapping mixin's ``get`` went through ``__getitem__`` and a ``try``)."""
        return self._by_name.get(name, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def by_id(self, relation_id: int) -> Relation | None:
        """The relation with this catalog id, or None (never created, or dropped)."""
        return self._by_id.get(relation_id)

    def add(self, rel: Relation) -> None:
        self._by_name[rel.entry.name] = rel
        self._by_id[rel.entry.id] = rel

    def remove(self, rel: Relation) -> None:
        del self._by_name[rel.entry.name]
        del self._by_id[rel.entry.id]


class _Txn:
    __slots__ = ("entries", "first_lsn", "relation_ids")

    def __init__(self, first_lsn: int) -> None:
        self.first_lsn = first_lsn
        self.relation_ids: list[int] = []  # side by side with entries: no pair per record
        self.entries: list[TailEntry] = []


class OpenTxns:
    """Transactions with a durable record but no durable COMMIT or ABORT yet: per transaction
    the LSN of its first record (compaction's cut and the log's trim stop there) and its
    UPDATES records, which join their relations' tails at COMMIT."""

    def __init__(self) -> None:
        self._txns: dict[int, _Txn] = {}

    def begin(self, txn_id: int, lsn: int) -> None:
        """A record of the transaction at ``lsn``; the first one seen opens it."""
        if txn_id not in self._txns:
            self._txns[txn_id] = _Txn(lsn)

    def add(self, txn_id: int, lsn: int, relation_id: int, entry: TailEntry) -> None:
        """An UPDATES record of the transaction (opening it if this is its first record)."""
        self.begin(txn_id, lsn)
        txn = self._txns[txn_id]
        txn.relation_ids.append(relation_id)
        txn.entries.append(entry)

    def extend(self, txn_id: int, lsn: int, relation_ids: Iterable[int], entries: Iterable[TailEntry]) -> None:
        """Several UPDATES records of the transaction, in log order, the first at ``lsn``:
        as many calls of :meth:`add` (an open's replay adds them in bulk)."""
        self.begin(txn_id, lsn)
        txn = self._txns[txn_id]
        txn.relation_ids.extend(relation_ids)
        txn.entries.extend(entries)
        if len(txn.relation_ids) != len(txn.entries):
            raise ValueError(f"transaction {txn_id}: {len(txn.relation_ids)} relation ids for "
                             f"{len(txn.entries)} entries")

    def finish(self, txn_id: int) -> list[tuple[int, TailEntry]]:
        """Close the transaction (COMMIT or ABORT); its ``(relation id, entry)`` updates."""
        return list(zip(*self.finish_columns(txn_id), strict=True))

    def finish_columns(self, txn_id: int) -> tuple[list[int], list[TailEntry]]:
        """:meth:`finish`, as the updates' relation ids and entries side by side."""
        txn = self._txns.pop(txn_id, None)
        return ([], []) if txn is None else (txn.relation_ids, txn.entries)

    def order_by_first_lsn(self) -> None:
        """Put the transactions in the order their first records came in the log, the order
        record-by-record application leaves them in (a bulk replay opens them out of order)."""
        self._txns = dict(sorted(self._txns.items(), key=lambda item: item[1].first_lsn))

    def first_lsns(self) -> list[int]:
        return [t.first_lsn for t in self._txns.values()]

    def entries(self) -> list[TailEntry]:
        """Every UPDATES record of the open transactions (still in the WAL, still uncommitted)."""
        return [e for t in self._txns.values() for e in t.entries]

    def ids(self) -> list[int]:
        return sorted(self._txns)

    def __len__(self) -> int:
        return len(self._txns)


class RelationView:
    """Relations, open transactions and the backlog, as the durable records left them.
    ``where`` names the data directory in errors."""

    def __init__(self, where: str, lock: threading.RLock, backlog: WalBacklog, bodies: BodyCache,
                 on_group: Callable[[int], None] = lambda _n: None) -> None:
        self.where = where
        self.lock = lock
        self.backlog = backlog
        self.bodies = bodies
        self.relations = Relations()
        self.txns = OpenTxns()
        self.max_time = -1  # greatest time of any durable update seen (the lock table's floor)
        self.closed = False
        self.superseded: Exception | None = None  # set when a newer coordinator fenced this engine
        self.failed: EngineFailed | None = None  # set by a write whose outcome is unknown (:meth:`fail`)
        self.failed_listeners: list[Callable[[EngineFailed], None]] = []  # told once, on the failing writer's thread
        self._on_group = on_group
        self.lone_groups = 0  # groups of one plain UPDATES record: counted here, not given to on_group (see on_durable)

    def check_open(self) -> None:
        if self.superseded is not None:  # closing or closed because a newer coordinator took over
            raise CoordinatorSuperseded(str(self.superseded))
        if self.closed:
            raise EngineClosed(f"the engine on {self.where} is closed")
        if self.failed is not None:  # a fresh error each time: one raised again would grow its traceback
            raise EngineFailed(str(self.failed))

    def fail(self, exc: BaseException) -> None:
        """A write failed with ``exc`` after its records were handed to the log. Unless the log
        refused them (NothingWritten) or the engine is closing, the log may hold records the view
        does not (a replicated log's next session keeps a record one node has; a file log's
        failed sync may have reached the disk): from now on every read and write raises
        EngineFailed, and feeds end, so nothing answers from a state a reopen could contradict.
        Compaction stops too (it must not trim or pass over records the view never saw)."""
        if isinstance(exc, (NothingWritten, EngineClosed, CoordinatorSuperseded)):
            return
        with self.lock:
            if self.failed is not None or self.closed:
                return
            self.failed = EngineFailed(
                f"the engine on {self.where} refuses reads and writes: a write failed with its outcome unknown "
                f"({type(exc).__name__}: {exc}), so its log may hold records this engine does not show. Close the "
                "engine and open it again: the reopened engine shows what the log kept")
            for rel in self.relations.values():
                rel.feed.close()
            failed = self.failed
        for listener in list(self.failed_listeners):  # e.g. a cluster member opens the partition again
            try:
                listener(failed)
            except Exception:  # noqa: BLE001 - the writer's own error is the one to raise
                log.exception("a listener of the failure of the engine on %s failed", self.where)

    def waited(self, ticket: object) -> object:
        """``ticket.wait()``; a failure of unknown outcome fails the engine first (:meth:`fail`)."""
        try:
            return ticket.wait()
        except Exception as exc:
            self.fail(exc)
            raise

    def get(self, name: str) -> Relation:
        """The open engine's relation ``name``; UnknownRelation when there is none. Under the lock."""
        self.check_open()
        check_name(name)
        rel = self.relations.get(name)
        if rel is None:
            known = sorted(self.relations)
            listed = f"{known[:20]}" + (f" and {len(known) - 20} more" if len(known) > 20 else "")
            raise UnknownRelation(f"no relation named {name!r} in {self.where}; known: {listed if known else 'none'}")
        return rel

    def needed_lsns(self) -> list[int]:
        """LSNs the log must keep: each relation's first record not in its trace, each
        subscriber's oldest, each open transaction's first. Under the lock."""
        rels = self.relations.values()
        needed = [n for n in (r.needs_from() for r in rels) if n is not None]
        needed += [n for n in (r.feed.oldest_lsn() for r in rels) if n is not None]
        return needed + self.txns.first_lsns()

    def on_durable(self, records: Sequence[Record]) -> None:
        """The log's callback: ``records`` are durable, in log order."""
        if len(records) == 1 and records[0].txn_id == 0 and records[0].kind == _UPDATES:
            self.on_durable_one(records)
            return
        self._on_group(len(records))
        counted: dict[int, list] = {}  # relation id -> [relation, appends, rows]: counters bumped once a group
        with self.lock:
            cache = self.bodies
            for r in records:
                if r.kind != _UPDATES:
                    self.apply(r)
                    continue
                size = len(r.body)
                if r.txn_id == 0:  # a plain append, as apply() takes it, with its counts gathered
                    rel = self.add_tail(r.relation_id, TailEntry(r.lsn, r.t_lo, r.t_hi, r.count, size,
                                                                 r.schema_version))
                    if rel is not None:
                        c = counted.setdefault(r.relation_id, [rel, 0, 0])
                        c[1] += r.appends
                        c[2] += r.count
                else:
                    self.apply(r)
                cache.put(r.lsn, r.body, size)
            for rel, appends, rows in counted.values():
                rel.counters.add(rows, appends)

    def on_durable_one(self, records: Sequence[Record]) -> None:
        """:meth:`on_durable` of one plain UPDATES record made durable alone (a lone writer's
        append, or a group's appends the log joined into one record): add_tail, the counters
        and the body cache inline, since each call here is a frame on a lone append's path,
        run right after its fdatasync with cold caches (FileLog._write_one); the feed is
        called only when it has subscribers (its add then just moves the sequence), and the
        group is counted in ``lone_groups``, which the group size histogram adds at a scrape
        (the engine wires it), rather than observed. A lone writer's append hands it to the log
        itself (engine/writer.py), which skips :meth:`on_durable`'s dispatch."""
        r = records[0]
        lsn, t_hi, size, count = r.lsn, r.t_hi, len(r.body), r.count
        with self.lock:
            self.lone_groups += 1
            if t_hi > self.max_time:
                self.max_time = t_hi
            rel = self.relations._by_id.get(r.relation_id)
            if rel is not None and lsn >= rel.trace.wal_through:  # below it: already in the trace
                rel.tail.append(_tail_entry((lsn, r.t_lo, t_hi, count, size, r.schema_version)))
                feed = rel.feed
                if feed.subs:
                    feed.add(UPDATES, lsn, rel.shape[0], r.schema_version)
                else:
                    feed.next_seq += 1
                self.backlog.bytes += size  # WalBacklog.add
                counters = rel.counters  # RelationCounters.add
                counters.appends.value += r.appends
                counters.rows.value += count
            self.bodies.put(lsn, r.body, size)

    def apply(self, r: Record) -> None:
        """One durable record's effect (under the lock)."""
        kind = r.kind
        if kind == _UPDATES:
            entry = TailEntry(r.lsn, r.t_lo, r.t_hi, r.count, r.body_len, r.schema_version)
            if r.txn_id == 0:
                rel = self.add_tail(r.relation_id, entry)
                if rel is not None:
                    rel.counters.add(r.count)
            else:
                self.txns.add(r.txn_id, r.lsn, r.relation_id, entry)
                self.backlog.add(entry.bytes)
        elif kind == _PROGRESS:
            rel = self.relations.by_id(r.relation_id)
            if rel is not None and r.lsn >= rel.trace.wal_through:
                rel.sealed = max(rel.sealed, r.t_hi)
                rel.sealed_durable = max(rel.sealed_durable, r.t_hi)
                rel.progress.append((r.lsn, r.t_hi))
                rel.feed.add(PROGRESS, r.lsn, r.t_hi)
        elif kind == _BEGIN:
            self.txns.begin(r.txn_id, r.lsn)
        elif kind == _COMMIT:
            for txn in committed_txn_ids(r) if r.body else (r.txn_id,):
                self._commit(txn)
        elif kind == _ABORT:
            self.backlog.remove(sum(e.bytes for _rid, e in self.txns.finish(r.txn_id)))

    def _commit(self, txn: int) -> None:
        written: dict[int, tuple[Relation, int]] = {}  # one commit counts once per relation
        for rel_id, entry in self.txns.finish(txn):
            self.backlog.remove(entry.bytes)
            rel = self.add_tail(rel_id, entry)
            if rel is not None:
                written[rel_id] = (rel, written.get(rel_id, (rel, 0))[1] + entry.rows)
        for rel, rows in written.values():
            rel.counters.add(rows)

    def add_tail(self, rel_id: int, entry: TailEntry) -> Relation | None:
        """Make a durable, committed record visible; the relation it was added to, or None
        (dropped, or already in the trace). Every durable append passes here, so its callers count it."""
        rel = self.relations.by_id(rel_id)
        if entry.t_hi > self.max_time:
            self.max_time = entry.t_hi
        if rel is not None and entry.lsn >= rel.trace.wal_through:  # below it: already in the trace
            rel.tail.append(entry)
            rel.feed.add(UPDATES, entry.lsn, rel.shape[0], entry.schema_version)
            self.backlog.add(entry.bytes)
            return rel
        return None
