"""The engine's writes: appends, transactions and seals, admitted against the relation
view and submitted to the log, and the WAL backlog bound they wait on.

Why its own component: admission (the relation still exists, its times are not sealed,
the backlog has room) must be atomic with the submit, under the engine lock, while the
wait for an fdatasync happens outside it so that concurrent appends share one group
commit. Durable records come back through the view's ``on_durable``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from sediment.arrow_codec import encode_updates
from sediment.engine import args
from sediment.engine.args import check_time
from sediment.engine.body_bounds import BodyBounds
from sediment.engine.locks import Locks, LockTable
from sediment.engine.relation import Relation
from sediment.engine.schema import conform_updates, small_bounds, time_range
from sediment.engine.small_encode import SmallBodyEncoder
from sediment.engine.transaction import Admission, Transaction, commit_all
from sediment.engine.view import RelationView
from sediment.errors import FrontierRegression, InvalidArgument, TimeAlreadySealed, UnknownRelation
from sediment.metrics import EngineMetrics
from sediment.txn_state import ABORTED, TxnState
from sediment.wal.protocol import Ticket, WriteAheadLog
from sediment.wal.record import Record, RecordKind

_UPDATES = RecordKind.UPDATES
_DEFERRED_BODY = 1 << 16  # a concurrent small append whose body may be left to the log's leader: at most this bound


class Writer:
    """Appends to ``log`` for the relations of ``view``. ``epoch`` makes transaction ids
    unique across restarts; ``wake_compaction`` asks for a pass when appends wait for the backlog."""

    def __init__(self, view: RelationView, log_: WriteAheadLog, locks: LockTable, metrics: EngineMetrics, *,
                 epoch: int, max_record_bytes: int, wake_compaction: Callable[[], None]) -> None:
        self.view = view
        self.log = log_
        self.locks = locks
        self.metrics = metrics
        self.epoch = epoch
        self.max_record_bytes = max_record_bytes
        self._wake_compaction = wake_compaction
        self._lock: threading.RLock = view.lock
        self._txn_counter = 0
        self._bounds: dict[int, tuple[pa.Schema, BodyBounds]] = {}  # id(update schema) -> it, its body reader
        self._appending = 0  # appends between prepare and encode now, about
        self._abandoned: deque[TxnState] = deque()  # open transactions garbage collected (txn_abandoned)
        self._observe_latency = metrics.append_latency.observe
        self._submit_joinable = getattr(log_, "submit_joinable", None)  # the file log's (wal/group_records.py)
        self._lead_lone = getattr(log_, "lead_lone", None)  # ... and its lead taken by an idle log's caller
        self._write_lone = getattr(log_, "write_lone", None)

    def wait_backlog(self, records: list[Record], size: int | None = None) -> None:
        """Under the lock: wait while the append would take the WAL backlog past
        ``max_wal_backlog`` (engine/backlog.py); compaction is asked to finish the active
        segment so that the records in it can be compacted. ``size``: the bodies' size when
        they are not encoded yet."""
        backlog = self.view.backlog
        if backlog.bound is None:
            return
        n = size if size is not None else len(records[0].body) if len(records) == 1 else \
            sum(len(r.body) for r in records)
        if not backlog.must_wait(n):
            return
        self.metrics.backlog_waits.inc()
        backlog.admit(n, where=self.view.where, closed=lambda: self.view.closed,
                      wake_compacter=self._wake_compaction)

    def next_txn_id(self) -> int:
        """A transaction id unique across restarts: the open's epoch, then a counter."""
        with self._lock:
            self._txn_counter += 1
            return (self.epoch << 32) | self._txn_counter

    def _encode(self, rel: Relation, table: pa.Table, txn_id: int,
                bounds: tuple[int, int] | None = None, version: int = 0) -> list[Record]:
        """UPDATES records of at most ``max_record_bytes`` each (Arrow IPC record batches),
        stamped with the schema version ``table`` is in."""
        n = table.num_rows
        if n <= 64:  # small appends: one record, no sizing
            body = None
            if self._appending > 1:  # others append too: build it without releasing the GIL (engine/small_encode.py)
                encoder = rel.encoders.get(version)
                if encoder is None:
                    encoder = rel.encoders[version] = SmallBodyEncoder(table.schema)
                body = encoder.encode(table)
            if body is None:
                batches = table.to_batches()
                body = encode_updates(batches[0]) if len(batches) == 1 else None
            if body is not None:
                lo, hi = bounds or time_range(table)
                return [Record(RecordKind.UPDATES, rel.entry.id, txn_id, lo, hi, n, body, schema_version=version)]
        if bounds is not None and table.get_total_buffer_size() <= self.max_record_bytes:
            batches = table.to_batches()  # one chunk that surely fits: no size pass, no second min/max
            if len(batches) == 1:
                return [Record(RecordKind.UPDATES, rel.entry.id, txn_id, bounds[0], bounds[1], n,
                               encode_updates(batches[0]), schema_version=version)]
        per_row = max(1, table.nbytes // max(1, table.num_rows))
        rows = max(1, self.max_record_bytes // per_row)
        records = []
        for batch in table.to_batches(max_chunksize=rows):
            if batch.num_rows == 0:
                continue
            lo, hi = pc.min_max(batch.column("time")).values()
            records.append(Record(RecordKind.UPDATES, rel.entry.id, txn_id, lo.as_py(), hi.as_py(),
                                  batch.num_rows, encode_updates(batch), schema_version=version))
        return records

    def _prepare(self, name: str, updates: object) -> tuple[Relation, pa.Table, tuple[int, int] | None, int]:
        """The relation, the updates in its columns, their time bounds, and the schema version
        those columns are (the records must say that one, even if an alter lands meanwhile)."""
        rel = self.view.relations.get(name) if isinstance(name, str) and not self.view.closed else None  # re-checked under the lock
        if rel is None:
            with self._lock:
                rel = self.view.get(name)
        version, target = rel.shape  # one read: an alter meanwhile cannot mix two versions
        table, bounds = conform_updates(name, None, updates, target, layout=rel.layout, version=version)
        return rel, table, bounds, version

    def _admit(self, rel: Relation, name: str, bounds: tuple[int, int] | int | None) -> None:
        """Under the lock: the relation still exists and the times are not sealed."""
        t_min = bounds[0] if isinstance(bounds, tuple) else bounds
        if self.view.relations.get(name) is not rel:
            raise UnknownRelation(f"relation {name!r} was dropped while the append was being prepared")
        if t_min is not None and t_min <= rel.sealed:
            raise TimeAlreadySealed(
                f"relation {name!r} is sealed through time {rel.sealed}, but the updates include time {t_min}; "
                f"append at times > {rel.sealed}"
            )

    def append(self, name: str, updates: pa.Table, *, locks: Locks | None = None) -> None:
        """Append updates: the relation's columns plus ``time`` (int64 >= 0, above the sealed
        frontier) and ``diff`` (int64; a diff of 0 is no update, taken and consolidated away),
        as a ``pyarrow.Table`` (or a ``RecordBatch``); columns match by name, and a column of
        another type is cast only when the cast is safe (an int32 column feeds an int64 one,
        a string column never does). Returns once they are durable. All or nothing.

        With ``locks``, the append is refused with LockConflict (writing nothing) when a
        write- or read-locked id was written after ``locks.high_water``; its write and
        append locks record the append's greatest time."""
        start = time.perf_counter()
        if locks is not None:
            args.check_locks(locks)
        self._appending += 1  # a hint for _encode only: a lost update under a race costs nothing but speed
        try:
            if self._appending == 1:
                if self._append_lone(name, updates, locks, start):
                    return
            elif self._append_small(name, updates, locks, start):
                return
            rel, table, bounds, version = self._prepare(name, updates)
            if bounds is not None:  # else no rows
                self._append_records(rel, name, table, bounds, version, locks, start)
        finally:
            self._appending -= 1

    def _append_lone(self, name: str, updates: object, locks: Locks | None, start: float) -> bool:
        """With no other append in flight: a table of 1-16 rows already in the relation's
        update schema, checked, encoded and submitted with the fewest steps, then waited for.
        False, with nothing done, for anything else (the full path then checks it and says
        what is wrong).

        Why: a lone writer's append runs between two blocking syncs, where every interpreter
        step costs about twice its hot cost (caches and branch history are gone after the
        sleep); the full path's layers (prepare, conform, encode, submit, each a call with
        its own lists) were half the steps of a one-row append."""
        view = self.view
        named = view.relations.named
        rel = named.get(name) if type(updates) is pa.Table and isinstance(name, str) and not view.closed else None
        if rel is None:
            return False
        version, target = rel.shape
        n = updates.num_rows
        if not 0 < n <= 16 or not updates.schema.equals(target):
            return False
        batches = updates.to_batches()
        if len(batches) != 1:
            return False
        body = batches[0].serialize().to_pybytes()  # bytes: each len() and buffer read of a pyarrow Buffer is a call
        known = self._bounds.get(id(target))
        if known is None or known[0] is not target:
            if len(self._bounds) >= 1024:  # schemas of dropped relations and old versions: start over
                self._bounds.clear()
            known = self._bounds[id(target)] = (target, BodyBounds(len(target)))
        bounds = known[1].bounds(body, updates)
        if bounds is None:
            return False
        lo, hi = bounds
        record = Record(_UPDATES, rel.entry.id, 0, lo, hi, n, body, -1, version)  # positional: no keyword parsing
        lead = self._lead_lone
        backlog = view.backlog
        header = None
        try:
            with self._lock:
                if backlog.bound is not None and backlog.bytes and backlog.bytes + len(body) > backlog.bound:
                    self.wait_backlog([record])  # WalBacklog.must_wait, inline
                if view.closed or view.failed is not None or view.superseded is not None:
                    view.check_open()
                if named.get(name) is not rel or lo <= rel.sealed:
                    self._admit(rel, name, bounds)
                if locks is not None:
                    self.locks.check_and_record(locks, hi)
                header = lead(record) if lead is not None else None
                if header is None:
                    ticket = self.log.submit((record,), view.on_durable)
            try:
                if header is not None:  # the log was idle: this thread leads and writes its record itself
                    self._write_lone(record, header, view.on_durable_one)
                else:
                    ticket.wait()
            except Exception as exc:
                view.fail(exc)
                raise
        except BaseException:
            if header is not None:  # Ctrl-C before write_lone took the lead over: give it back (else a no-op)
                self.log.drop_lone()
            raise
        self._observe_latency(time.perf_counter() - start)
        return True

    def _append_small(self, name: str, updates: object, locks: Locks | None, start: float) -> bool:
        """While others append too: a small table already in the relation's update schema,
        on the file log left for the group's leader to encode (:meth:`_append_deferred`),
        else checked and encoded in one pass over its columns (engine/small_encode.py), then
        submitted as one record. False, with nothing done, for anything else (the full
        path then checks it and says what is wrong)."""
        rel = self.view.relations.get(name) if isinstance(name, str) and not self.view.closed else None
        if rel is None or not isinstance(updates, pa.Table) or updates.num_rows > 64:
            return False
        version, target = rel.shape
        if not updates.schema.equals(target):
            return False
        encoder = rel.encoders.get(version)
        if encoder is None:
            encoder = rel.encoders[version] = SmallBodyEncoder(target)
        if locks is None and self._submit_joinable is not None and encoder.usable:
            return self._append_deferred(rel, name, updates, version, start)
        got = encoder.encode_with_times(updates)
        if got is None or got[1] < 0:
            return False
        body, lo, hi = got
        record = Record(RecordKind.UPDATES, rel.entry.id, 0, lo, hi, updates.num_rows, body, schema_version=version)
        self._submit([record], [(rel, name, (lo, hi))], locks, hi, start)
        return True

    def _append_deferred(self, rel: Relation, name: str, updates: pa.Table, version: int, start: float) -> bool:
        """:meth:`_append_small` on the file log: the table checked (:func:`small_bounds`),
        admitted and queued with its body left to the group's leader, which encodes a run of
        such appends as one body (wal/group_records.py). Only for schemas of the flat types
        the small encoder takes, whose encode cannot fail in the leader. False, with nothing
        done, for anything else.

        Why: encoding here read every column through pyarrow's wrappers (about 3 us each,
        with the interpreter lock held while 63 other writers wait for it); the time and
        diff checks need two of them, and the leader's one encode per run is shared."""
        n = updates.num_rows
        bounds = small_bounds(updates) if n else None
        if bounds is None:
            return False
        size = updates.get_total_buffer_size() + 128 * updates.num_columns + n + 512  # >= its body (see formats)
        if size > min(self.max_record_bytes, _DEFERRED_BODY):
            return False
        lo, hi = bounds
        record = Record(_UPDATES, rel.entry.id, 0, lo, hi, n, b"", schema_version=version)
        with self._lock:
            self.wait_backlog([record], size)
            self.view.check_open()
            self._admit(rel, name, bounds)
            ticket = self._submit_joinable(record, self.view.on_durable, self.max_record_bytes, updates, size)
        try:
            ticket.wait()
        except Exception as exc:
            self.view.fail(exc)
            raise
        self._observe_latency(time.perf_counter() - start)
        return True

    def _append_records(self, rel: Relation, name: str, table: pa.Table, bounds: tuple[int, int], version: int,
                        locks: Locks | None, start: float, wait: bool = True) -> Ticket:
        records = self._encode(rel, table, 0, bounds, version)
        if len(records) > 1:  # too big for one record: make it one transaction
            txn = self.next_txn_id()
            for r in records:
                r.txn_id = txn
            records = [Record(RecordKind.BEGIN, txn_id=txn), *records, Record(RecordKind.COMMIT, txn_id=txn)]
        return self._submit(records, [(rel, name, bounds)], locks, bounds[1], start, wait)

    def append_queued(self, name: str, updates: pa.Table) -> QueuedAppend:
        """A plain append checked, encoded and queued on the log but not yet durable; its
        ``wait()`` returns once it is (raising the write's error). Refusals are raised here, with
        nothing queued. Why: a server's append stream queues a client's next append while the
        earlier ones' group commit runs, so one stream's appends can share a group
        (sediment/net/append_stream.py). Appends queued one after the other are applied in
        that order, as appends made one after the other."""
        start = time.perf_counter()
        rel, table, bounds, version = self._prepare(name, updates)
        if bounds is None:
            return QueuedAppend(None, start, self._observe_latency, self.view.fail)
        return QueuedAppend(self._append_records(rel, name, table, bounds, version, None, start, wait=False),
                            start, self._observe_latency, self.view.fail)

    def append_many(self, updates: Mapping[str, pa.Table], *, locks: Locks | None = None) -> None:
        """Append to several relations atomically: after a crash, all or none are there.
        ``locks`` as for :meth:`append`, checked once for the whole append."""
        start = time.perf_counter()
        args.check_locks(locks)
        args.check_updates_map(updates)
        txn = self.next_txn_id()
        prepared = [(name, *self._prepare(name, table)) for name, table in updates.items()]
        records = [Record(RecordKind.BEGIN, txn_id=txn)]
        for _name, rel, table, _t, version in prepared:
            records += self._encode(rel, table, txn, version=version)
        records.append(Record(RecordKind.COMMIT, txn_id=txn))
        if len(records) == 2:
            return
        self._submit(records, [(rel, name, bounds) for name, rel, _table, bounds, _v in prepared], locks,
                     max((b[1] for _n, _r, _t, b, _v in prepared if b is not None), default=None), start)

    def _submit(self, records: list[Record], admit: list[tuple[Relation, str, tuple[int, int] | None]],
                locks: Locks | None, t_max: int | None, start: float, wait: bool = True) -> Ticket:
        """Admit and submit under the lock, then (``wait``) wait for durability outside it."""
        with self._lock:
            self.wait_backlog(records)
            self.view.check_open()
            for rel, name, bounds in admit:
                self._admit(rel, name, bounds)
            if locks is not None:
                self.locks.check_and_record(locks, t_max)
            ticket = self.log.submit(records, self.view.on_durable)
        if wait:
            self.view.waited(ticket)
            self._observe_latency(time.perf_counter() - start)
        return ticket

    def transaction(self) -> Transaction:
        """A write transaction: appends to any relations, visible only after ``commit()``."""
        self.view.check_open()
        return Transaction(self, self.next_txn_id())

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

    # The two calls a Transaction makes (engine/transaction.py TxnWriter).

    def txn_records(self, name: str, updates: pa.Table, txn_id: int) -> tuple[Admission, list[Record]] | None:
        """The UPDATES records of a transaction's append, and what to check when they are
        submitted; None when there is nothing to append."""
        rel, table, bounds, version = self._prepare(name, updates)
        if table.num_rows == 0:
            return None
        return (rel, name, bounds[0]), self._encode(rel, table, txn_id, bounds, version)

    def txn_submit(self, records: list[Record], admit: Sequence[Admission] | None = None,
                    refused: list[Record] | None = None) -> tuple[Ticket, BaseException | None]:
        """Submit a transaction's records. With ``admit``: under the engine lock, once the
        engine is open and each relation still exists and is not sealed at the least time
        written to it; if one is and ``refused`` is given, ``refused`` is submitted instead
        and the error returned (else raised). Without: at once (an ABORT needs no check)."""
        if admit is None:
            return self.log.submit(records, self.view.on_durable), None
        with self._lock:
            self.wait_backlog(records)
            self.view.check_open()
            try:
                for rel, name, t_min in admit:
                    self._admit(rel, name, t_min)
            except (TimeAlreadySealed, LookupError) as exc:
                if refused is None:
                    raise
                return self.log.submit(refused, self.view.on_durable), exc
            return self.log.submit(records, self.view.on_durable), None

    def txn_wait(self, ticket: Ticket) -> None:
        """Wait for a transaction's records (:meth:`RelationView.waited`)."""
        self.view.waited(ticket)

    def txn_abandoned(self, txn: TxnState) -> None:
        """A begun transaction was garbage collected: queued for :meth:`abort_abandoned` if
        still open (a finalizer may run inside any lock of any thread: nothing more here)."""
        if txn.is_open:
            self._abandoned.append(txn)

    def abort_abandoned(self) -> None:
        """Abort the transactions queued by :meth:`txn_abandoned` (before each compaction pass):
        each ABORT record closes one in the view, which lets the WAL cut and trim pass it."""
        records = []
        while True:
            try:
                txn = self._abandoned.popleft()
            except IndexError:
                break
            if txn.is_open:
                txn.finish(ABORTED)
                records.append(Record(RecordKind.ABORT, txn_id=txn.txn_id))
        if not records:
            return
        with self._lock:
            view = self.view
            if view.closed or view.failed is not None or view.superseded is not None:
                return  # nothing more goes to this log; the next open's replay discards them
            ticket = self.log.submit(records, view.on_durable)
        view.waited(ticket)

    def seal(self, name: str, t: int) -> None:
        """Write ``close t``: no further updates at times <= t. Durable on return."""
        t = check_time(t, "seal time")
        with self._lock:
            rel = self.view.get(name)
            if t < rel.sealed:
                raise FrontierRegression(f"relation {name!r} is already sealed through {rel.sealed}; "
                                         f"cannot seal at {t} (seals only move forward)")
            if t == rel.sealed:
                ticket = rel.seal_ticket
            else:
                rel.sealed = t
                ticket = rel.seal_ticket = self.log.submit(
                    [Record(RecordKind.PROGRESS, rel.entry.id, 0, t, t)], self.view.on_durable)
        if ticket is not None:
            self.view.waited(ticket)
        self.metrics.seals.labels(relation=name).inc()


class QueuedAppend:
    """A plain append on the log, not waited for yet (:meth:`Writer.append_queued`); no
    ticket: it had no rows, nothing to make durable."""

    __slots__ = ("_ticket", "_start", "_observe", "_fail")

    def __init__(self, ticket: Ticket | None, start: float, observe: Callable[[float], None],
                 fail: Callable[[BaseException], None]) -> None:
        self._ticket = ticket
        self._start = start
        self._observe = observe
        self._fail = fail  # RelationView.fail: a write of unknown outcome fails the engine

    def settled(self) -> bool:
        """Whether :meth:`wait` would return (or raise) at once."""
        return self._ticket is None or self._ticket.settled()

    def wait(self) -> None:
        """Return once the append is durable; raises the write's error."""
        if self._ticket is not None:
            try:
                self._ticket.wait()
            except Exception as exc:
                self._fail(exc)
                raise
            self._observe(time.perf_counter() - self._start)
