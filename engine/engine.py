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
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sediment._fs import makedirs_durable
from sediment.engine import args, deploy
from sediment.engine.backlog import (
    DEFAULT_MAX_WAL_BACKLOG,
    DEFAULT_WAL_BACKLOG_TIMEOUT,
    BodyCache,
    WalBacklog,
)
from sediment.engine.catalog import Catalog, RelationEntry
from sediment.engine.feed import PROGRESS, UPDATES, FeedLog
from sediment.engine.locks import DEFAULT_SLOTS, Locks, LockTable
from sediment.engine.memory import configure_memory_pool
from sediment.engine.metadata.protocol import MetadataStore
from sediment.engine.schema import check_name, check_schema, conform_updates, time_range, update_schema
from sediment.errors import (
    DataDirLocked,
    EngineClosed,
    FrontierRegression,
    InvalidArgument,
    MetadataMissing,
    RelationExists,
    TimeAlreadySealed,
    UnknownRelation,
    WalCorruption,
    WalMissing,
)
from sediment.metrics import CountingBlobStore, EngineMetrics
from sediment.trace import compacter as cmp
from sediment.trace.planner import DEFAULT_MAX_PENDING_RUNS
from sediment.trace.state import TraceState
from sediment.trace.store import TraceStore
from sediment.wal.protocol import WriteAheadLog
from sediment.wal.record import Record, RecordKind, committed_txn_ids

DEFAULT_MAX_RECORD_BYTES = 8 << 20
DEFAULT_MEMORY_BOUND = 256 << 20
LOCK_NAME = "LOCK"
STORAGE_KEY = "engine/storage"
log = logging.getLogger(__name__)


from sediment.engine.compaction import Compaction  # noqa: E402
from sediment.engine.reads import Reads  # noqa: E402
from sediment.engine.relation import ReadPlan, TailEntry, _check_time, _Relation  # noqa: E402,F401  (re-exported)


