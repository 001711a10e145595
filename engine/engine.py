"""The coordinator: owns relations, appends updates and progress to the WAL, answers reads.

Every state change goes through the log first. The engine's in-memory view (each
relation's sealed frontier and the WAL records not yet compacted) is rebuilt on
open by replaying the log through the same function that applies records as they
become durable, so a restarted engine and a live one cannot disagree.

Concurrency: callers may use one Engine from many threads. The engine lock guards
its view and makes check-then-submit atomic (an append at a time the relation has
just sealed is refused, never written), but nobody holds it while waiting for an
fdatasync, so concurrent appends share one group commit.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sediment.engine import replay as replay_mod
from sediment.engine.catalog import Catalog, RelationEntry
from sediment.engine.metadata import MetadataStore
from sediment.engine.schema import check_name, check_schema, conform_updates, update_schema
from sediment.errors import (
    AsOfOutOfRange,
    DataDirLocked,
    EngineClosed,
    FrontierRegression,
    RelationExists,
    TimeAlreadySealed,
    UnknownRelation,
)
from sediment.trace.consolidate import snapshot as consolidate_snapshot
from sediment.wal.protocol import WriteAheadLog
from sediment.wal.record import Record, RecordKind

DEFAULT_MAX_RECORD_BYTES = 8 << 20
LOCK_NAME = "LOCK"


@dataclass(frozen=True, slots=True)
class TailEntry:
    """A durable, committed UPDATES record still in the WAL (not yet in a batch)."""

    lsn: int
    t_lo: int
    t_hi: int
    rows: int


@dataclass
class _Relation:
    entry: RelationEntry
    update_schema: pa.Schema
    sealed: int = -1  # admitted seals: appends at times <= this are refused
    sealed_durable: int = -1  # durable seals: reads may ask for as_of <= this
    tail: list[TailEntry] = field(default_factory=list)
    seal_ticket: Any = None

    @property
    def keys(self) -> list[str]:
        return self.entry.schema.names


def _check_time(t: object, what: str) -> int:
    if isinstance(t, bool) or not isinstance(t, int) or t < 0 or t >= 1 << 63:
        raise ValueError(f"{what} must be an integer time in [0, 2**63), not {t!r}")
    return int(t)


class Engine:
    """A sediment engine over one data directory. Open with :func:`sediment.open`."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        wal: str = "file",
        segment_bytes: int = 64 << 20,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        metadata: str | MetadataStore | None = None,
        repair: bool = False,
    ) -> None:
        self.data_dir = os.path.abspath(os.fspath(data_dir))
        os.makedirs(self.data_dir, exist_ok=True)
        self._lock_fd = self._take_lock()
        self._lock = threading.RLock()
        self._closed = False
        self._max_record_bytes = max(1024, int(max_record_bytes))
        self._relations: dict[str, _Relation] = {}
        self._by_id: dict[int, _Relation] = {}
        self._open_txns: dict[int, list[tuple[int, TailEntry]]] = {}
        try:
            self._meta = self._open_metadata(metadata)
            self.catalog = Catalog(self._meta)
            self._epoch = self.catalog.next_epoch()
            self._txn_counter = 0
            self._log = self._open_wal(wal, segment_bytes, repair)
            for entry in self.catalog.load().values():
                self._register(entry)
            self._recover()
        except BaseException:
            self._release_all()
            raise

    # --- opening -------------------------------------------------------------------------------

    def _take_lock(self) -> int:
        path = os.path.join(self.data_dir, LOCK_NAME)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirLocked(f"{self.data_dir} is in use by another sediment process (lock {path}); "
                                "stop it or use another --data-dir") from None
        return fd

    def _open_metadata(self, metadata: str | MetadataStore | None) -> MetadataStore:
        if metadata is None:
            from sediment.engine.metadata_journal import JournalMetadataStore

            return JournalMetadataStore(os.path.join(self.data_dir, "meta"))
        if isinstance(metadata, str):
            from sediment.engine.metadata_open import open_metadata_store

            return open_metadata_store(metadata)
        return metadata

    def _open_wal(self, wal: str, segment_bytes: int, repair: bool) -> WriteAheadLog:
        if wal == "file":
            from sediment.wal.file_log import FileLog

            return FileLog.open(os.path.join(self.data_dir, "wal"), segment_bytes=segment_bytes, repair=repair)
        raise ValueError(f"unknown wal option {wal!r}: use 'file' or 'device:<path>'")

    def _register(self, entry: RelationEntry) -> _Relation:
        rel = _Relation(entry, update_schema(entry.schema))
        self._relations[entry.name] = rel
        self._by_id[entry.id] = rel
        return rel

    def _recover(self) -> None:
        for rel_id, t in self._log.sealed_frontiers.items():
            rel = self._by_id.get(rel_id)
            if rel is not None:
                rel.sealed = rel.sealed_durable = max(rel.sealed, t)
        for record in self._log.scan():
            self._apply(record)
        dangling = sorted(self._open_txns)
        if dangling:  # a crash left these without COMMIT: close them for good
            self._log.submit([Record(RecordKind.ABORT, txn_id=t) for t in dangling], self._on_durable).wait()

    @property
    def wal(self) -> WriteAheadLog:
        return self._log

    # --- applying durable records (live and at recovery) ---------------------------------------

    def _on_durable(self, records) -> None:
        with self._lock:
            for r in records:
                self._apply(r)

    def _apply(self, r: Record) -> None:
        kind = r.kind
        if kind == RecordKind.UPDATES:
            entry = TailEntry(r.lsn, r.t_lo, r.t_hi, r.count)
            if r.txn_id == 0:
                rel = self._by_id.get(r.relation_id)
                if rel is not None:
                    rel.tail.append(entry)
            else:
                self._open_txns.setdefault(r.txn_id, []).append((r.relation_id, entry))
        elif kind == RecordKind.PROGRESS:
            rel = self._by_id.get(r.relation_id)
            if rel is not None:
                rel.sealed = max(rel.sealed, r.t_hi)
                rel.sealed_durable = max(rel.sealed_durable, r.t_hi)
        elif kind == RecordKind.BEGIN:
            self._open_txns.setdefault(r.txn_id, [])
        elif kind == RecordKind.COMMIT:
            for rel_id, entry in self._open_txns.pop(r.txn_id, []):
                rel = self._by_id.get(rel_id)
                if rel is not None:
                    rel.tail.append(entry)
        elif kind == RecordKind.ABORT:
            self._open_txns.pop(r.txn_id, None)

    # --- relations -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosed(f"the engine on {self.data_dir} is closed")

    def _rel(self, name: str) -> _Relation:
        self._check_open()
        check_name(name)
        rel = self._relations.get(name)
        if rel is None:
            raise UnknownRelation(f"no relation named {name!r} in {self.data_dir}; known: "
                                  f"{sorted(self._relations) or 'none'}")
        return rel

    def add_relation(self, name: str, schema: pa.Schema) -> None:
        """Create an empty relation. Its updates will carry ``schema``'s columns plus
        ``time`` and ``diff``. Raises RelationExists, InvalidRelationName, SchemaMismatch."""
        check_name(name)
        schema = check_schema(schema)
        with self._lock:
            self._check_open()
            if name in self._relations:
                raise RelationExists(f"relation {name!r} already exists; drop it first or pick another name")
            self._register(self.catalog.create(name, schema))

    def drop_relation(self, name: str) -> None:
        """Forget a relation and its data. Its WAL records are ignored from now on and
        go away when the log is trimmed."""
        with self._lock:
            rel = self._rel(name)
            self.catalog.drop(rel.entry)
            del self._relations[name]
            del self._by_id[rel.entry.id]

    def relations(self) -> list[str]:
        """Names of all relations, sorted."""
        with self._lock:
            self._check_open()
            return sorted(self._relations)

    def schema(self, name: str) -> pa.Schema:
        """The relation's own columns (without ``time`` and ``diff``)."""
        with self._lock:
            return self._rel(name).entry.schema

    def since(self, name: str) -> int:
        """The compaction frontier: reads at times below it are no longer possible."""
        with self._lock:
            return self._rel(name).entry.since

    def sealed(self, name: str) -> int:
        """The greatest t of a durable ``close t`` (-1 when never sealed)."""
        with self._lock:
            return self._rel(name).sealed_durable

    # --- writing -------------------------------------------------------------------------------

    def _next_txn_id(self) -> int:
        with self._lock:
            self._txn_counter += 1
            return (self._epoch << 32) | self._txn_counter

    def _encode(self, rel: _Relation, table: pa.Table, txn_id: int) -> list[Record]:
        """UPDATES records of at most ``max_record_bytes`` each (Arrow IPC record batches)."""
        per_row = max(1, table.nbytes // max(1, table.num_rows))
        rows = max(1, self._max_record_bytes // per_row)
        records = []
        for batch in table.to_batches(max_chunksize=rows):
            if batch.num_rows == 0:
                continue
            lo, hi = pc.min_max(batch.column("time")).values()
            records.append(Record(RecordKind.UPDATES, rel.entry.id, txn_id, lo.as_py(), hi.as_py(),
                                  batch.num_rows, batch.serialize()))
        return records

    def _prepare(self, name: str, updates: object) -> tuple[_Relation, pa.Table, int]:
        with self._lock:
            rel = self._rel(name)
        table = conform_updates(name, rel.entry.schema, updates)
        t_min = pc.min(table.column("time")).as_py() if table.num_rows else None
        return rel, table, t_min

    def _admit(self, rel: _Relation, name: str, t_min: int | None) -> None:
        """Under the lock: the relation still exists and the times are not sealed."""
        if self._relations.get(name) is not rel:
            raise UnknownRelation(f"relation {name!r} was dropped while the append was being prepared")
        if t_min is not None and t_min <= rel.sealed:
            raise TimeAlreadySealed(
                f"relation {name!r} is sealed through time {rel.sealed}, but the updates include time {t_min}; "
                f"append at times > {rel.sealed}"
            )

    def append(self, name: str, updates: pa.Table) -> None:
        """Append updates: the relation's columns plus ``time`` (int64 >= 0, above the sealed
        frontier) and ``diff`` (int64). Returns once they are durable. All or nothing."""
        rel, table, t_min = self._prepare(name, updates)
        if table.num_rows == 0:
            return
        records = self._encode(rel, table, 0)
        if len(records) > 1:  # too big for one record: make it one transaction
            txn = self._next_txn_id()
            for r in records:
                r.txn_id = txn
            records = [Record(RecordKind.BEGIN, txn_id=txn), *records, Record(RecordKind.COMMIT, txn_id=txn)]
        with self._lock:
            self._check_open()
            self._admit(rel, name, t_min)
            ticket = self._log.submit(records, self._on_durable)
        ticket.wait()

    def append_many(self, updates: Mapping[str, pa.Table]) -> None:
        """Append to several relations atomically: after a crash, all or none are there."""
        txn = self._next_txn_id()
        prepared = [(name, *self._prepare(name, table)) for name, table in updates.items()]
        records = [Record(RecordKind.BEGIN, txn_id=txn)]
        for _name, rel, table, _t in prepared:
            records += self._encode(rel, table, txn)
        records.append(Record(RecordKind.COMMIT, txn_id=txn))
        if len(records) == 2:
            return
        with self._lock:
            self._check_open()
            for name, rel, _table, t_min in prepared:
                self._admit(rel, name, t_min)
            ticket = self._log.submit(records, self._on_durable)
        ticket.wait()

    def transaction(self) -> Transaction:
        """A write transaction: appends to any relations, visible only after ``commit()``."""
        from sediment.engine.transaction import Transaction

        self._check_open()
        return Transaction(self, self._next_txn_id())

    def seal(self, name: str, t: int) -> None:
        """Write ``close t``: no further updates at times <= t. Durable on return."""
        t = _check_time(t, "seal time")
        with self._lock:
            rel = self._rel(name)
            if t < rel.sealed:
                raise FrontierRegression(f"relation {name!r} is already sealed through {rel.sealed}; "
                                         f"cannot seal at {t} (seals only move forward)")
            if t == rel.sealed:
                ticket = rel.seal_ticket
            else:
                rel.sealed = t
                ticket = rel.seal_ticket = self._log.submit(
                    [Record(RecordKind.PROGRESS, rel.entry.id, 0, t, t)], self._on_durable)
        if ticket is not None:
            ticket.wait()

    def set_since(self, name: str, t: int) -> None:
        """Advance the compaction frontier: history before ``t`` may be consolidated away."""
        t = _check_time(t, "since")
        with self._lock:
            rel = self._rel(name)
            if t < rel.entry.since:
                raise FrontierRegression(f"since of {name!r} is {rel.entry.since}; it cannot move back to {t}")
            if t > rel.sealed_durable:
                raise FrontierRegression(f"since {t} for {name!r} would pass its sealed frontier "
                                         f"{rel.sealed_durable}; seal first")
            if t == rel.entry.since:
                return
            rel.entry = self.catalog.update(replace(rel.entry, since=t))

    # --- reading -------------------------------------------------------------------------------

    def _decode(self, rel: _Relation, record: Record) -> pa.RecordBatch:
        return pa.ipc.read_record_batch(pa.py_buffer(record.body), rel.update_schema)

    def snapshot(self, name: str, as_of: int) -> pa.Table:
        """The relation as of ``as_of``: its columns plus ``diff``, one row per distinct row
        whose diffs at times <= as_of sum to non-zero, sorted by the columns. Valid for
        since <= as_of <= sealed."""
        as_of = _check_time(as_of, "as_of")
        with self._lock:
            rel = self._rel(name)
            if not rel.entry.since <= as_of <= rel.sealed_durable:
                raise AsOfOutOfRange(
                    f"as_of {as_of} for {name!r} is outside [since {rel.entry.since}, sealed "
                    f"{rel.sealed_durable}]" + ("; the relation was never sealed" if rel.sealed_durable < 0 else "")
                )
            entries = [e for e in rel.tail if e.t_lo <= as_of]
        batches = [self._decode(rel, self._log.read(e.lsn)) for e in entries]
        table = pa.Table.from_batches(batches, schema=rel.update_schema)
        return consolidate_snapshot(table, rel.keys, as_of)

    def replay(self, name: str, *, batch_rows: int = 65536) -> Iterator[pa.RecordBatch]:
        """Every stored update of the relation in time order, as record batches of the
        relation's columns plus ``time`` and ``diff``; memory holds only the records whose
        time ranges overlap the current time, not the whole relation."""
        with self._lock:
            rel = self._rel(name)
            entries = list(rel.tail)

        def load(e: TailEntry) -> pa.Table:
            return pa.Table.from_batches([self._decode(rel, self._log.read(e.lsn))])

        return replay_mod.time_ordered(entries, load, rel.update_schema, batch_rows)

    # --- closing -------------------------------------------------------------------------------

    def close(self) -> None:
        """Flush and release everything. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._release_all()

    def _release_all(self) -> None:
        for closer in (getattr(self, "_log", None), getattr(self, "_meta", None)):
            if closer is not None:
                try:
                    closer.close()
                except Exception:  # noqa: BLE001 - keep releasing the rest
                    pass
        if getattr(self, "_lock_fd", None) is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


from sediment.engine.transaction import Transaction  # noqa: E402  (typing of Engine.transaction)
