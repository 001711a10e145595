"""The engine's reads: snapshots, replays, feeds, read plans and their leases.

Each read takes what it needs from the relation view under the engine lock (the trace and
the tail as they are, and the relation's schema version: :class:`_Shape`), pins them with
the collector so compaction deletes nothing it may still read, and reads the stores without
the lock, in that schema version: an alter that lands meanwhile changes no column halfway.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from sediment.engine import args, tail_decode, time_order
from sediment.engine.args import check_time
from sediment.engine.collector import Collector
from sediment.engine.feed import PROGRESS, SNAPSHOT, UPDATES, FeedEvent, Subscription
from sediment.engine.read_plan import ReadPlan
from sediment.engine.relation import Relation, TailEntry
from sediment.engine.view import RelationView
from sediment.errors import (
    AsOfOutOfRange,
    BatchCorruption,
    BlobError,
    DiffOverflow,
    EngineClosed,
    InvalidArgument,
)
from sediment.read_ahead import pool_workers
from sediment.trace.consolidate import snapshot as consolidate_snapshot
from sediment.trace.evolve import Layout
from sediment.trace.runs import RunStats, batch_run, merge_runs, stitched
from sediment.trace.state import BatchRef, TraceState
from sediment.trace.store import TraceStore
from sediment.wal.protocol import WriteAheadLog

log = logging.getLogger(__name__)
_MERGE_WORKERS = pool_workers()  # merge windows of a large snapshot sorted at once
MAX_LEASE_SECONDS = 86400  # the longest read plan lease (plan_read)


class _Stored(NamedTuple):
    """A stored batch as a replay item: the times its updates may carry."""

    ref: BatchRef
    t_lo: int
    t_hi: int


class _TailRun(NamedTuple):
    """Consecutive WAL tail records as one replay item, decoded together (engine/tail_decode.py)."""

    entries: tuple[TailEntry, ...]
    t_lo: int
    t_hi: int


_RUN_BYTES = 1 << 20  # a replay's tail run: records decoded together, and held until its last time passes
_RUN_RECORDS = 4096


def _tail_runs(entries: Sequence[TailEntry]) -> list[_TailRun]:
    """``entries`` in order, as runs of small records (one each for a record of 64 KiB or more)."""
    runs: list[_TailRun] = []
    run: list[TailEntry] = []
    size = 0
    for e in entries:
        if run and (size + e.bytes > _RUN_BYTES or len(run) >= _RUN_RECORDS
                    or e.bytes >= tail_decode.SMALL_RECORD_BYTES):
            runs.append(_TailRun(tuple(run), min(x.t_lo for x in run), max(x.t_hi for x in run)))
            run, size = [], 0
        run.append(e)
        size += e.bytes
    if run:
        runs.append(_TailRun(tuple(run), min(x.t_lo for x in run), max(x.t_hi for x in run)))
    return runs


class _Shape(NamedTuple):
    """A relation's schema version as a read found it under the lock: what it reads in."""

    version: int
    schema: pa.Schema  # the update schema: columns, time, diff
    keys: list[str]
    layout: Layout | None

    @classmethod
    def of(cls, rel: Relation) -> _Shape:
        version, schema = rel.shape
        return cls(version, schema, rel.keys, rel.layout)

    def conform(self, table: pa.Table) -> pa.Table:
        """A stored batch in this schema (Parquet returns some types in another unit)."""
        if table.schema.names == self.schema.names and table.schema.types == self.schema.types:
            return table
        return table.select(self.schema.names).cast(self.schema)