class Engine(Reads, Compaction):
    """A sediment engine over one data directory. Open with :func:`sediment.open`."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        wal: str | None = None,
        wal_capacity: int | None = None,
        replicas: list[str] | None = None,
        cluster_key: str | None = None,
        segment_bytes: int = 64 << 20,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        metadata: str | MetadataStore | None = None,
        blob: str | Any | None = None,
        s3_endpoint: str | None = None,
        compact_interval: float | None = 5.0,
        compact: bool = True,
        merge_factor: float = 2.0,
        memory_bound: int = DEFAULT_MEMORY_BOUND,
        lock_slots: int = DEFAULT_SLOTS,
        arrow_memory_pool: str | None = "system",
        repair: bool = False,
        clock: Any = None,
        take_over_blob_prefix: bool = False,
        max_wal_backlog: int | None = DEFAULT_MAX_WAL_BACKLOG,
        wal_backlog_timeout: float = DEFAULT_WAL_BACKLOG_TIMEOUT,
    ) -> None:
        args.check_open_options({k: v for k, v in locals().items() if k not in ("self", "data_dir")})
        self.data_dir = os.path.abspath(args.check_data_dir(data_dir))
        configure_memory_pool(arrow_memory_pool)
        self.metadata_spec = metadata if isinstance(metadata, str) else None
        marker = deploy.check_opening(self.data_dir, metadata)  # before anything is created
        self.superseded: Exception | None = None  # set when a newer coordinator fenced this one
        self.superseded_listeners: list = []
        makedirs_durable(self.data_dir)
        self._lock_fd = self._take_lock()
        self._lock = threading.RLock()
        self._compact_lock = threading.Lock()
        self._backlog = WalBacklog(self._lock, max_wal_backlog if compact else None, wal_backlog_timeout)
        self._max_pending_runs = DEFAULT_MAX_PENDING_RUNS
        self._closed = False
        self._max_record_bytes = max(1024, int(max_record_bytes))
        self._merge_factor = merge_factor
        self._memory_bound = max(1 << 20, int(memory_bound))
        self._bodies = BodyCache(self._memory_bound // 2)
        self._relations: dict[str, _Relation] = {}
        self._by_id: dict[int, _Relation] = {}
        self._open_txns: dict[int, list[tuple[int, TailEntry]]] = {}
        self._txn_first: dict[int, int] = {}
        self._max_time = -1  # greatest time of any durable update seen (the lock table's floor)
        self._lock_slots = lock_slots
        self._readers = 0
        self._leases: dict[int, float] = {}  # read-plan lease -> monotonic deadline
        self._lease_counter = 0
        self._garbage: list[str] = []
        self._compaction_failures: dict[str, tuple[str, int]] = {}  # name -> (last error, failed attempts)
        self._trim_to: int | None = None
        self._compacter: cmp.Compacter | None = None
        self._record_storage: tuple[bytes, int | None] | None = None
        self.metrics = EngineMetrics()
        self.metrics.watch_state(self.stats)
        self._compact_interval = compact_interval
        self._segment_age = cmp.SegmentAge()
        try:
            if metadata is None:
                self._check_meta_present()
            self._meta = self._open_metadata(metadata)
            stored = self._storage_config({"wal": wal, "wal_capacity": wal_capacity, "replicas": replicas,
                                           "cluster_key": cluster_key,
                                           "blob": blob if isinstance(blob, str) or blob is None else "<object>",
                                           "s3_endpoint": s3_endpoint})
            wal = stored.get("wal") or "file"
            wal_capacity, replicas, cluster_key = stored.get("wal_capacity"), stored.get("replicas"), \
                stored.get("cluster_key")
            if isinstance(blob, str) or blob is None:
                blob = stored.get("blob")
            s3_endpoint = stored.get("s3_endpoint")
            if replicas:
                deploy.require_shared_blob(blob, self.data_dir)
            self._blobs = CountingBlobStore(self._open_blobs(blob, s3_endpoint), self.metrics)
            self.traces = TraceStore(self._meta, self._blobs)
            self.traces.check_owner(stored["engine_id"], self.blob_uri or "<blob store object>",
                                    take_over=take_over_blob_prefix, data_dir=self.data_dir)
            self.catalog = Catalog(self._meta)
            self._epoch = self.catalog.next_epoch()
            self._txn_counter = 0
            if replicas:
                from sediment.wal.replication.replicated_log import ReplicatedLog

                if metadata is None:
                    raise ValueError("replicas=[...] needs a shared metadata store, e.g. "
                                     "metadata='zk://127.0.0.1:2181/sediment'")
                self._log = ReplicatedLog.open(list(replicas), self._meta, 0, cluster_key,
                                               segment_bytes=segment_bytes)
                deploy.close_when_fenced(self, self._log.on_fenced)
                if marker is None:
                    deploy.write_marker(self.data_dir, deploy.metadata_spec(metadata))
            else:
                self._log = self._open_wal(wal, segment_bytes, repair, wal_capacity,
                                           create=self._meta.get(STORAGE_KEY) is None)
            for entry in self.catalog.load().values():
                rel = self._register(entry, self.traces.load(entry.id))
                self._max_time = max(self._max_time, rel.trace.upper - 1,
                                     *(p.upper - 1 for p in rel.trace.pending))
            if not replicas:
                self._check_log_reaches_traces()
            if hasattr(self._log, "latency_observer"):
                self._log.latency_observer = self.metrics.quorum_latency.observe
            self._recover()
            if self._record_storage is not None:
                self._meta.compare_and_set(STORAGE_KEY, *self._record_storage)
            self.locks = LockTable(self._lock_slots, floor=self._max_time)
            self.swept = self.traces.sweep_orphans(self._referenced_blobs())
            if compact:
                self._compacter = cmp.Compacter(self._background_pass, compact_interval, clock=clock)
                self._segment_age = cmp.SegmentAge(self._compacter.clock.current_time())
                self._compacter.start()
                self._log.set_finish_listener(self._compacter.notify)
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
            from sediment.engine.metadata.journal import JournalMetadataStore

            return JournalMetadataStore(os.path.join(self.data_dir, "meta"))
        if isinstance(metadata, str):
            from sediment.engine.metadata.open_store import open_metadata_store

            return open_metadata_store(metadata)
        return metadata

    def _storage_config(self, given: dict[str, Any]) -> dict[str, Any]:
        """Where this engine's log and batches live, as recorded when the data directory was
        created. Options left out are filled in from the record, so ``sediment read`` on a
        directory made with ``wal="device:..."`` or ``blob="s3://..."`` reads the same
        storage; an option that contradicts the record is refused rather than silently
        opening an empty log or store."""
        import json

        wal = given.get("wal")
        if isinstance(wal, str) and wal.startswith("device:"):
            given["wal"] = "device:" + os.path.abspath(wal[len("device:"):])
        got = self._meta.get(STORAGE_KEY)
        recorded = json.loads(got.value) if got is not None else {}
        for key, value in given.items():
            if value is None or value == "<object>":
                continue
            if key in recorded and recorded[key] != value and key != "s3_endpoint":
                raise InvalidArgument(
                    f"{self.data_dir} was created with {key}={recorded[key]!r}, not {value!r}; open it with the "
                    f"same {key} (or leave it out: the recorded one is used)")
        merged = {**recorded, **{k: v for k, v in given.items() if v is not None and v != "<object>"}}
        if "engine_id" not in merged:  # this engine's identity: owner of its blob prefix (blob/owner.py)
            import uuid

            merged["engine_id"] = uuid.uuid4().hex
        if got is None or merged != recorded:  # recorded once the engine has opened with it
            self._record_storage = (json.dumps(merged, sort_keys=True).encode(), None if got is None else got.version)
        return merged

    def _open_blobs(self, blob: Any, s3_endpoint: str | None):
        if blob is None:
            blob = "file://" + os.path.join(self.data_dir, "blobs")
        self.blob_uri = blob if isinstance(blob, str) else None
        self.s3_endpoint = s3_endpoint
        if isinstance(blob, str):
            from sediment.blob.uri import open_blob_store

            return open_blob_store(blob, s3_endpoint=s3_endpoint) if blob.startswith("s3://") else \
                open_blob_store(blob)
        return blob

    def _check_log_reaches_traces(self) -> None:
        """A trace that took the log's records up to ``wal_through`` proves the log reached that
        LSN; a log that ends before it was replaced or lost its tail (an older copy restored,
        a fresh log in place of the old one): refuse rather than append over the gap."""
        end = self._log.end_lsn
        for rel in self._by_id.values():
            if rel.trace.wal_through > end:
                raise WalMissing(f"{self.data_dir}: relation {rel.entry.name!r} has the log's records up to LSN "
                                 f"{rel.trace.wal_through} in its trace, but the write-ahead log ends at LSN {end}: "
                                 "the log lost its end or was replaced. Restore it", reason="log behind trace",
                                 first_lsn=end, last_lsn=rel.trace.wal_through - 1)

    def _check_meta_present(self) -> None:
        """A journal metadata directory that is gone while the log survives would open as a fresh,
        empty catalog over acknowledged data: refuse instead."""
        wal_dir = os.path.join(self.data_dir, "wal")
        if not os.path.isdir(os.path.join(self.data_dir, "meta")) and os.path.isdir(wal_dir) and os.listdir(wal_dir):
            raise MetadataMissing(f"{self.data_dir}: the metadata directory meta/ is missing while the write-ahead "
                                  f"log {wal_dir} exists; restore meta/ (opening would start an empty catalog)")

    def _open_wal(self, wal: str, segment_bytes: int, repair: bool, capacity: int | None, *,
                  create: bool = False) -> WriteAheadLog:
        """``create``: this is the first open of the data directory (no storage record in its
        metadata), the only time a new log may be made; later opens expect the log."""
        if wal == "file":
            from sediment.wal.file_log import FileLog

            try:
                log_ = FileLog.open(os.path.join(self.data_dir, "wal"), segment_bytes=segment_bytes,
                                    repair=repair, create=create)
            except WalCorruption as exc:  # name the relations whose records the lost range held
                if not getattr(exc, "problems", None):
                    raise
                from sediment.wal.log_reader import refusal

                names = {e.id: e.name for e in self.catalog.load().values()}
                raise refusal(exc.directory, exc.problems, names) from None
            if create and log_.end_lsn > 0:
                log_.close()
                raise MetadataMissing(f"{self.data_dir}: the metadata has no storage record, but the write-ahead "
                                      f"log holds LSNs up to {log_.end_lsn - 1}: the metadata was lost or "
                                      "replaced; restore it (opening would lose every acknowledged update)")
            return log_
        if isinstance(wal, str) and wal.startswith("device:") and len(wal) > len("device:"):
            from sediment.wal.device.log import DeviceLog

            path = wal[len("device:"):]
            if capacity is None and not os.path.exists(path):
                raise ValueError(f"{wal!r} does not exist yet: pass wal_capacity=<bytes> to create the ring")
            return DeviceLog.open(path, capacity, create=create, segment_bytes=segment_bytes, repair=repair)
        raise ValueError(f"unknown wal option {wal!r}: use 'file' or 'device:<path>'")

    def _register(self, entry: RelationEntry, trace: TraceState | None = None) -> _Relation:
        trace = trace or TraceState(entry.id)
        rel = _Relation(entry, update_schema(entry.schema), trace, feed=FeedLog())
        rel.sealed = rel.sealed_durable = trace.upper - 1
        self._relations[entry.name] = rel
        self._by_id[entry.id] = rel
        return rel

    def _referenced_blobs(self) -> set[str]:
        return {k for rel in self._relations.values() for k in rel.trace.keys()}

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
        self.metrics.group_commit.observe(len(records))
        with self._lock:
            cache = self._bodies
            for r in records:
                self._apply(r)
                if r.kind == RecordKind.UPDATES:
                    cache.put(r.lsn, r.body, len(r.body))

    def _apply(self, r: Record) -> None:
        kind = r.kind
        if kind == RecordKind.UPDATES:
            entry = TailEntry(r.lsn, r.t_lo, r.t_hi, r.count, len(r.body))
            if r.txn_id == 0:
                self._add_tail(r.relation_id, entry)
            else:
                self._open_txns.setdefault(r.txn_id, []).append((r.relation_id, entry))
                self._txn_first.setdefault(r.txn_id, r.lsn)
                self._backlog.add(entry.bytes)
        elif kind == RecordKind.PROGRESS:
            rel = self._by_id.get(r.relation_id)
            if rel is not None and r.lsn >= rel.trace.wal_through:
                rel.sealed = max(rel.sealed, r.t_hi)
                rel.sealed_durable = max(rel.sealed_durable, r.t_hi)
                rel.progress.append((r.lsn, r.t_hi))
                rel.feed.add(PROGRESS, r.lsn, r.t_hi)
        elif kind == RecordKind.BEGIN:
            self._open_txns.setdefault(r.txn_id, [])
            self._txn_first.setdefault(r.txn_id, r.lsn)
        elif kind == RecordKind.COMMIT:
            for txn in committed_txn_ids(r) if r.body else (r.txn_id,):
                self._txn_first.pop(txn, None)
                for rel_id, entry in self._open_txns.pop(txn, []):
                    self._backlog.remove(entry.bytes)
                    self._add_tail(rel_id, entry)
        elif kind == RecordKind.ABORT:
            self._txn_first.pop(r.txn_id, None)
            self._backlog.remove(sum(e.bytes for _rid, e in self._open_txns.pop(r.txn_id, [])))

    def _add_tail(self, rel_id: int, entry: TailEntry) -> None:
        rel = self._by_id.get(rel_id)
        if entry.t_hi > self._max_time:
            self._max_time = entry.t_hi
        if rel is not None and entry.lsn >= rel.trace.wal_through:  # below it: already in the trace
            rel.tail.append(entry)
            rel.feed.add(UPDATES, entry.lsn)
            self._backlog.add(entry.bytes)

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
        with self._compact_lock, self._lock:
            rel = self._rel(name)
            self.catalog.drop(rel.entry)
            del self._relations[name]
            del self._by_id[rel.entry.id]
            self._backlog.remove(sum(e.bytes for e in rel.tail))
            self._garbage += rel.trace.keys()
            try:
                self._meta.delete(f"trace/{rel.entry.id:016x}")
            except Exception as exc:  # noqa: BLE001 - the start-up sweep removes what is left
                log.warning("could not delete the trace state of dropped relation %r: %s", name, exc)
        self._collect()

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

    def _encode(self, rel: _Relation, table: pa.Table, txn_id: int,
                bounds: tuple[int, int] | None = None) -> list[Record]:
        """UPDATES records of at most ``max_record_bytes`` each (Arrow IPC record batches)."""
        if table.num_rows <= 64 and len(table.column(0).chunks) == 1:  # small appends: one record, no sizing
            batch = table.to_batches()[0]
            lo, hi = bounds or time_range(table)
            return [Record(RecordKind.UPDATES, rel.entry.id, txn_id, lo, hi, batch.num_rows, batch.serialize())]
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

    def _prepare(self, name: str, updates: object) -> tuple[_Relation, pa.Table, tuple[int, int] | None]:
        rel = self._relations.get(name) if isinstance(name, str) and not self._closed else None  # re-checked under the lock
        if rel is None:
            with self._lock:
                rel = self._rel(name)
        table, bounds = conform_updates(name, rel.entry.schema, updates, rel.update_schema)
        return rel, table, bounds

    def _admit(self, rel: _Relation, name: str, bounds: tuple[int, int] | int | None) -> None:
        """Under the lock: the relation still exists and the times are not sealed."""
        t_min = bounds[0] if isinstance(bounds, tuple) else bounds
        if self._relations.get(name) is not rel:
            raise UnknownRelation(f"relation {name!r} was dropped while the append was being prepared")
        if t_min is not None and t_min <= rel.sealed:
            raise TimeAlreadySealed(
                f"relation {name!r} is sealed through time {rel.sealed}, but the updates include time {t_min}; "
                f"append at times > {rel.sealed}"
            )

    def append(self, name: str, updates: pa.Table, *, locks: Locks | None = None) -> None:
        """Append updates: the relation's columns plus ``time`` (int64 >= 0, above the sealed
        frontier) and ``diff`` (int64). Returns once they are durable. All or nothing.

        With ``locks``, the append is refused with LockConflict (writing nothing) when a
        write- or read-locked id was written after ``locks.high_water``; its write and
        append locks record the append's greatest time."""
        start = time.perf_counter()
        args.check_locks(locks)
        rel, table, bounds = self._prepare(name, updates)
        if table.num_rows == 0:
            return
        records = self._encode(rel, table, 0, bounds)
        if len(records) > 1:  # too big for one record: make it one transaction
            txn = self._next_txn_id()
            for r in records:
                r.txn_id = txn
            records = [Record(RecordKind.BEGIN, txn_id=txn), *records, Record(RecordKind.COMMIT, txn_id=txn)]
        with self._lock:
            self._wait_backlog(records)
            self._check_open()
            self._admit(rel, name, bounds)
            if locks is not None:
                self.locks.check_and_record(locks, bounds[1])
            ticket = self._log.submit(records, self._on_durable)
        ticket.wait()
        self._count_append(start, {name: table.num_rows})

    def append_many(self, updates: Mapping[str, pa.Table], *, locks: Locks | None = None) -> None:
        """Append to several relations atomically: after a crash, all or none are there.
        ``locks`` as for :meth:`append`, checked once for the whole append."""
        start = time.perf_counter()
        args.check_locks(locks)
        args.check_updates_map(updates)
        txn = self._next_txn_id()
        prepared = [(name, *self._prepare(name, table)) for name, table in updates.items()]
        records = [Record(RecordKind.BEGIN, txn_id=txn)]
        for _name, rel, table, _t in prepared:
            records += self._encode(rel, table, txn)
        records.append(Record(RecordKind.COMMIT, txn_id=txn))
        if len(records) == 2:
            return
        with self._lock:
            self._wait_backlog(records)
            self._check_open()
            for name, rel, _table, t_min in prepared:
                self._admit(rel, name, t_min)
            if locks is not None:
                self.locks.check_and_record(locks, max(b[1] for *_r, b in prepared if b is not None))
            ticket = self._log.submit(records, self._on_durable)
        ticket.wait()
        self._count_append(start, {name: table.num_rows for name, _rel, table, _t in prepared})

    def _count_append(self, start: float, rows: Mapping[str, int]) -> None:
        m = self.metrics
        m.append_latency.observe(time.perf_counter() - start)
        for name, n in rows.items():
            m.appends.labels(relation=name).inc()
            m.rows.labels(relation=name).inc(n)

    def transaction(self) -> Transaction:
        """A write transaction: appends to any relations, visible only after ``commit()``."""
        from sediment.engine.transaction import Transaction

        self._check_open()
        return Transaction(self, self._next_txn_id())

    def commit_all(self, transactions: Sequence[Transaction]) -> None:
        """Commit several open transactions of this engine as one: one COMMIT record names
        them all, so after any crash either all or none are visible. For writers that work
        in parallel pieces and pick the winners at the end (a Spark job's task attempts).
        Raises TransactionError and aborts them all if one is not open or one of their
        times was sealed meanwhile."""
        from sediment.engine.transaction import Transaction, commit_all

        if isinstance(transactions, (str, bytes, Mapping)) or not isinstance(transactions, Sequence) or \
                not all(isinstance(t, Transaction) for t in transactions):
            raise InvalidArgument(f"commit_all takes a list of Transaction objects from "
                                       f"Engine.transaction(), not {transactions!r}")
        commit_all(self, transactions)

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
        self.metrics.seals.labels(relation=name).inc()

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

    # --- closing -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the compacter, flush and release everything. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True  # appends waiting for the backlog wake and fail EngineClosed
            self._backlog.wake_all()
        if self._compacter is not None:
            self._compacter.stop()
        with self._compact_lock, self._lock:
            self._closed = True
            for rel in self._relations.values():
                rel.feed.close()
        self._release_all()

    def _release_all(self) -> None:
        if getattr(self, "_compacter", None) is not None:
            self._compacter.stop()
        for closer in (getattr(self, "_log", None), getattr(self, "_meta", None), getattr(self, "_blobs", None)):
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
