"""The coordinator: owns relations, appends updates and progress to the WAL, answers reads.

Every state change goes through the log first. The engine's in-memory view (each
relation's sealed frontier and the WAL records not yet compacted) is rebuilt on
open by replaying the log in bulk (engine/log_replay.py), to exactly the state that
applying each record as it becomes durable (``RelationView.apply``) leaves:
tests/engine/test_recovery.py holds the two against each other, so a restarted engine and a
live one do not disagree.

The Engine is a facade over components that each own their state and get what they
need passed in: the relation view (engine/view.py), the writer (engine/writer.py), the
relation registry (engine/relation_registry.py), compaction (engine/compaction.py),
garbage collection (engine/collector.py), reads (engine/reads.py) and the background
scheduler (engine/scheduler.py); its stores are engine/storage.py's, its directory
engine/data_dir.py's. Its public methods are theirs, forwarded with their signatures
and docstrings.

Concurrency: callers may use one Engine from many threads. The engine lock guards
its view and makes check-then-submit atomic (an append at a time the relation has
just sealed is refused, never written), but nobody holds it while waiting for an
fdatasync, so concurrent appends share one group commit.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from sediment._fs import makedirs_durable, undo_makedirs
from sediment.blob.counting import counting
from sediment.clock import Clock, MonotonicClock
from sediment.engine import args, log_replay, staged, takeover
from sediment.engine.backlog import (
    DEFAULT_MAX_WAL_BACKLOG,
    DEFAULT_WAL_BACKLOG_TIMEOUT,
    BodyCache,
    WalBacklog,
)
from sediment.engine.catalog import Catalog
from sediment.engine.collector import Collector, ReaderPins
from sediment.engine.compaction import DEFAULT_MAJOR_COMPACTION_QUIET, Compaction, CompactionSettings
from sediment.engine.data_dir import (
    DataDir,
    check_marker,
    check_not_member,
    traces_past_log,
    write_marker,
)
from sediment.engine.frontiers import SealedFrontiers
from sediment.engine.locks import DEFAULT_SLOTS, Locks, LockTable
from sediment.engine.memory import configure_memory_pool
from sediment.engine.read_plan import ReadPlan  # noqa: F401  (re-exported)
from sediment.engine.reads import Reads
from sediment.engine.relation import is_internal
from sediment.engine.relation_registry import RelationRegistry
from sediment.engine.scheduler import Scheduler
from sediment.engine.schema import check_name
from sediment.engine.stats import engine_stats
from sediment.engine.storage import Storage
from sediment.engine.view import RelationView
from sediment.engine.writer import Writer
from sediment.errors import (
    CompactionFailed,  # noqa: F401  (Engine.compact raises it)
    CoordinatorSuperseded,
    CreatedConcurrently,
    SedimentError,
    SessionFenced,
    WalFenced,
)
from sediment.metadata.fence import Fence
from sediment.metadata.open_store import with_s3_endpoint
from sediment.metadata.protocol import MetadataStore
from sediment.metrics import EngineMetrics
from sediment.trace.runs import RunStats
from sediment.trace.store import TraceStore
from sediment.wal.protocol import WriteAheadLog
from sediment.wal.record import Record, RecordKind

DEFAULT_MAX_RECORD_BYTES = 8 << 20
DEFAULT_MEMORY_BOUND = 256 << 20
# What a log or metadata store raises once another coordinator took it over (claimed the log).
_FENCED = (CoordinatorSuperseded, SessionFenced, WalFenced)


def _forward(component: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """An Engine method that calls the same method of the component it holds as
    ``component``, with that method's name, signature and docstring."""
    name = method.__name__

    def call(self: Engine, *a: Any, **kw: Any) -> Any:
        return getattr(getattr(self, component), name)(*a, **kw)

    return functools.wraps(method)(call)