class Reads:
    """Reads of ``view``'s relations from ``traces`` and ``log``. ``blob_uri`` and
    ``s3_endpoint`` (where the batches live) go into read plans; ``failure_count`` gives a
    relation's failing compaction attempts for :meth:`trace_info`."""

    def __init__(self, view: RelationView, traces: TraceStore, log_: WriteAheadLog, collector: Collector, *,
                 blob_uri: str | None, s3_endpoint: str | None, failure_count: Callable[[str], int]) -> None:
        self.view = view
        self.traces = traces
        self.log = log_
        self.collector = collector
        self.blob_uri = blob_uri
        self.s3_endpoint = s3_endpoint
        self.read_stats = RunStats()  # counters of consolidation on read, for tests and operators
        self._failure_count = failure_count
        self._lock = view.lock

    def _tail(self, rel: Relation, entries: Sequence[TailEntry], shape: _Shape) -> pa.Table:
        """The rows of WAL records ``entries`` in the read's schema version, decoded together
        (engine/tail_decode.py: a record at a time, beside busy threads, waited for the
        interpreter lock several times a record)."""
        bodies = tail_decode.bodies_of(entries, self.view.bodies.get, self.log)
        return tail_decode.decode_tail(rel, entries, bodies, (shape.version, shape.schema))

    def snapshot(self, name: str, as_of: int) -> pa.Table:
        """The relation as of ``as_of``: its columns plus ``diff``, one row per distinct row
        whose diffs at times <= as_of sum to non-zero, sorted by the columns. Valid for
        since <= as_of <= sealed."""
        as_of = check_time(as_of, "as_of")
        with self._lock:
            rel = self.view.get(name)
            self._check_as_of(rel, as_of)
            trace, entries, shape = rel.trace, list(rel.tail), _Shape.of(rel)
            pinned = self.collector.pin()
        try:
            return self._snapshot_of(rel, trace, entries, as_of, shape)
        except (BatchCorruption, BlobError):
            self._superseded_meanwhile()
            raise
        finally:
            self.collector.unpin(pinned)

    def _superseded_meanwhile(self) -> None:
        """A read failed on its batches: with a log another coordinator can take over (S3: its
        own look runs every 2 s), look now whether one did. If so, the new coordinator's
        compaction deleting a batch this engine still named (or this engine closing on the
        fence) is why, and the answer is CoordinatorSuperseded, which sends the client to the
        new coordinator, not a false report of a missing batch."""
        look = getattr(self.log, "look_for_takeover", None)
        if look is not None and self.view.superseded is None:
            look()
        if self.view.superseded is not None:
            raise self.view.superseded from None

    def _check_as_of(self, rel: Relation, as_of: int) -> None:
        if not rel.entry.since <= as_of <= rel.sealed_durable:
            raise AsOfOutOfRange(
                f"as_of {as_of} for {rel.entry.name!r} is outside [since {rel.entry.since}, sealed "
                f"{rel.sealed_durable}]" + ("; the relation was never sealed" if rel.sealed_durable < 0 else "") +
                ("; read at a time in that range (below since, history was consolidated away)"
                 if as_of < rel.entry.since else f"; seal {rel.entry.name!r} through {as_of} first, or read at a time "
                 "in that range (above sealed, more updates may still arrive)"))

    def _snapshot_of(self, rel: Relation, trace: TraceState, entries: list[TailEntry], as_of: int,
                     shape: _Shape) -> pa.Table:
        try:
            return self._snapshot_parts(rel, trace, entries, as_of, shape)
        except DiffOverflow as exc:
            name = rel.entry.name
            raise DiffOverflow(f"relation {name!r} as of {as_of}: {exc}", relation=name, row=exc.row) from None

    def _snapshot_parts(self, rel: Relation, trace: TraceState, entries: list[TailEntry], as_of: int,
                        shape: _Shape) -> pa.Table:
        """Consolidation on read (:mod:`sediment.trace.runs`): each batch becomes a sorted run
        without a sort (as stored when it holds one time), the WAL tail is consolidated into
        one more run, and the runs are merged in one streaming pass."""
        keys = shape.keys
        runs = []
        for ref in (*trace.batches, *trace.pending):
            if ref.key is not None and ref.lower <= as_of:
                run = self._batch_run(rel, ref, as_of, shape)
                if run is not None:
                    runs.append(run)
        entries = [e for e in entries if e.t_lo <= as_of]
        if entries:
            runs.append(consolidate_snapshot(self._tail(rel, entries, shape), keys, as_of))
        schema = pa.schema([shape.schema.field(c) for c in (*keys, "diff")])
        return merge_runs(runs, keys, schema, stats=self.read_stats, workers=_MERGE_WORKERS)

    def _batch_run(self, rel: Relation, ref: BatchRef, as_of: int, shape: _Shape) -> pa.Table | None:
        """One batch's snapshot at ``as_of`` as a run (None when the batch has no rows): each
        row group decoded and summed (:func:`batch_run`) on the read-ahead pool as it is read
        (``TraceStore.read_pieces``), and the pieces joined where a row's times cross a row
        group boundary (:func:`stitched`). A partial sum past int64 whose total may still fit
        is decided on the whole batch instead, as before."""
        keys = shape.keys
        lo, hi = max(ref.lower, ref.since), max(ref.upper - 1, ref.since)

        def piece(table: pa.Table) -> pa.Table:
            return batch_run(shape.conform(table), keys, as_of, min_time=lo, max_time=hi)

        try:
            parts = list(stitched(self.traces.read_pieces(rel.entry.id, ref, layout=shape.layout, each=piece), keys))
        except DiffOverflow:
            table = self.traces.read(rel.entry.id, ref, layout=shape.layout)
            parts = [] if table is None else [piece(table)]
        if not parts and not ref.rows:
            return None
        self.read_stats.count_batch(as_of, lo, hi)
        return pa.concat_tables(parts) if parts else None

    def _updates_after(self, rel: Relation, trace: TraceState, entries: list[TailEntry], t: int,
                       shape: _Shape) -> pa.Table:
        """Every stored update at a time > t, sorted by time (a batch's row groups filtered on
        the read-ahead pool as they are decoded: only the rows kept are held)."""
        def after(table: pa.Table) -> pa.Table:
            return table.filter(pc.greater(table.column("time"), t))

        parts = []
        for ref in (*trace.batches, *trace.pending):
            if ref.key is not None and max(ref.upper - 1, ref.since) > t:
                parts += self.traces.read_pieces(rel.entry.id, ref, layout=shape.layout, each=after)
        entries = [e for e in entries if e.t_hi > t]
        if entries:
            tail = self._tail(rel, entries, shape)
            parts.append(tail.filter(pc.greater(tail.column("time"), t)))
        table = pa.concat_tables([p.select(shape.schema.names).cast(shape.schema) for p in parts]) \
            if parts else shape.schema.empty_table()
        return table.sort_by([("time", "ascending")])

    def subscribe(self, name: str, as_of: int | None = None, *, resume: bool = False,
                  max_lag: int | None = None) -> Subscription:
        """A feed of the relation: a ``snapshot`` event at ``as_of`` (default: the sealed
        frontier; skipped with ``resume``), an ``updates`` event with every stored update
        after ``as_of`` (when there are any), a ``progress`` event for the sealed frontier (when
        it is past ``as_of``: subscribed at the sealed frontier, none), then every update and
        progress record as it becomes durable, in order, with no gap and no repeat. Writers
        never wait for a subscriber; a slow one catches up from the WAL. See
        :mod:`sediment.engine.feed`.

        A relation never sealed can be subscribed to without ``as_of`` (a consumer may start
        before its producer): the snapshot is then the empty relation at time -1, before any
        time, and every update follows.

        ``max_lag`` bounds how many events this subscriber may fall behind (default
        :data:`sediment.engine.feed.MAX_LAG`); past it, it is dropped and its next read raises
        FeedOverrun, so a stalled reader never holds memory or the WAL."""
        args.check_bool(resume, "resume")
        if max_lag is not None:
            args.check_int(max_lag, "max_lag")
        with self._lock:
            rel = self.view.get(name)
            if as_of is None:
                as_of = rel.sealed_durable  # -1 when never sealed: since (0) is then no bound
            else:
                self._check_as_of(rel, check_time(as_of, "as_of"))
            trace, entries, sealed, shape = rel.trace, list(rel.tail), rel.sealed_durable, _Shape.of(rel)
            feed = rel.feed

            def load(lsn: int, version: int, written: int) -> pa.Table:
                """The record at ``lsn`` (written under schema ``written``, -1: not known) in schema
                ``version``, from the bodies still in memory when it can (no read of the log);
                lsn -1: an empty table of it."""
                if lsn < 0:
                    return rel.layout.project(rel.layout.versions[version].empty_table(), version)
                body = self.view.bodies.get(lsn) if written >= 0 else None
                if body is None:
                    record = self.log.read(lsn)
                    body, written = record.body, record.schema_version
                return pa.Table.from_batches([rel.decode_body(body, written, version)])

            def load_many(wanted: list[tuple[int, int]], version: int) -> list[tuple[pa.Table, int]]:
                """The records ``wanted`` ((lsn, schema version written)) as ``load`` gives
                each, decoded together (engine/tail_decode.py)."""
                got = [(written, self.view.bodies.get(lsn) if written >= 0 else None) for lsn, written in wanted]
                missing = [lsn for (lsn, _w), (_v, body) in zip(wanted, got, strict=True) if body is None]
                read = iter(self.log.read_many(missing) if missing else ())
                for i, (_w, body) in enumerate(got):
                    if body is None:
                        record = next(read)
                        got[i] = (record.schema_version, record.body)
                current, schema = rel.shape
                target = (version, schema if version == current else rel.layout.decode_schema(version))
                return tail_decode.decode_each(rel, got, target, lambda i: load(wanted[i][0], version, wanted[i][1]))

            sub = Subscription(feed, [], load, lambda: not self.view.closed, name=name, max_lag=max_lag,
                               load_many=load_many)
            pinned = self.collector.pin()
        try:
            initial = []
            if not resume:
                initial.append(FeedEvent(SNAPSHOT, as_of, self._snapshot_of(rel, trace, entries, as_of, shape)))
            later = self._updates_after(rel, trace, entries, as_of, shape)
            if later.num_rows:
                initial.append(FeedEvent(UPDATES, int(later.column("time")[0].as_py()), later))
            if sealed > as_of:
                initial.append(FeedEvent(PROGRESS, sealed))
        except BaseException:
            sub.close()
            raise
        finally:
            self.collector.unpin(pinned)
        sub.add_initial(initial, as_of)
        return sub

    def plan_read(self, name: str, as_of: int, *, from_t: int | None = None,
                  lease_seconds: float = 600.0) -> ReadPlan:
        """Pin the relation's current batches for ``lease_seconds`` and describe how to read it
        as of ``as_of`` (changes in (from_t, as_of] when ``from_t`` is given) directly from
        the blob store. Call :meth:`release_read` when done. A lease holds every batch that
        compaction replaces and every trim of the log after it until it ends, so it is at most
        ``MAX_LEASE_SECONDS`` (a day): a longer read plans again."""
        as_of = check_time(as_of, "as_of")
        from_t = args.check_optional_time(from_t, "from_t")
        args.check_number(lease_seconds, "lease_seconds")
        if lease_seconds > MAX_LEASE_SECONDS:
            raise InvalidArgument(f"lease_seconds must be at most {MAX_LEASE_SECONDS} (a day), not {lease_seconds!r}: "
                                  "a lease keeps every replaced batch and the log's trim waiting until it ends; "
                                  "plan again for a longer read")
        with self._lock:
            rel = self.view.get(name)
            low = rel.entry.since if from_t is None else from_t
            if not rel.entry.since <= low <= as_of <= rel.sealed_durable:
                raise AsOfOutOfRange(f"reading {name!r} as of {as_of}" +
                                     (f" from {from_t}" if from_t is not None else "") +
                                     f" is outside [since {rel.entry.since}, sealed {rel.sealed_durable}]")
            if self.blob_uri is None:
                raise InvalidArgument("plan_read needs an engine opened with a blob URI (file:// or s3://)")
            trace, shape, history = rel.trace, _Shape.of(rel), rel.entry.schema_history
            entries = [e for e in rel.tail if e.t_lo <= as_of and (from_t is None or e.t_hi > from_t)]
            lease = self.collector.readers.lease(lease_seconds)
        try:
            tail = self._tail(rel, entries, shape)
            keep = pc.less_equal(tail.column("time"), as_of)
            if from_t is not None:
                keep = pc.and_(keep, pc.greater(tail.column("time"), from_t))
            tail = tail.filter(keep)
        except BaseException:
            self.release_read(lease)
            raise
        refs = [ref.to_json() for ref in (*trace.batches, *trace.pending)
                if ref.key is not None and ref.lower <= as_of and (from_t is None or max(ref.upper - 1, ref.since) > from_t)]
        return ReadPlan(lease, name, rel.entry.id, shape.schema, shape.keys, rel.entry.since,
                        rel.sealed_durable, as_of, self.blob_uri, self.s3_endpoint, refs, tail,
                        history.to_json() if history.version else None)

    def release_read(self, lease: int) -> None:
        """End a read plan's lease: its batches may now be replaced and deleted."""
        args.check_int(lease, "lease", low=0)
        self.collector.release(lease)

    def replay(self, name: str, *, batch_rows: int = 65536, ordered: bool = True) -> Iterator[pa.RecordBatch]:
        """Every stored update of the relation in time order, as record batches of the
        relation's columns plus ``time`` and ``diff``. Compacted updates appear with their
        times advanced to the trace's ``since``. Rows of one time come in storage order:
        the trace's batches, its pending batches, then the WAL tail's records in commit
        order, each as stored. Memory holds only the batches and records whose time ranges
        overlap the current time, not the whole relation (see :mod:`sediment.engine.time_order`).
        ``ordered=False`` streams batches as stored (sorted by row, then time) and then the
        WAL tail: no sort, for consumers that consolidate anyway. Read on after the engine
        closes, it raises EngineClosed."""
        args.check_int(batch_rows, "batch_rows", low=1, high=1 << 31)
        args.check_bool(ordered, "ordered")
        with self._lock:
            rel = self.view.get(name)
            trace, entries, shape = rel.trace, list(rel.tail), _Shape.of(rel)
            pinned = self.collector.pin()

        def load(item: Any, sort: Callable[[Any], list[time_order.Block]]) -> Iterable[list[time_order.Block]]:
            if isinstance(item, _TailRun):
                return [sort(self._tail(rel, item.entries, shape).combine_chunks())]
            return self.traces.read_pieces(rel.entry.id, item.ref, layout=shape.layout, each=sort,
                                           ahead=time_order.PIECES_AHEAD)

        def batches() -> Iterator[pa.RecordBatch]:
            if not ordered:
                return self._replay_as_stored(rel, trace, entries, batch_rows, shape)
            items: list[Any] = [_Stored(ref, max(ref.lower, ref.since), max(ref.upper - 1, ref.since))
                                for ref in (*trace.batches, *trace.pending) if ref.key is not None]
            items += _tail_runs(entries)
            return time_order.time_ordered(items, load, shape.schema, batch_rows)

        def generate() -> Iterator[pa.RecordBatch]:
            source: Iterator[pa.RecordBatch] = iter(())
            try:
                yield pa.record_batch([])  # primed past here: closing or collecting it unpins
                view, source = self.view, batches()
                while not view.closed:  # else its pin went with the engine: another open may compact the batches away
                    try:
                        batch = next(source, None)
                    except (BatchCorruption, BlobError):
                        self._superseded_meanwhile()
                        raise
                    if batch is None:
                        return
                    yield batch
                raise EngineClosed(f"the engine was closed while {name!r} was being replayed; replay it again "
                                   "after reopening the engine")
            finally:
                close = getattr(source, "close", None)
                if close is not None:  # its reads ahead end with the replay, as a `yield from` closed them
                    close()
                self.collector.unpin(pinned)

        replay = generate()
        next(replay)  # inside its try: a replay never iterated still releases its pin when dropped
        return replay

    def _replay_as_stored(self, rel: Relation, trace: TraceState, entries: list[TailEntry],
                          batch_rows: int, shape: _Shape) -> Iterator[pa.RecordBatch]:
        """Each batch's row groups as stored (:meth:`TraceStore.read_as_stored`), then the WAL
        tail records: no sort, no reopen."""
        for ref in (*trace.batches, *trace.pending):
            for group in self.traces.read_as_stored(rel.entry.id, ref, layout=shape.layout):
                yield from shape.conform(group).to_batches(max_chunksize=batch_rows)
        for run in _tail_runs(entries):
            yield from self._tail(rel, run.entries, shape).combine_chunks().to_batches(max_chunksize=batch_rows)

    def trace_info(self, name: str) -> dict[str, int]:
        """The relation's stored shape: batches, pending batches, rows and bytes in them, the
        trace's upper, and the WAL records not yet compacted."""
        with self._lock:
            rel = self.view.get(name)
            t = rel.trace
            return {"batches": len(t.batches), "pending": len(t.pending),
                    "rows": sum(b.rows for b in (*t.batches, *t.pending)),
                    "bytes": sum(b.bytes for b in (*t.batches, *t.pending)),
                    "upper": t.upper, "since": t.since, "tail_records": len(rel.tail),
                    "compaction_failures": self._failure_count(name)}
