"""A WriteAheadLog over replicated storage nodes, for the engine.

    log = ReplicatedLog.open(replicas=["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"],
                             metadata=store, partition=0, cluster_key=key)

The coordinator (wal/replication/store_session.py) runs on trio in a background thread;
this class is the thread-safe, blocking face the engine expects. How it behaves when a
quorum is lost, another coordinator takes over or ZooKeeper expires, and how trims reach
the nodes, is in docs/architecture.md ("Replication"). The choices made here:

* the log does not wait for a write to learn it was replaced: it watches its partition's
  metadata key (or re-reads it every ``owner_check_interval`` seconds of its clock);
* a ZooKeeper expiry is not a takeover: unless the metadata names another session, the
  coordinator closes its store session the ordinary way (nothing fails) and recovers;
* segments finish by size as in the local log (the owner's FRONTIERS record, appended
  from the trio thread in log order), so the compacter needs no ``compact()`` call;
* reads of the uncompacted tail come from the coordinator's cache of what it
  acknowledged (wal/replication/tail_cache.py); only what it does not hold is read from
  the in-sync replicas.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress

import trio

from sediment.clock import Clock, MonotonicClock
from sediment.errors import (
    EngineClosed,
    LogStopped,
    MetadataError,
    PartitionClaimed,
    ReplicationError,
    WalError,
)
from sediment.metadata.protocol import MetadataStore
from sediment.wal import record as rec
from sediment.wal.protocol import NO_PREAMBLE, OpenReport, PendingAppend, SegmentPreamble, check_trim, notify
from sediment.wal.replication.partition_meta import PartitionMeta, PartitionMetaStore
from sediment.wal.replication.partition_probe import refuse_claimed_partition
from sediment.wal.replication.replica import first_leaf, tcp_connect
from sediment.wal.replication.state_watch import StateWatch
from sediment.wal.replication.store_session import Coordinator
from sediment.wal.replication.tail_cache import DEFAULT_MAX_BYTES as DEFAULT_CACHE_BYTES
from sediment.wal.replication.tail_cache import TailCache
from sediment.wal.replication.wire import iter_records

log = logging.getLogger(__name__)
OWNER_CHECK_INTERVAL = 1.0  # seconds between ownership checks of a metadata store without watches


def assignment_generation(current: PartitionMeta, replicas: Sequence[str]) -> int:
    """The generation this coordinator writes with: the metadata's, or the next one when its
    replica set is a new assignment (replicas added, removed or replaced). As in Waltz, a
    coordinator still running with the older generation is then refused by the metadata
    writer (SessionFenced), so two assignments never take sessions in turn."""
    if current.session_id == 0 and not current.replicas:  # a partition new to the metadata
        return current.generation
    return current.generation + (set(replicas) != set(current.replicas))


def _refuse_another_engines_partition(metadata: MetadataStore, meta_key: str, replicas: Sequence[str],
                                      cluster_key: uuid.UUID, partition: int, timeout: float) -> None:
    """A partition new to this metadata store must be new on the nodes too (PartitionClaimed
    otherwise: they serve another engine), unless the metadata names it by the time the nodes
    answered: a session is written there before the nodes are told, so another coordinator
    of this deployment claimed it meanwhile (one creating it at the same time), and this one
    opens it as any later coordinator does."""
    if metadata.get(meta_key) is not None:
        return
    where = getattr(metadata, "hosts", "") + getattr(metadata, "root", "") or type(metadata).__name__
    try:
        refuse_claimed_partition(replicas, cluster_key, partition, where, timeout)
    except PartitionClaimed:
        if metadata.get(meta_key) is None:
            raise


class ReplicatedLog:
    """A WriteAheadLog whose records live on a quorum of storage nodes."""

    def __init__(self) -> None:
        raise TypeError("use ReplicatedLog.open(replicas=..., metadata=..., partition=..., cluster_key=...)")

    def expect_takeover(self) -> None:
        """The partition is being handed over: its fence is logged as information."""
        self.coordinator.takeover_expected = True

    @classmethod
    def open(cls, replicas: Sequence[str], metadata: MetadataStore, partition: int = 0,
             cluster_key: uuid.UUID | str | None = None, *, timeout: float = 5.0,
             open_timeout: float = 30.0, segment_bytes: int = 64 << 20,
             cache_bytes: int = DEFAULT_CACHE_BYTES, owner: str = "", clock: Clock | None = None,
             owner_check_interval: float = OWNER_CHECK_INTERVAL) -> ReplicatedLog:
        """Start a store session (recovery included) and return once it accepts writes.
        Raises ReplicationError if no write quorum is reachable within ``open_timeout``, and
        SessionFenced if another coordinator claimed the partition meanwhile.
        ``owner`` names this coordinator in the partition metadata; ``clock`` times the
        periodic ownership check of a metadata store without watches (see :meth:`_watch_owner`)."""
        if cluster_key is None:
            raise ReplicationError("a replicated log needs the cluster key its storage nodes were started with")
        self = object.__new__(cls)
        self.report = OpenReport()
        self.partition = partition
        self._closed = False
        self._preamble: SegmentPreamble = NO_PREAMBLE
        self._finished = 0
        self._trimmed = 0
        self._segment_bytes = max(1, int(segment_bytes))
        self.tail_cache = TailCache(cache_bytes)
        self.latency_observer: Callable[[float], None] | None = None  # seconds from submit to quorum
        self._unfinished_bytes = 0  # acknowledged since the last FRONTIERS record (trio thread)
        self._finishing = False
        self._listener: Callable[[int], None] | None = None
        self._lock = threading.Lock()
        self._inbox: deque = deque()  # submissions on their way to the trio thread, in order
        self._drain_scheduled = False
        self._stopped = False  # the trio thread is done: nothing will drain the inbox again
        key = cluster_key if isinstance(cluster_key, uuid.UUID) else uuid.UUID(cluster_key)
        meta = PartitionMetaStore(metadata, partition)
        _refuse_another_engines_partition(metadata, meta.key, replicas, key, partition, timeout)
        self.coordinator = Coordinator(replicas, meta, key, partition, connect=tcp_connect, timeout=timeout,
                                       generation=assignment_generation(meta.load()[0], replicas), owner=owner)
        self.coordinator.listeners.append(self._on_ack)
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self._fenced_callbacks: list[Callable[[BaseException], None]] = []
        self._watch = StateWatch()
        self._owner_dirty = False
        self._owner_checking = False
        self._clock_moved: trio.Event | None = None
        self._unwatch: Callable[[], None] | None = None
        self.zk_rechecks = 0  # ZooKeeper expiries handled without being superseded
        self.zk_rechecked = threading.Event()  # set after each such expiry's new session was asked for
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True,
                                        name=f"replicated-log-{partition}")
        self._thread.start()
        ready = self._ready.wait(open_timeout)
        fenced = self.coordinator.fenced
        if fenced is not None:  # another coordinator claimed the partition while this one recovered it
            self.close()
            raise fenced
        if self._failure is not None:
            failure = self._failure
            self.close()
            if isinstance(failure, ReplicationError):
                raise failure
            raise ReplicationError(f"partition {partition}: the store session failed to start: {failure}") from failure
        if not ready or not self.coordinator.writable.is_set():
            self.close()
            raise ReplicationError(f"partition {partition}: no write quorum of {list(replicas)} became available "
                                   f"within {open_timeout}s; start the storage nodes and check the cluster key")
        self._watch_owner(metadata, clock if clock is not None else MonotonicClock(), owner_check_interval)
        lost = getattr(metadata, "add_session_lost_listener", None)
        if lost is not None:
            lost(lambda: self._call_soon(self._zk_session_lost))
        for r in self.scan():
            if not self.report.records:
                self._trimmed = r.lsn  # the nodes' first kept record: what trims left
            self.report.records += 1
            self.tail_cache.add([r])
            if r.kind == rec.RecordKind.FRONTIERS:
                self._finished = max(self._finished, r.lsn + 1)
        return self

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._watch.started()
        try:
            with trio.CancelScope() as self._stop:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    await nursery.start(self._coordinate)
                    self._ready.set()
        except BaseException as exc:  # noqa: BLE001 - reported to the caller, not lost in a dead thread
            self._failure = first_leaf(exc)
        finally:
            self._stopped = True
            self._drain()
            self.coordinator.fail_all(self._stop_error())
            self._watch.finished()
            self._ready.set()
            fenced = self.coordinator.fenced
            if fenced is not None and not self._closed:
                notify(list(self._fenced_callbacks), fenced, "an on_fenced callback")

    async def _coordinate(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await self.coordinator.run(task_status=task_status)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()  # fenced: the ownership checks have nothing left to do

    def wait_for(self, predicate: Callable[[], object], timeout: float) -> bool:
        """Block until ``predicate()`` over the coordinator's state holds; False after
        ``timeout`` seconds or once the log stopped without it holding. The predicate runs
        on the trio thread after each of its task steps (wal/replication/state_watch.py), so
        it sees every change and reads no half-made one; keep it cheap and non-blocking."""
        return self._watch.wait_for(predicate, timeout)

    def on_fenced(self, callback: Callable[[BaseException], None]) -> None:
        """Call ``callback(SessionFenced)`` (from the log's thread; must not block on the log)
        when a newer coordinator superseded this one and the log stopped for good."""
        self._fenced_callbacks.append(callback)

    def _watch_owner(self, metadata: MetadataStore, clock: Clock, interval: float) -> None:
        """Learn from the metadata, not only at the next write, that another coordinator took
        the partition over: a store with watches (ZooKeeper) calls back when the partition's
        key changes; any other is re-read every ``interval`` seconds of ``clock``. Either way
        the coordinator is fenced (and the engine closes) as soon as the metadata names
        another session."""
        watch = getattr(metadata, "watch", None)
        if watch is not None:
            self._unwatch = watch(self.coordinator.meta.key, lambda: self._call_soon(self._owner_changed))
            return
        if hasattr(clock, "on_advance"):
            clock.on_advance(lambda: self._call_soon(self._wake_owner_poll))
        self._call_soon(lambda: self._nursery.start_soon(self._poll_owner, clock, interval))

    def _wake_owner_poll(self) -> None:
        if self._clock_moved is not None:
            self._clock_moved.set()

    async def _poll_owner(self, clock: Clock, interval: float) -> None:
        sleep_time = getattr(clock, "deadline_to_sleep_time", lambda d: d - clock.current_time())
        while self.coordinator.fenced is None:
            deadline = clock.current_time() + interval
            while clock.current_time() < deadline:
                self._clock_moved = trio.Event()
                with trio.move_on_after(max(0.0, sleep_time(deadline))):
                    await self._clock_moved.wait()
            self._owner_changed()

    def _owner_changed(self) -> None:
        """The partition's metadata changed (or is due a look): check who owns it, one
        check at a time, again if it changed meanwhile."""
        self._owner_dirty = True
        if self._nursery is not None and not self._owner_checking and self.coordinator.fenced is None:
            self._owner_checking = True
            self._nursery.start_soon(self._check_owner)

    async def _check_owner(self) -> None:
        try:
            while self._owner_dirty and self.coordinator.fenced is None:
                self._owner_dirty = False
                await self.coordinator.check_owner()
        finally:
            self._owner_checking = False

    def _zk_session_lost(self) -> None:
        if self._nursery is not None and self.coordinator.fenced is None:
            self._nursery.start_soon(self._zk_recheck)

    async def _zk_recheck(self) -> None:
        """The ZooKeeper session expired: superseded, or just a ZooKeeper outage? The
        partition metadata says: a session id other than ours means another coordinator
        recovered the partition; ours means nobody did, so recover a new session here."""
        c = self.coordinator
        ours = c.session
        while c.fenced is None:
            try:
                meta, _version = await c.blocking(c.meta.load)
                break
            except MetadataError as exc:
                log.warning("partition %d: the ZooKeeper session expired and the partition metadata cannot be "
                            "read yet (%s); retrying", self.partition, exc)
                await trio.sleep(c.retry_interval)
        else:
            return
        if meta.session_id != ours:
            c.fence(f"the ZooKeeper session expired and the partition metadata now names session "
                    f"{meta.session_id}: another coordinator took over")
            return
        log.warning("partition %d: the ZooKeeper session expired; no other coordinator took over (the metadata "
                    "still names session %d): recovering a new store session", self.partition, ours)
        if c.session == ours and c._session_scope is not None and c._broken is None:
            c.close_session("the ZooKeeper session expired")
        self.zk_rechecks += 1
        self.zk_rechecked.set()

    def _call_soon(self, fn: Callable, *args) -> None:
        if self._token is not None and not self._closed:
            with suppress(trio.RunFinishedError):
                self._token.run_sync_soon(fn, *args)

    def _run(self, afn: Callable, *args):
        if self._closed:
            raise self._closed_error()
        try:
            return trio.from_thread.run(afn, *args, trio_token=self._token)
        except trio.RunFinishedError:  # the coordinator stopped (fenced, most often): say why
            raise self._stop_error() from None

    def _closed_error(self) -> EngineClosed:
        return EngineClosed(f"the replicated log of partition {self.partition} is closed")

    def _on_ack(self, records: Sequence[rec.Record]) -> None:
        """Acknowledged records, in log order, on the trio thread: finish by size."""
        self._preamble.observe(records)
        self.tail_cache.add(records)
        self._unfinished_bytes += sum(r.frame_size for r in records)
        if self._unfinished_bytes >= self._segment_bytes and not self._finishing and self.coordinator.fenced is None:
            self._finishing = True
            self.coordinator.submit([self._preamble.record()], self._size_finished)

    def _size_finished(self, lsn: int, err: BaseException | None) -> None:
        self._finishing = False
        if err is None:
            self._finished_at(lsn)

    def _finished_at(self, lsn: int) -> None:
        """The FRONTIERS record at ``lsn`` is acknowledged: everything up to it is finished."""
        self._unfinished_bytes = 0
        self._finished = max(self._finished, lsn + 1)
        listener = self._listener
        if listener is not None:
            listener(self._finished)

    # --- writing -------------------------------------------------------------------------

    def submit(self, records: Sequence[rec.Record],
               on_durable: Callable[[Sequence[rec.Record]], None] | None = None) -> PendingAppend:
        """Queue ``records``; the ticket's ``wait()`` returns their last LSN once a quorum made
        them durable, or raises QuorumLost, SessionFenced or LogStopped (all OutcomeUnknown:
        not acknowledged, but maybe written)."""
        rec.check_appendable(records, f"the replicated log of partition {self.partition}")
        ticket = PendingAppend(records, [])
        started = time.perf_counter()

        def done(lsn: int, err: BaseException | None) -> None:
            if err is None and self.latency_observer is not None:
                self.latency_observer(time.perf_counter() - started)
            if err is None and on_durable is not None and records:
                on_durable(records)
            ticket.last_lsn, ticket.error = lsn, err
            ticket.done.set()

        if self._closed:
            raise self._closed_error()
        # Not a blocking round trip: the trio thread takes submissions in order, so the
        # coordinator's queue keeps submit order, and a caller holding its own lock (the engine
        # does) never waits for the trio thread, which may itself wait for that lock in
        # on_durable. One wake-up serves every submission queued before the trio thread runs.
        self._inbox.append((list(records), done))
        if self._stopped:
            self._fail_inbox()
        elif not self._drain_scheduled:
            self._drain_scheduled = True
            try:
                self._token.run_sync_soon(self._drain)
            except trio.RunFinishedError:
                self._fail_inbox()
        return ticket

    def _drain(self) -> None:
        self._drain_scheduled = False
        submit = self.coordinator.submit
        while self._inbox:
            records, done = self._inbox.popleft()
            submit(records, done)

    def _fail_inbox(self) -> None:
        while self._inbox:
            _records, done = self._inbox.popleft()
            done(-1, self._stop_error())

    def _stop_error(self) -> BaseException:
        """Why the coordinator stopped: fenced (the usual reason), a failure, or close()."""
        if self.coordinator.fenced is not None:
            return self.coordinator.fenced
        if self._failure is not None:
            return LogStopped(f"the coordinator of partition {self.partition} stopped on an unexpected "
                                    f"error ({self._failure!r}); appends not yet acknowledged may or may not "
                                    "be in the log; open a new log")
        return LogStopped(f"the replicated log of partition {self.partition} was closed; appends not yet "
                          "acknowledged may or may not be in the log")

    def append(self, records: Sequence[rec.Record]) -> int:
        return self.submit(records).wait()

    def replica_lag(self) -> dict[str, dict[str, object]]:
        """Each replica's state in the current session and how many acknowledged records it
        has yet to confirm (read without locks: a snapshot for operators, not for decisions)."""
        coord = self.coordinator
        committed = coord.committed
        return {address: {"state": link.state, "acked": link.acked, "lag": max(0, committed - link.acked)}
                for address, link in list(coord.links.items())}

    # --- reading -------------------------------------------------------------------------

    def scan(self, start: int | None = None) -> Iterator[rec.Record]:
        """From the coordinator's tail cache where it holds the records, else from the nodes."""
        lsn = max(self._trimmed, 0 if start is None else start)
        while True:
            cached = self.tail_cache.get(lsn)
            if cached is not None:
                yield cached
                lsn += 1
                continue
            payload = self._run(self.coordinator.read, lsn)
            if not payload:
                return
            for r in iter_records(payload):
                yield r
                lsn = r.lsn + 1

    def read(self, lsn: int) -> rec.Record:
        if lsn < self._trimmed:
            raise WalError(f"LSN {lsn} of the replicated log of partition {self.partition} was trimmed (the log "
                           f"starts at {self._trimmed}); its updates are in the engine's batches")
        for r in self.scan(lsn):
            if r.lsn == lsn:
                return r
            break
        raise WalError(f"LSN {lsn} is not in the replicated log of partition {self.partition} (it holds "
                       f"[0, {self.end_lsn}))")

    def read_many(self, lsns: Sequence[int]) -> list[rec.Record]:
        """One scan from the least LSN asked for, keeping those asked for: the nodes send
        records a range at a time."""
        wanted = set(lsns)
        if not wanted:
            return []
        low, high = min(wanted), max(wanted)
        if low < self._trimmed:
            return [self.read(low)]  # raises: trimmed
        got: dict[int, rec.Record] = {}
        for r in self.scan(low):
            if r.lsn in wanted:
                got[r.lsn] = r
            if r.lsn >= high:
                break
        return [got[lsn] if lsn in got else self.read(lsn) for lsn in lsns]

    @property
    def start_lsn(self) -> int:
        return self._trimmed

    @property
    def end_lsn(self) -> int:
        return self.coordinator.committed + 1

    @property
    def finished_lsn(self) -> int:
        return self._finished

    def set_preamble(self, preamble: SegmentPreamble | None) -> None:
        self._preamble = NO_PREAMBLE if preamble is None else preamble

    def set_finish_listener(self, callback: Callable[[int], None] | None) -> None:
        self._listener = callback

    def finish_segment(self) -> None:
        """Append a FRONTIERS record (replicated like any other); everything before and
        including it is finished: committed records never change. Nothing to finish (no
        record since the last FRONTIERS record) appends nothing, as the other logs do."""
        with self._lock:
            if self._closed:
                raise self._closed_error()
            if self.end_lsn <= self._finished:
                return
            lsn = self.append([self._preamble.record()])
            self._finished = max(self._finished, lsn + 1)
        self._call_soon(self._finished_at, lsn)

    def trim(self, lsn: int) -> None:
        """Records below ``lsn`` are in the engine's batches: storage nodes drop whole segments
        below it. A replica that was away meanwhile is reset to the first kept LSN when it
        catches up, since the records below exist nowhere in the log any more."""
        check_trim(f"the replicated log of partition {self.partition}", lsn, self.end_lsn)
        lsn = min(lsn, self._finished - 1)  # keep the last finished FRONTIERS record: it carries every frontier
        if lsn <= self._trimmed:
            return
        self._trimmed = lsn
        self.tail_cache.trim(lsn)
        self._call_soon(self.coordinator.trim, lsn)

    def close(self) -> None:
        if self._closed:
            return
        if self._token is not None and self._stop is not None:
            with suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._stop.cancel)
        self._closed = True
        if self._unwatch is not None:
            self._unwatch()
        self._thread.join(timeout=10)
        self._fail_inbox()