class Engine:
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
        self.superseded_listeners: list = []
        self.takeover_expected = False  # handing over on purpose: the fence that ends it is no error
        self.fence_lock = threading.Lock()  # orders a fence against the end of the open (engine/takeover.py)
        self.opening = True
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self.metrics = EngineMetrics()
        memory_bound = max(1 << 20, int(memory_bound))
        lock = threading.RLock()
        self.view = RelationView(data_dir, lock, WalBacklog(lock, max_wal_backlog, wal_backlog_timeout, self.clock),
                                 BodyCache(memory_bound // 2), self.metrics.group_commit.observe)
        self.metrics.group_commit.count_also(1, lambda: self.view.lone_groups)
        self.failed_listeners = self.view.failed_listeners  # called with EngineFailed (engine/view.py fail)
        self.settings = CompactionSettings(compact_interval, merge_factor, memory_bound,
                                           major_quiet=major_compaction_quiet)
        self._max_record_bytes = max(1024, int(max_record_bytes))
        self._lock_slots = lock_slots
        self._opened_at = self.clock.current_time()  # a relation's quiet time counts from here after a restart
        self.metrics.watch_state(self.stats)
        # Set by open(), in this order; close() releases whichever were.
        self.storage = Storage(DataDir(data_dir))
        self.traces: TraceStore | None = None
        self.catalog: Catalog | None = None
        self.registry: RelationRegistry | None = None
        self.locks: LockTable | None = None
        self.writer: Writer | None = None
        self.collector: Collector | None = None
        self.compaction: Compaction | None = None
        self.reads: Reads | None = None
        self.wal: WriteAheadLog | None = None
        self.read_stats: RunStats | None = None  # counters of consolidation on read, for tests and operators
        self.scheduler: Scheduler | None = None
        self.frontiers: SealedFrontiers | None = None  # each live relation's sealed frontier in the log
        self.swept: list[str] = []
        self.blob_uri: str | None = None  # where the batches live, once open
        self.s3_endpoint: str | None = None

    @classmethod
    def open(
        cls,
        data_dir: str | os.PathLike[str],
        *,
        wal: str | None = None,
        wal_capacity: int | None = None,
        replicas: list[str] | None = None,
        cluster_key: str | None = None,
        log_partition: int | None = None,
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
        directory again if this open created it, or empties it again if it was empty (unless
        the storage record was written: the directory kept then is a new, empty engine's)."""
        args.check_open_options({k: v for k, v in locals().items() if k not in ("cls", "data_dir")})
        data_dir = os.path.abspath(args.check_data_dir(data_dir))
        if isinstance(metadata, str):  # s3_endpoint reaches the metadata too (and so the marker names it)
            metadata = with_s3_endpoint(metadata, s3_endpoint)
        configure_memory_pool(arrow_memory_pool)
        check_not_member(data_dir)  # before anything is created
        marker = check_marker(data_dir, metadata)
        if metadata is None and marker is not None:
            metadata = marker  # a replicated engine's directory names its metadata store
        settings = {"metadata_spec": metadata if isinstance(metadata, str) else None,
                    "max_record_bytes": max_record_bytes, "merge_factor": merge_factor, "memory_bound": memory_bound,
                    "lock_slots": lock_slots, "compact_interval": compact_interval, "clock": clock,
                    "max_wal_backlog": max_wal_backlog if compact else None, "wal_backlog_timeout": wal_backlog_timeout,
                    "major_compaction_quiet": major_compaction_quiet}
        given = {"wal": wal, "wal_capacity": wal_capacity, "replicas": replicas, "cluster_key": cluster_key,
                 "log_partition": log_partition, "blob": blob, "s3_endpoint": s3_endpoint}
        steps = {"segment_bytes": segment_bytes, "repair": repair, "compact": compact,
                 "take_over_blob_prefix": take_over_blob_prefix}
        try:
            return cls._open_attempt(data_dir, metadata, marker, settings, given, steps)
        except CreatedConcurrently as exc:  # the deployment exists now: open it as any coordinator would
            if not exc.winner_recorded or not isinstance(metadata, str):  # (a store object was closed with it)
                raise
            logging.getLogger(__name__).warning("%s: another coordinator created this deployment at the same time "
                                                "(%s); opening what it created", data_dir, exc.__cause__)
        return cls._open_attempt(data_dir, metadata, marker, settings, given, steps)

    @classmethod
    def _open_attempt(cls, data_dir: str, metadata: str | MetadataStore | None, marker: str | None,
                      settings: dict[str, Any], given: dict[str, Any], steps: dict[str, Any]) -> Engine:
        """One open (see :meth:`open`). CreatedConcurrently when it was creating the deployment and
        failed because another coordinator was creating it too: ``winner_recorded`` when the
        other's storage record is there now, else the other took the log over from this open
        (fenced it) before either recorded the deployment."""
        was_empty = os.path.isdir(data_dir) and not os.listdir(data_dir)
        created = makedirs_durable(data_dir)
        engine = None
        try:
            engine = cls(data_dir, **settings)
            engine._open(metadata, marker, dict(given), **steps)
        except BaseException as exc:
            # All in a directory this open made (or found empty) and locked is its own, unless an engine was
            # made in it before the lock was taken (another open), or the storage record was written (then
            # a shared store or a blob prefix's owner marker may refer to it).
            st = engine.storage if engine is not None else None
            whole = st is not None and st.lock_fd is not None and st.fresh and not st.recorded
            raced = isinstance(exc, SedimentError) and st is not None and st.created_elsewhere()
            lost = (not raced and st is not None and st.created and not st.recorded
                    and (engine.superseded is not None or isinstance(exc, _FENCED)))
            if engine is not None:
                engine._release_all()
            if created is not None or was_empty:
                with contextlib.suppress(OSError):  # the open's own error is the one to report
                    undo_makedirs(created, data_dir, whole=whole)
            where = f"the deployment whose metadata is {settings['metadata_spec'] or 'the given store'}"
            if raced:
                raise CreatedConcurrently(
                    f"{data_dir}: another coordinator created {where} at the same time as this open, which then "
                    f"failed ({type(exc).__name__}: {exc}); this open wrote no storage record and serves nothing: "
                    "open it again", winner_recorded=True) from exc
            if lost:
                raise CreatedConcurrently(
                    f"{data_dir}: another coordinator took over the log of {where} while this open was creating "
                    f"it, before either wrote its storage record ({type(exc).__name__}: {exc}); this open wrote "
                    "none and serves nothing: open it again (it then opens what the other created)") from exc
            raise
        return engine

    def _open(self, metadata: str | MetadataStore | None, marker: str | None, given: dict[str, Any], *,
              segment_bytes: int, repair: bool, compact: bool, take_over_blob_prefix: bool) -> None:
        """Take the data directory's lock, open the metadata, blob store and log, load the
        relations, replay the log, then start the scheduler."""
        storage = self.storage
        storage.take_lock()
        missing = storage.dir.meta_missing() if metadata is None else None
        if missing is not None:
            raise missing
        meta = storage.open_metadata(metadata)
        blob = given["blob"]
        record = storage.settle_record({**given, "blob": blob if isinstance(blob, str) else None})
        if blob is None or isinstance(blob, str):  # else a store object, given for this open only
            blob = record.blob
        if record.replicas or record.wal_spec.kind == "s3":
            takeover.require_shared_blob(blob, self.data_dir, "a replicated engine" if record.replicas
                                         else "an engine with its log on S3")
        blobs = storage.open_blobs(blob, lambda store: counting(store, self.metrics))
        self.blob_uri, self.s3_endpoint = storage.blob_uri, storage.s3_endpoint
        fence = Fence()
        self.traces = TraceStore(meta, blobs, spill_dir=os.path.join(self.data_dir, "spill"), fence=fence)
        self.traces.sweep_spills()
        self.traces.check_owner(record.engine_id, storage.blob_uri or "<blob store object>",
                                take_over=take_over_blob_prefix, data_dir=self.data_dir)
        self.catalog = Catalog(meta, fence)
        self.registry = RelationRegistry(self.view, self.catalog, self.traces, meta, self.metrics)
        log_ = self._open_log(metadata, marker, segment_bytes, repair)
        shared = bool(record.replicas) or record.wal_spec.kind == "s3"  # another coordinator may be replaced
        self.catalog.shared = fence.shared = shared
        if shared:
            takeover.close_when_fenced(self, fence.on_replaced)
        epoch = self.catalog.next_epoch()  # after the claim, before the listing: metadata/fence.py
        entries = list(self.catalog.load(take_over=shared).values())
        traces = self.traces.load_many([e.id for e in entries], take_over=shared,
                                       required={e.id: e.name for e in entries if e.traced})
        for entry, trace in zip(entries, traces, strict=True):
            rel = self.registry.register(entry, trace)
            self.view.max_time = max(self.view.max_time, rel.trace.upper - 1,
                                      *(p.upper - 1 for p in rel.trace.pending))
        if not record.replicas:
            for problem in traces_past_log(self.data_dir, log_.end_lsn, ((r.entry.name, r.trace.wal_through)
                                                                         for r in self.view.relations.values())):
                raise problem  # refuse rather than append over the gap
        if hasattr(log_, "latency_observer"):
            log_.latency_observer = self.metrics.quorum_latency.observe
        self._recover(log_)
        takeover.refuse_if_superseded(self)
        storage.save_record()
        self.locks = LockTable(self._lock_slots, floor=self.view.max_time)
        self._start(log_, epoch, compact)
        self.swept = self.traces.sweep_orphans(self.registry.referenced_blobs())
        staged.sweep_staging(self.traces.blobs)  # bulk loads staged before this open cannot commit any more
        if self.scheduler is not None:
            self.scheduler.start()
            log_.set_finish_listener(self.scheduler.notify)
            if hasattr(self.clock, "on_advance"):  # a clock moved by hand: the scheduler looks again
                self.clock.on_advance(self.scheduler.tick)
        takeover.opened(self)

    def _open_log(self, metadata: str | MetadataStore | None, marker: str | None, segment_bytes: int,
                  repair: bool) -> WriteAheadLog:
        storage, record = self.storage, self.storage.record
        if record.wal_spec.kind == "s3":
            storage.log = takeover.open_s3_log(self, record.wal, metadata, marker, storage.s3_endpoint,
                                               segment_bytes=segment_bytes, repair=repair, create=storage.created)
            return storage.log
        if not record.replicas:
            return storage.open_local_log(record.wal_spec, segment_bytes=segment_bytes, repair=repair,
                                          relation_names=lambda: {e.id: e.name
                                                                  for e in self.catalog.load().values()},
                                          clock=self.clock)
        from sediment.wal.replication.replicated_log import ReplicatedLog

        if metadata is None:
            raise ValueError("replicas=[...] needs a shared metadata store, e.g. "
                             "metadata='zk://127.0.0.1:2181/sediment'")
        storage.log = ReplicatedLog.open(list(record.replicas), storage.meta, record.log_partition or 0, record.cluster_key,
                                         segment_bytes=segment_bytes, owner=takeover.owner_name(self.data_dir),
                                         clock=self.clock)
        takeover.close_when_fenced(self, storage.log.on_fenced)
        if marker is None:
            write_marker(self.data_dir, takeover.metadata_spec(metadata))
        return storage.log

    def _recover(self, log_: WriteAheadLog) -> None:
        """Replay the log; the PROGRESS and FRONTIERS records (the first kept record of a
        trimmed log is one) give each relation's sealed frontier, which the log carries
        across segment boundaries from then on (engine/frontiers.py)."""
        view = self.view
        book = self.frontiers = SealedFrontiers(lambda rel_id: view.relations.by_id(rel_id) is not None)
        take = getattr(log_, "recovered", None)  # what the log's own open verified: no second read
        records = take() if take is not None else None
        done = log_replay.replay(records if records is not None else map(log_replay.head_of, log_.scan()),
                                 view.relations, view.txns, book)  # in bulk: what apply would do, per record
        view.max_time = max(view.max_time, done.max_time)
        view.backlog.add(done.backlog)
        for rel_id, t in book.frontiers().items():
            rel = view.relations.by_id(rel_id)
            if rel is not None:
                rel.sealed = rel.sealed_durable = max(rel.sealed, t)
        book.forget_dropped()  # frontiers of relations dropped since the log's first record
        log_.set_preamble(book)
        dangling = view.txns.ids()
        if dangling:  # a crash left these without COMMIT: close them for good
            log_.submit([Record(RecordKind.ABORT, txn_id=t) for t in dangling], view.on_durable).wait()

    def _start(self, log_: WriteAheadLog, epoch: int, compact: bool) -> None:
        """The components that work on the open stores, each given what it needs."""
        view = self.view
        self.collector = Collector(view.lock, ReaderPins(self.clock), self.traces, log_)
        self.compaction = Compaction(view, self.traces, log_, self.collector, self.metrics, self.clock,
                                     self.settings, self._opened_at)
        self.reads = Reads(view, self.traces, log_, self.collector, blob_uri=self.storage.blob_uri,
                           s3_endpoint=self.storage.s3_endpoint, failure_count=self.compaction.failure_count)
        self.wal, self.read_stats = log_, self.reads.read_stats
        if compact:
            self.scheduler = Scheduler(self._background_pass, self.compaction.merge_pass,
                                       self.settings.interval, self.clock)
        self.writer = Writer(view, log_, self.locks, self.metrics, epoch=epoch,
                             max_record_bytes=self._max_record_bytes, wake_compaction=self._wake_for_backlog)

    def _background_pass(self) -> None:
        self.writer.abort_abandoned()  # first: the pass's cut may then pass them
        self.compaction.background_pass()

    def _wake_for_backlog(self) -> None:
        if self.scheduler is not None:
            self.scheduler.notify()

    # --- the public API: the components' methods ---------------------------------------------

    def append(self, name: str, updates: pa.Table, *, locks: Locks | None = None) -> None:
        self.writer.append(name, updates, locks=locks)  # no _forward: one call fewer per append

    append.__doc__ = Writer.append.__doc__
    append_many = _forward("writer", Writer.append_many)
    append_queued = _forward("writer", Writer.append_queued)
    transaction = _forward("writer", Writer.transaction)
    commit_all = _forward("writer", Writer.commit_all)
    seal = _forward("writer", Writer.seal)
    add_relation = _forward("registry", RelationRegistry.add_relation)
    relations = _forward("registry", RelationRegistry.relations)
    schema = _forward("registry", RelationRegistry.schema)
    since = _forward("registry", RelationRegistry.since)
    sealed = _forward("registry", RelationRegistry.sealed)
    set_since = _forward("registry", RelationRegistry.set_since)
    describe = _forward("registry", RelationRegistry.describe)
    schema_version = _forward("registry", RelationRegistry.schema_version)
    snapshot = _forward("reads", Reads.snapshot)
    subscribe = _forward("reads", Reads.subscribe)
    plan_read = _forward("reads", Reads.plan_read)
    release_read = _forward("reads", Reads.release_read)
    replay = _forward("reads", Reads.replay)
    trace_info = _forward("reads", Reads.trace_info)

    def compact(self, name: str | None = None) -> None:
        self.writer.abort_abandoned()
        self.compaction.compact(name)

    compact.__doc__ = Compaction.compact.__doc__
    compaction_errors = _forward("compaction", Compaction.compaction_errors)

    def drop_relation(self, name: str) -> None:
        """Forget a relation and its data. Its WAL records are ignored from now on and
        go away when the log is trimmed; its subscriptions end (their reads raise
        UnknownRelation)."""
        with self.compaction.pass_lock, self.view.lock:
            self.collector.discard(self.registry.drop(name, self._forget))
        self.collector.collect()

    def _forget(self, name: str, relation_id: int) -> None:
        """What the engine's components keep of a relation being dropped (under the lock)."""
        self.compaction.forget(name)
        self.frontiers.forget(relation_id)

    def alter_relation(self, name: str, *, add: Sequence[pa.Field] = (), defaults: Mapping[str, Any] | None = None,
                       widen: Mapping[str, pa.DataType] | None = None, rename: Mapping[str, str] | None = None,
                       drop: Sequence[str] = ()) -> int:
        """Change the relation's columns without rewriting its history; the new schema
        version (unchanged when nothing changes: no changes, a rename to the same name, a
        widening to the same type). See engine/schema_rules.py for what is
        allowed; a refused change raises SchemaChangeRefused naming the column and the rule,
        with nothing changed. All changes or none (one compare-and-set of the catalog entry),
        durable on return, and every append that starts after it uses the new schema."""
        check_name(name)
        with self.compaction.merge_lock, self.compaction.pass_lock, self.view.lock:  # no old-schema batch being written
            return self.registry.alter(name, add=add, defaults=defaults, widen=widen, rename=rename, drop=drop)

    def expect_takeover(self) -> None:
        """This coordinator hands its engine over (a cluster member leaving): the fence the new
        owner's open brings is the plan, so it is logged as information, not as an error."""
        self.takeover_expected = True
        expect = getattr(self.storage.log, "expect_takeover", None)
        if expect is not None:
            expect()

    @property
    def superseded(self) -> Exception | None:
        """Why a newer coordinator fenced this one (its engine then closes), or None."""
        return self.view.superseded

    @superseded.setter
    def superseded(self, err: Exception | None) -> None:
        self.view.superseded = err

    def stats(self, include_internal: bool = False) -> dict[str, Any]:
        """What the engine holds now, for operators: per relation its rows, batches, stored
        bytes, frontiers (since, sealed, trace upper), WAL tail records and bytes, compaction
        lag and subscribers; for the engine the WAL (kind, LSNs, segments, bytes, backlog not
        yet compacted) and where its storage lives. Plain JSON-ready values; the same
        dictionary backs ``sediment stats`` and the state gauges of ``/metrics``. Internal
        relations are listed only with ``include_internal`` (the WAL figures count them)."""
        args.check_bool(include_internal, "include_internal")
        settings = self.settings
        stats = engine_stats(self.view, self.storage.log, self.clock.current_time(),
                             compaction={"background": self.scheduler is not None,
                                         "interval_seconds": settings.interval,
                                         "major_compaction_quiet": settings.major_quiet},
                             storage={"data_dir": self.data_dir, "blob": self.blob_uri, "metadata": self.metadata_spec})
        if not include_internal:
            stats["relations"] = {n: r for n, r in stats["relations"].items() if not is_internal(n)}
        return stats

    # --- closing -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the scheduler, flush and release everything. Idempotent."""
        view = self.view
        with view.lock:
            if view.closed:
                return
            view.closed = True  # appends waiting for the backlog wake and fail EngineClosed
            view.backlog.wake_all()
        if self.scheduler is not None:
            self.scheduler.stop()
        with self.compaction.pass_lock, view.lock:
            for rel in view.relations.values():
                rel.feed.close()
        self._release_all()

    def _release_all(self) -> None:
        """Release whatever :meth:`open` got to."""
        if self.scheduler is not None:
            self.scheduler.stop()
        self.storage.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
