"""The coordinator: owns relations, appends updates and progress to the WAL, answers reads.

Every state change goes through the log first. The engine's in-memory view (each
relation's sealed frontier and the WAL records not yet compacted) is rebuilt on
open by replaying the log in bulk (engine/recovery.py), to exactly the state that
applying each record as it becomes durable (``_apply``) leaves: tests/test_recovery.py
holds the two against each other, so a restarted engine and a live one do not disagree.

Concurrency: callers may use one Engine from many threads. The engine lock guards
its view and makes check-then-submit atomic (an append at a time the relation has
just sealed is refused, never written), but nobody holds it while waiting for an
fdatasync, so concurrent appends share one group commit.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sediment._fs import makedirs_durable, remove_tree_durable
from sediment.clock import Clock, MonotonicClock
from sediment.engine import args, deploy, recovery, staged
from sediment.engine.backlog import (
    DEFAULT_MAX_WAL_BACKLOG,
    DEFAULT_WAL_BACKLOG_TIMEOUT,
    BodyCache,
    WalBacklog,
)
from sediment.engine.bookkeeping import OpenTxns, ReaderPins, Relations
from sediment.engine.catalog import Catalog
from sediment.engine.compaction import Compaction
from sediment.engine.feed import PROGRESS, UPDATES
from sediment.engine.frontiers import SealedFrontiers
from sediment.engine.locks import DEFAULT_SLOTS, Locks, LockTable
from sediment.engine.memory import configure_memory_pool
from sediment.engine.merger import DEFAULT_MAJOR_COMPACTION_QUIET, BackgroundMerger
from sediment.engine.opening import Opening
from sediment.engine.reads import Reads
from sediment.engine.relation import ReadPlan, TailEntry, _check_time, _Relation  # noqa: F401  (ReadPlan re-exported)
from sediment.engine.relation_ops import RelationOps
from sediment.engine.schema import conform_updates, time_range
from sediment.engine.transaction import Admission, Transaction, commit_all
from sediment.errors import (
    FrontierRegression,
    InvalidArgument,
    MetadataMissing,
    TimeAlreadySealed,
    UnknownRelation,
    WalCorruption,
    WalMissing,
)
from sediment.metadata import names
from sediment.metadata.protocol import MetadataStore
from sediment.metrics import CountingBlobStore, EngineMetrics
from sediment.trace import compacter as cmp
from sediment.trace.planner import DEFAULT_MAX_PENDING_RUNS
from sediment.trace.store import TraceStore
from sediment.wal.protocol import Ticket, WriteAheadLog
from sediment.wal.record import Record, RecordKind, committed_txn_ids

DEFAULT_MAX_RECORD_BYTES = 8 << 20
DEFAULT_MEMORY_BOUND = 256 << 20
STORAGE_KEY = names.STORAGE
log = logging.getLogger(__name__)
# Record kinds as plain names: an enum member's attribute access costs ~0.3 us, paid per record written
_UPDATES, _PROGRESS, _BEGIN, _COMMIT, _ABORT = (RecordKind.UPDATES, RecordKind.PROGRESS, RecordKind.BEGIN,
                                                RecordKind.COMMIT, RecordKind.ABORT)


class Engine(Opening, RelationOps, Reads, Compaction):
    """A sediment engine over one data directory. Open with :func:`sediment.open` (:meth:`open`)."""

    def __init__(self, data_dir: str, *, metadata_spec: str | None = None,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES, merge_factor: float = 2.0,
                 memory_bound: int = DEFAULT_MEMORY_BOUND, lock_slots: int = DEFAULT_SLOTS,
                 compact_interval: float | None = 5.0, clock: Clock | None = None,
                 max_wal_backlog: int | None = None,
                 wal_backlog_timeout: float = DEFAULT_WAL_BACKLOG_TIMEOUT,
                 major_compaction_quiet: float | None = DEFAULT_MAJOR_COMPACTION_QUIET) -> None:
        """An engine not opened yet: only its settings and empty state, no I/O. :meth:`open`
        (through :func:`sediment.open`) makes one and opens its storage."""
        self.data_dir = data_dir
        self.metadata_spec = metadata_spec
        self.superseded: Exception | None = None  # set when a newer coordinator fenced this one
        self.superseded_listeners: list = []
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._lock = threading.RLock()
        self._compact_lock = threading.Lock()
        self._merge_lock = threading.Lock()
        self._backlog = WalBacklog(self._lock, max_wal_backlog, wal_backlog_timeout)
        self._max_pending_runs = DEFAULT_MAX_PENDING_RUNS
        self._closed = False
        self._max_record_bytes = max(1024, int(max_record_bytes))
        self._merge_factor = merge_factor
        self._memory_bound = max(1 << 20, int(memory_bound))
        self._bodies = BodyCache(self._memory_bound // 2)
        self._lock_slots = lock_slots
        self._compact_interval = compact_interval
        self._major_quiet = major_compaction_quiet
        self._opened_at = self._clock.current_time()  # a relation's quiet time counts from here after a restart
        self._relations = Relations()
        self._txns = OpenTxns()
        self._readers = ReaderPins(self._clock)
        self._max_time = -1  # greatest time of any durable update seen (the lock table's floor)
        self._garbage: list[str] = []
        self._merging = 0  # merges under way (engine/merger.py): replaced blobs wait for them
        self._compaction_failures: dict[tuple[str, str], tuple[str, int]] = {}  # (name, step) -> (error, attempts)
        self._trim_to: int | None = None
        self._record_storage: tuple[bytes, int | None] | None = None
        self._segment_age = cmp.SegmentAge()
        self._epoch = 0
        self._txn_counter = 0
        self.metrics = EngineMetrics()
        self.metrics.watch_state(self.stats)
        # Opened by open(), in this order; close() releases whichever were.
        self._lock_fd: int | None = None
        self._meta: MetadataStore | None = None
        self._blobs: CountingBlobStore | None = None
        self._log: WriteAheadLog | None = None
        self._compacter: cmp.Compacter | None = None
        self._merger: BackgroundMerger | None = None
        self.blob_uri: str | None = None
        self.s3_endpoint: str | None = None
        self.traces: TraceStore | None = None
        self.catalog: Catalog | None = None
        self.locks: LockTable | None = None
        self.swept: list[str] = []

    @classmethod
    def open(
        cls,
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
        clock: Clock | None = None,
        take_over_blob_prefix: bool = False,
        max_wal_backlog: int | None = DEFAULT_MAX_WAL_BACKLOG,
        wal_backlog_timeout: float = DEFAULT_WAL_BACKLOG_TIMEOUT,
        major_compaction_quiet: float | None = DEFAULT_MAJOR_COMPACTION_QUIET,
    ) -> Engine:
        """Open (creating if needed) the engine on ``data_dir``: see :func:`sediment.open`.
        Options are checked, and a replicated engine's marker read, before anything is
        created; a failure part-way releases whatever was opened, and removes the data
        directory again if this open created it."""
        args.check_open_options({k: v for k, v in locals().items() if k not in ("cls", "data_dir")})
        data_dir = os.path.abspath(args.check_data_dir(data_dir))
        configure_memory_pool(arrow_memory_pool)
        marker = deploy.check_opening(data_dir, metadata)  # before anything is created
        if metadata is None and marker is not None:
            metadata = marker  # a replicated engine's directory names its metadata store
        created = makedirs_durable(data_dir)
        engine = cls(data_dir, metadata_spec=metadata if isinstance(metadata, str) else None,
                     max_record_bytes=max_record_bytes, merge_factor=merge_factor, memory_bound=memory_bound,
                     lock_slots=lock_slots, compact_interval=compact_interval, clock=clock,
                     max_wal_backlog=max_wal_backlog if compact else None,
                     wal_backlog_timeout=wal_backlog_timeout, major_compaction_quiet=major_compaction_quiet)
        try:
            engine._open(metadata, marker, {"wal": wal, "wal_capacity": wal_capacity, "replicas": replicas,
                                            "cluster_key": cluster_key, "blob": blob, "s3_endpoint": s3_endpoint},
                         segment_bytes=segment_bytes, repair=repair, compact=compact,
                         take_over_blob_prefix=take_over_blob_prefix)
        except BaseException:
            locked = engine._lock_fd is not None
            engine._release_all()
            if created is not None and locked and metadata is None:  # a failed first open leaves nothing
                remove_tree_durable(created)
            raise
        return engine

    def _open(self, metadata: str | MetadataStore | None, marker: str | None, storage: dict[str, Any], *,
              segment_bytes: int, repair: bool, compact: bool, take_over_blob_prefix: bool) -> None:
        """Take the data directory's lock, open the metadata, blob store and log, load the
        relations, replay the log, then start the compacter."""
        self._lock_fd = self._take_lock()
        if metadata is None:
            self._check_meta_present()
        self._meta = self._open_metadata(metadata)
        blob = storage["blob"]
        stored = self._storage_config({**storage, "blob": blob if isinstance(blob, str) or blob is None
                                       else "<object>"})
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
        if replicas:
            from sediment.wal.replication.replicated_log import ReplicatedLog

            if metadata is None:
                raise ValueError("replicas=[...] needs a shared metadata store, e.g. "
                                 "metadata='zk://127.0.0.1:2181/sediment'")
            self._log = ReplicatedLog.open(list(replicas), self._meta, 0, cluster_key, segment_bytes=segment_bytes,
                                           owner=deploy.owner_name(self.data_dir), clock=self._clock)
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
        staged.sweep_staging(self)  # bulk loads staged before this open cannot commit any more
        if compact:
            self._merger = BackgroundMerger(self._merge_pass)
            self._compacter = cmp.Compacter(self._background_pass, self._compact_interval, clock=self._clock)
            self._segment_age = cmp.SegmentAge(self._compacter.clock.current_time())
            self._compacter.start()
            self._log.set_finish_listener(self._compacter.notify)
            if hasattr(self._clock, "on_advance"):  # a clock moved by hand: the compacter looks again
                self._clock.on_advance(self._compacter.tick)

    # --- opening -------------------------------------------------------------------------------

    def _check_log_reaches_traces(self) -> None:
        """A trace that took the log's records up to ``wal_through`` proves the log reached that
        LSN; a log that ends before it was replaced or lost its tail (an older copy restored,
        a fresh log in place of the old one): refuse rather than append over the gap."""
        end = self._log.end_lsn
        for rel in self._relations.values():
            if rel.trace.wal_through > end:
                raise WalMissing(f"{self.data_dir}: relation {rel.entry.name!r} has the log's records up to LSN "
                                 f"{rel.trace.wal_through} in its trace, but the write-ahead log ends at LSN {end}: "
                                 "the log lost its end or was replaced. Restore it", reason="log behind trace",
                                 first_lsn=end, last_lsn=rel.trace.wal_through - 1)

    def _open_wal(self, wal: str, segment_bytes: int, repair: bool, capacity: int | None, *,
                  create: bool = False) -> WriteAheadLog:
        """``create``: this is the first open of the data directory (no storage record in its
        metadata), the only time a new log may be made; later opens expect the log."""
        if wal == "file":
            from sediment.wal.file_log import FileLog

            try:
                log_ = FileLog.open(os.path.join(self.data_dir, "wal"), segment_bytes=segment_bytes,
                                    repair=repair, create=create, keep_recovered=True)
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

    def _recover(self) -> None:
        """Replay the log; the PROGRESS and FRONTIERS records (the first kept record of a
        trimmed log is one) give each relation's sealed frontier, which the log carries
        across segment boundaries from then on (engine/frontiers.py)."""
        book = SealedFrontiers()
        take = getattr(self._log, "recovered", None)  # what the log's own open verified: no second read
        records = take() if take is not None else None
        done = recovery.replay(records if records is not None else map(recovery.head_of, self._log.scan()),
                               self._relations, self._txns, book)  # in bulk: what _apply would do, per record
        self._max_time = max(self._max_time, done.max_time)
        self._backlog.add(done.backlog)
        for rel_id, t in book.frontiers().items():
            rel = self._relations.by_id(rel_id)
            if rel is not None:
                rel.sealed = rel.sealed_durable = max(rel.sealed, t)
        self._log.set_preamble(book)
        dangling = self._txns.ids()
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
        if kind == _UPDATES:
            entry = TailEntry(r.lsn, r.t_lo, r.t_hi, r.count, r.body_len)
            if r.txn_id == 0:
                rel = self._add_tail(r.relation_id, entry)
                if rel is not None:
                    rel.counters.add(r.count)
            else:
                self._txns.add(r.txn_id, r.lsn, r.relation_id, entry)
                self._backlog.add(entry.bytes)
        elif kind == _PROGRESS:
            rel = self._relations.by_id(r.relation_id)
            if rel is not None and r.lsn >= rel.trace.wal_through:
                rel.sealed = max(rel.sealed, r.t_hi)
                rel.sealed_durable = max(rel.sealed_durable, r.t_hi)
                rel.progress.append((r.lsn, r.t_hi))
                rel.feed.add(PROGRESS, r.lsn, r.t_hi)
        elif kind == _BEGIN:
            self._txns.begin(r.txn_id, r.lsn)
        elif kind == _COMMIT:
            for txn in committed_txn_ids(r) if r.body else (r.txn_id,):
                written: dict[int, tuple[_Relation, int]] = {}  # one commit counts once per relation
                for rel_id, entry in self._txns.finish(txn):
                    self._backlog.remove(entry.bytes)
                    rel = self._add_tail(rel_id, entry)
                    if rel is not None:
                        written[rel_id] = (rel, written.get(rel_id, (rel, 0))[1] + entry.rows)
                for rel, rows in written.values():
                    rel.counters.add(rows)
        elif kind == _ABORT:
            self._backlog.remove(sum(e.bytes for _rid, e in self._txns.finish(r.txn_id)))

    def _add_tail(self, rel_id: int, entry: TailEntry) -> _Relation | None:
        """Make a durable, committed record visible; the relation it was added to, or None
        (dropped, or already in the trace). Every durable append passes here, so its callers count it."""
        rel = self._relations.by_id(rel_id)
        if entry.t_hi > self._max_time:
            self._max_time = entry.t_hi
        if rel is not None and entry.lsn >= rel.trace.wal_through:  # below it: already in the trace
            rel.tail.append(entry)
            rel.feed.add(UPDATES, entry.lsn)
            self._backlog.add(entry.bytes)
            return rel
        return None

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
        self.metrics.append_latency.observe(time.perf_counter() - start)

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
        self.metrics.append_latency.observe(time.perf_counter() - start)

    def transaction(self) -> Transaction:
        """A write transaction: appends to any relations, visible only after ``commit()``."""
        self._check_open()
        return Transaction(self, self._next_txn_id())

    def commit_all(self, transactions: Sequence[Transaction]) -> None:
        """Commit several open transactions of this engine as one: one COMMIT record names
        them all, so after any crash either all or none are visible. For writers that work
        in parallel pieces and pick the winners at the end (a Spark job's task attempts).
        Raises TransactionError and aborts them all if one is not open or one of their
        times was sealed meanwhile."""
        if isinstance(transactions, (str, bytes, Mapping)) or not isinstance(transactions, Sequence) or \
                not all(isinstance(t, Transaction) for t in transactions):
            raise InvalidArgument(f"commit_all takes a list of Transaction objects from "
                                       f"Engine.transaction(), not {transactions!r}")
        commit_all(self, transactions)

    # The two calls a Transaction makes (engine/transaction.py TxnEngine); nothing else of
    # the engine is visible to it.

    def _txn_records(self, name: str, updates: pa.Table, txn_id: int) -> tuple[Admission, list[Record]] | None:
        """The UPDATES records of a transaction's append, and what to check when they are
        submitted; None when there is nothing to append."""
        rel, table, bounds = self._prepare(name, updates)
        if table.num_rows == 0:
            return None
        return (rel, name, bounds[0]), self._encode(rel, table, txn_id, bounds)

    def _txn_submit(self, records: list[Record], admit: Sequence[Admission] | None = None,
                    refused: list[Record] | None = None) -> tuple[Ticket, BaseException | None]:
        """Submit a transaction's records. With ``admit``: under the engine lock, once the
        engine is open and each relation still exists and is not sealed at the least time
        written to it; if one is and ``refused`` is given, ``refused`` is submitted instead
        and the error returned (else raised). Without: at once (an ABORT needs no check)."""
        if admit is None:
            return self._log.submit(records, self._on_durable), None
        with self._lock:
            self._wait_backlog(records)
            self._check_open()
            try:
                for rel, name, t_min in admit:
                    self._admit(rel, name, t_min)
            except (TimeAlreadySealed, LookupError) as exc:
                if refused is None:
                    raise
                return self._log.submit(refused, self._on_durable), exc
            return self._log.submit(records, self._on_durable), None

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
        if self._merger is not None:
            self._merger.stop()
        with self._compact_lock, self._lock:
            self._closed = True
            for rel in self._relations.values():
                rel.feed.close()
        self._release_all()

    def _release_all(self) -> None:
        """Release whatever :meth:`open` got to (every resource starts as None)."""
        if self._compacter is not None:
            self._compacter.stop()
        if self._merger is not None:
            self._merger.stop()
        for closer in (self._log, self._meta, self._blobs):
            if closer is not None:
                try:
                    closer.close()
                except Exception:  # noqa: BLE001 - keep releasing the rest
                    pass
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

