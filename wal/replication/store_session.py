"""The coordinator of one replicated partition: store sessions, quorum writes, catch-up.

A store session is one coordinator's tenure, with a session id taken by compare-and-set
of the partition metadata (wal/replication/recovery.py runs before it writes). Appends are
queued, batched, given LSNs, and sent pipelined to every replica in sync; a batch is
acknowledged, in LSN order, once a write quorum (n // 2 + 1) of counting replicas made it
durable, never earlier. What a failed replica, a lost quorum and a FENCED reply do is in
docs/architecture.md ("Replication"); the reasons that matter here:

* a replica of the write set that fails closes the session rather than failing appends:
  the next recovery's closing high-water mark says which appends in flight a quorum
  holds, and the others are sent again (:meth:`Coordinator._carry_over`);
* a replica caught up in the background counts towards the quorum only once the
  metadata records it as engaged in this session, so the next recovery vote counts it
  (otherwise an ack could rest on a replica the vote ignores);
* a FENCED reply only makes the coordinator re-read the metadata: a node whose storage
  came from elsewhere may claim a newer session, and only the metadata says who owns it.

Everything runs on trio with streams from ``connect`` and trio's clock, so a whole
cluster runs in memory under a MockClock (tests/wal/test_replication_sim.py).
"""

from __future__ import annotations

import logging
import struct
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import trio

from sediment.errors import (
    MetadataError,
    QuorumLost,
    QuorumUnavailable,
    ReplicationError,
    ReplicaUnavailable,
    SessionFenced,
)
from sediment.wal import record as rec
from sediment.wal.replication import recovery as _recovery
from sediment.wal.replication.partition_meta import (
    UNRESOLVED,
    PartitionMeta,
    PartitionMetaStore,
    PartitionMetaWriter,
    ReplicaState,
)
from sediment.wal.replication.recovery import clip_frames, copy_records, open_replica, recover, truncate_to
from sediment.wal.replication.replica import Call, Connect, ReplicaConnection
from sediment.wal.replication.session_state import Batch, Done, Link, Pending
from sediment.wal.replication.vote import quorum_size
from sediment.wal.replication.wire import MsgType, Response, Status

log = logging.getLogger(__name__)

class Coordinator:
    """Owns a partition's writes. Call :meth:`submit` from the trio thread; run :meth:`run`."""

    def __init__(self, replicas: Sequence[str], meta: PartitionMetaStore, cluster_key: uuid.UUID,
                 partition: int = 0, *, connect: Connect, timeout: float = 5.0, retry_interval: float = 0.2,
                 blocking: Callable[..., Any] = trio.to_thread.run_sync, max_batch_bytes: int = 4 << 20,
                 max_inflight: int = 32, retain_bytes: int = 64 << 20, catchup_bytes: int = 1 << 20,
                 generation: int = 0, owner: str = "") -> None:
        if len(set(replicas)) != len(replicas) or not replicas:
            raise ReplicationError(f"replicas {list(replicas)} must be distinct and at least one")
        self.replicas = list(replicas)
        self.quorum = quorum_size(len(self.replicas))
        self.meta = meta
        self.cluster_key = cluster_key
        self.partition = partition
        self.connect = connect
        self.timeout = timeout
        self.retry_interval = retry_interval
        self.blocking = blocking
        self.max_batch_bytes = max_batch_bytes
        self.max_inflight = max_inflight
        self.trimmed = 0
        self.retain_bytes = retain_bytes
        self.catchup_bytes = catchup_bytes
        self.meta_writer = PartitionMetaWriter(meta, blocking, generation, owner)
        self.session = 0
        self.closing_hwm = -1  # the current session's resolved closing high-water mark
        self.replica_states: dict[str, ReplicaState] = {}
        self.end_lsn = 0  # next LSN to assign
        self.committed = -1  # highest acknowledged LSN
        self.links: dict[str, Link] = {}
        self.queue: deque[Pending] = deque()
        self.inflight: deque[Batch] = deque()
        self.retained: deque[Batch] = deque()
        self._retained_bytes = 0
        self.fenced: SessionFenced | None = None
        self.takeover_expected = False  # handed over on purpose: the fence is logged as information
        self._fence_suspect = ""  # a node answered FENCED: check the metadata before recovering
        self.writable = trio.Event()
        self.restarting = False  # a replica failed: a new session is recovering, submissions wait
        self._restart_by = 0.0  # (trio clock) when waiting submissions fail if no session took them
        self._restart_over = trio.Event()  # set (and replaced) whenever a restart ends, either way
        self._wake = trio.Event()
        self._progress = trio.Event()
        self._broken: BaseException | None = None
        self._session_scope: trio.CancelScope | None = None
        self._nursery_ref: trio.Nursery
        self.sessions_started = 0
        self.listeners: list[Callable[[Sequence[rec.Record]], None]] = []

    # --- public (trio thread) ---------------------------------------------------------------

    def submit(self, records: Sequence[rec.Record], done: Done) -> None:
        """Queue records; ``done(last_lsn, None)`` once a quorum made them durable, or
        ``done(-1, error)`` (QuorumLost, SessionFenced: not acknowledged, outcome unknown;
        QuorumUnavailable: refused before sending, nothing written)."""
        if self.fenced is not None:
            done(-1, self.fenced)
            return
        if not self.writable.is_set() and not self.restarting:
            done(-1, QuorumUnavailable(f"partition {self.partition}: no write quorum right now (recovering a new "
                                f"store session over {self.replicas}); nothing was written, retry later"))
            return
        self.queue.append(Pending(records, done))
        self._wake.set()

    def fence(self, why: str) -> None:
        """Stop for good: another coordinator (or a lost ZooKeeper session) superseded us."""
        if self.fenced is None:
            self.fenced = SessionFenced(f"partition {self.partition} session {self.session}: {why}; this "
                                        "coordinator was superseded and must stop (open a new one to write)")
            (log.info if self.takeover_expected else log.warning)("%s", self.fenced)
        self.fail_all(self.fenced)
        if self._session_scope is not None:
            self._session_scope.cancel()

    def trim(self, lsn: int) -> None:
        """Tell every connected replica that records below ``lsn`` are no longer needed (they
        are in the engine's batches). Best effort: a replica that misses it keeps more."""
        self.trimmed = max(self.trimmed, lsn)
        for link in self.links.values():
            if link.conn is not None and link.state in ("in_sync", "joining", "catching"):
                link.conn.request(MsgType.TRIM, self.session, lsn, 0, b"", on_reply=lambda call: None)

    def in_sync(self) -> list[str]:
        return [a for a, link in self.links.items() if link.state == "in_sync"]

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Recover, write, and on quorum loss recover again; returns only when fenced."""
        started = False
        while self.fenced is None:
            self.writable = trio.Event()
            if self._fence_suspect and not await self._still_ours():
                self.fence(self._fence_suspect)
                break
            self._fence_suspect = ""
            try:
                async with trio.open_nursery() as nursery:
                    self._session_scope = nursery.cancel_scope
                    await self._start_session(nursery)
                    if not started:
                        await self.writable.wait()
                        task_status.started()
                        started = True
                    await self._write_loop()
            except* SessionFenced as group:
                self.fence(str(group.exceptions[0]))
            except* (MetadataError, ReplicaUnavailable) as group:
                log.warning("partition %d: starting a session failed: %s", self.partition, group.exceptions[0])
                await trio.sleep(self.retry_interval)
            if self._broken is not None:
                log.warning("partition %d: session %d ended: %s", self.partition, self.session, self._broken)
        if not started:
            task_status.started()

    async def _still_ours(self) -> bool:
        """A node answered FENCED: only the metadata says whether another session took over
        (a node whose storage came from elsewhere may claim a newer session)."""
        return await self.superseded_by() is None

    async def superseded_by(self) -> PartitionMeta | None:
        """The partition metadata if it names another session or a newer generation (someone
        took over), None while it is ours; re-read until the metadata store answers."""
        while True:
            try:
                return await self.meta_writer.superseded_by()
            except MetadataError as exc:
                log.warning("partition %d: cannot read the metadata to check who owns it (%s); retrying",
                            self.partition, exc)
                await trio.sleep(self.retry_interval)

    async def check_owner(self) -> bool:
        """Fence this coordinator if the metadata says another one took the partition over,
        naming it; True if it did. Called when the metadata changed (a watch) or periodically."""
        if self.fenced is not None or self.session == 0:
            return self.fenced is not None
        newer = await self.superseded_by()
        if newer is not None and self.fenced is None:
            self.fence(f"the partition metadata names session {newer.session_id} (generation {newer.generation})"
                       f" of {newer.owner or 'another coordinator'}: another coordinator took over")
        return self.fenced is not None

    # --- sessions ---------------------------------------------------------------------------

    async def _start_session(self, nursery: trio.Nursery) -> None:
        self._broken = None
        if self.restarting:
            nursery.start_soon(self._restart_deadline)
        res = await recover(self, nursery)
        kept = res.closing_hwm
        if self.inflight and self.inflight[0].first <= kept and res.previous_session != self.session:
            # another session ran since ours sent them: those LSNs may hold its records
            kept = await _recovery.read_back_ours(self, res.clean, res.session_id, self.inflight, kept)
        self.session = res.session_id
        self.closing_hwm = res.closing_hwm
        self.replica_states = dict(res.meta.replicas)
        self.end_lsn = res.closing_hwm + 1
        self.committed = res.closing_hwm
        self._carry_over(kept)
        self.retained.clear()
        self._retained_bytes = 0
        self.links = {a: Link(a) for a in self.replicas}
        for a, conn in res.clean.items():
            link = self.links[a]
            link.conn, link.state, link.acked = conn, "in_sync", res.closing_hwm
        self._nursery_ref = nursery
        for link in self.links.values():
            if link.state == "down":
                self._spawn_catch_up(link)
        nursery.start_soon(self._watchdog)
        self.sessions_started += 1
        if not res.clean:
            self._broken = QuorumLost(f"partition {self.partition}: no replica is clean after recovery")
            await trio.sleep(self.retry_interval)
            nursery.cancel_scope.cancel()
            return
        if len(res.clean) < self.quorum:  # the others are caught up from the clean ones, then it writes
            log.info("partition %d session %d: only %s clean; writing once %d are in sync", self.partition,
                     self.session, sorted(res.clean), self.quorum)
            return
        self._become_writable()

    def _become_writable(self) -> None:
        self._end_restart()
        self.writable.set()
        if self.queue:
            self._wake.set()

    def _carry_over(self, closing_hwm: int) -> None:
        """Settle the appends a closed session left in flight: those the recovery kept (at
        or below ``closing_hwm``: on a quorum, and holding our records, see
        recovery.read_back_ours) are acknowledged, in order; the rest go back to the front
        of the queue, to be sent again with new LSNs."""
        old, self.inflight = self.inflight, deque()
        again: list[Pending] = []
        for b in old:
            for p in b.waiters:
                kept = sum(1 for r in p.records if r.lsn <= closing_hwm) if b.first <= closing_hwm else 0
                if again or kept < len(p.records):
                    again.append(Pending(p.records, p.done, max(p.skip, kept)))
                else:
                    self._acknowledge(p, b.last)
            b.waiters = []
        if again:
            log.info("partition %d: %d appends of the closed session were not kept; sending them again",
                     self.partition, len(again))
            self.queue.extendleft(reversed(again))

    async def _restart_deadline(self) -> None:
        """Appends wait through a session restart, but not for ever."""
        await trio.sleep_until(self._restart_by)
        if self.restarting and not self.writable.is_set():
            self.fail_all(QuorumLost(
                f"partition {self.partition}: no write quorum of {self.replicas}: no new store session accepted "
                f"writes within {self.timeout}s of a replica failure. Unacknowledged appends were not "
                "acknowledged (they may or may not survive recovery); retry once the storage nodes are reachable"))

    async def _watchdog(self) -> None:
        """Drop a replica whose oldest unacknowledged append is older than ``timeout``: a
        node that stopped answering (partitioned, hung) must not hold the session up."""
        while True:
            await trio.sleep(self.timeout / 4)
            now = trio.current_time()
            for link in list(self.links.values()):
                if link.state != "down" and link.unacked and now - link.unacked[0][1] > self.timeout:
                    self._drop(link, f"no reply to an append within {self.timeout}s")

    async def _write_loop(self) -> None:
        await self.writable.wait()
        while True:
            while not self.queue:
                await self._wake.wait()
                self._wake = trio.Event()
            while len(self.inflight) >= self.max_inflight:
                await self._progress.wait()
            self._send_batch()
            await trio.lowlevel.checkpoint()

    def _send_batch(self) -> None:
        taken: list[Pending] = []
        size = 0
        while self.queue and (not taken or size < self.max_batch_bytes):
            p = self.queue.popleft()
            taken.append(p)
            size += sum(r.frame_size for r in p.records[p.skip:])
        first = self.end_lsn
        parts: list[bytes] = []
        sizes: list[int] = []
        lsn = first
        for p in taken:
            for r in p.records[p.skip:]:
                r.lsn = lsn
                frame = rec.encode(r, lsn)
                parts.append(frame)
                sizes.append(len(frame))
                lsn += 1
        if lsn == first:  # only empty submissions: acknowledge at the current end
            for p in taken:
                self._acknowledge(p, self.committed)
            return
        batch = Batch(first, lsn - 1, b"".join(parts), sizes, taken)
        self.end_lsn = lsn
        self.inflight.append(batch)
        for link in self.links.values():
            if link.state in ("joining", "in_sync") and link.conn is not None:
                self._send_to(link, batch)

    def _send_to(self, link: Link, batch: Batch) -> None:
        conn = link.conn
        assert conn is not None
        link.unacked.append((batch.last, trio.current_time()))
        conn.request(MsgType.APPEND, self.session, batch.first, 0, batch.payload,
                     on_reply=lambda call, link=link, batch=batch, conn=conn: self._on_append(link, conn, batch, call))

    def _on_append(self, link: Link, conn: ReplicaConnection, batch: Batch, call: Call) -> None:
        if link.conn is not conn:
            return  # a reply from a connection this link already gave up on
        resp = call.response
        if call.error is not None or resp is None or not resp.ok:
            if resp is not None and resp.status == Status.FENCED:
                self._fence_suspect = f"storage node {link.address} says {resp.message}"
            why = str(call.error) if call.error is not None else f"{resp.status.name}: {resp.message}"
            self._drop(link, why)
            return
        link.acked = max(link.acked, batch.last)
        while link.unacked and link.unacked[0][0] <= link.acked:
            link.unacked.popleft()
        if link.state == "in_sync":
            for b in self.inflight:
                if b.last <= link.acked:
                    b.acks.add(link.address)
        self._advance()

    def _advance(self) -> None:
        while self.inflight and len(self.inflight[0].acks) >= self.quorum:
            b = self.inflight.popleft()
            self.committed = b.last
            for p in b.waiters:
                self._acknowledge(p, b.last)
            b.waiters = []
            self.retained.append(b)
            self._retained_bytes += len(b.payload)
            while self._retained_bytes > self.retain_bytes and len(self.retained) > 1:
                self._retained_bytes -= len(self.retained.popleft().payload)
        self._wake_progress()

    def _wake_progress(self) -> None:
        """Wake whoever waits for acknowledgements to move (the write loop's room, a
        replica's catch-up waiting for its joining appends): they look again."""
        self._progress.set()
        self._progress = trio.Event()

    def _acknowledge(self, p: Pending, last: int) -> None:
        if p.records:
            for listener in self.listeners:
                listener(p.records)
        p.done(p.records[-1].lsn if p.records else last, None)

    def _drop(self, link: Link, why: str) -> None:
        """A replica failed. One of the write set closes the session (a new one recovers,
        see the module doc); one that was catching up only retries in the background."""
        if link.state == "down":
            return
        log.warning("partition %d: replica %s dropped: %s", self.partition, link.address, why)
        counted = link.state == "in_sync"
        self._disconnect(link, why)
        if self._session_scope is not None and self.fenced is None and self._broken is None:
            if len(self.in_sync()) < self.quorum and self._fence_suspect:
                # a node says a newer session exists: the metadata decides (run's check)
                # between SessionFenced and a new session; failing with QuorumLost would
                # misreport a superseded coordinator as a lost quorum
                self.close_session(f"replica {link.address} answered FENCED ({why})")
            elif len(self.in_sync()) < self.quorum:
                self._lose_quorum(f"replica {link.address} failed ({why})")
            elif counted:
                self.close_session(f"replica {link.address} failed ({why})")
            else:
                self._spawn_catch_up(link)

    def _end_restart(self) -> None:
        if self.restarting:
            self.restarting = False
            self._restart_over.set()
            self._restart_over = trio.Event()

    def close_session(self, why: str) -> None:
        """End this session without failing anything: the next one recovers, then settles
        the appends in flight (:meth:`_carry_over`) and sends the queue."""
        if not self.restarting:
            self.restarting = True
            self._restart_by = trio.current_time() + self.timeout
        for link in self.links.values():
            self._disconnect(link, "the store session closed")
        self._end_session(ReplicationError(f"partition {self.partition} session {self.session}: {why}; a new "
                                           "store session is recovering"))

    def _disconnect(self, link: Link, why: str) -> None:
        """Take the link down (its connection's late replies are ignored: see _on_append)."""
        conn, link.conn, link.state = link.conn, None, "down"
        link.unacked.clear()
        if conn is not None:
            conn.kill(why)
        self._wake_progress()  # a catch-up waiting for this link's acknowledgements sees it down

    def _end_session(self, why: BaseException) -> None:
        """Stop writing and cancel the session; run() logs ``why`` and recovers a new one."""
        self._broken = why
        self.writable = trio.Event()
        assert self._session_scope is not None
        self._session_scope.cancel()

    def _spawn_catch_up(self, link: Link) -> None:
        if not link.catching_up:
            link.catching_up = True
            self._nursery_ref.start_soon(self._catch_up, link)

    def _lose_quorum(self, why: str) -> None:
        err = QuorumLost(f"partition {self.partition} session {self.session}: {why}; only "
                         f"{self.in_sync() or 'no replicas'} remain in sync, fewer than a quorum of {self.quorum} "
                         f"of {self.replicas}. Unacknowledged appends were not acknowledged (they may or may "
                         "not survive recovery); a new store session is being recovered, retry")
        self._end_session(err)
        self.fail_all(err)

    def fail_all(self, err: BaseException) -> None:
        """Fail every append in flight or queued with ``err``: the log stops, and no caller waits on."""
        pending = [w for b in self.inflight for w in b.waiters] + list(self.queue)
        for b in self.inflight:
            b.waiters = []
        self.queue.clear()
        self._end_restart()
        for p in pending:
            p.done(-1, err)

    # --- catch-up ---------------------------------------------------------------------------

    async def _catch_up(self, link: Link) -> None:
        """Reconnect a replica, bring it to the current end, then let it back in."""
        try:
            await self._catch_up_loop(link)
        finally:
            link.catching_up = False

    async def _catch_up_loop(self, link: Link) -> None:
        while self.fenced is None:
            try:
                await self._catch_up_once(link)
                return
            except (ReplicaUnavailable, OSError) as exc:
                log.info("partition %d: catching up %s failed (%s); retrying", self.partition, link.address, exc)
                self._disconnect(link, str(exc))
                await trio.sleep(self.retry_interval)
            except SessionFenced as exc:
                if not await self._still_ours():
                    self.fence(str(exc))
                    return
                log.warning("partition %d: %s, but the metadata is still at this session; retrying %s later",
                            self.partition, exc, link.address)
                self._disconnect(link, str(exc))
                await trio.sleep(self.retry_interval)

    async def _catch_up_once(self, link: Link) -> None:
        """Waltz's late replica: classified like any other, truncated to this session's closing
        high-water mark, its low-water mark set to it, then copied up to the live stream."""
        j = await open_replica(self, self._nursery_ref, link.address, self.session, self.meta_writer.meta)
        conn, max_lsn = j.conn, j.mark
        valid = max(self.closing_hwm, link.acked)  # what it acknowledged in this session is this session's
        if max_lsn > valid:
            max_lsn = await truncate_to(self, conn, self.session, valid)
        self.check_status(await conn.call(MsgType.SET_LWM, self.session, self.closing_hwm), link.address,
                          f"SET_LWM {self.closing_hwm}")
        link.conn, link.state, link.acked = conn, "catching", max_lsn
        nxt = max_lsn + 1
        while True:
            mem_first = self.retained[0].first if self.retained else (
                self.inflight[0].first if self.inflight else self.end_lsn)
            if nxt >= mem_first:
                break
            sources = [self.links[a].conn for a in self.in_sync() if self.links[a].conn is not None]
            if not sources:
                raise ReplicaUnavailable("no in-sync replica to catch up from")
            await copy_records(self, sources[0], conn, self.session, nxt, min(mem_first, self.committed + 1))
            nxt = min(mem_first, self.committed + 1)
            link.acked = max(link.acked, nxt - 1)  # copy_records waited for each APPEND's durable reply
        # From memory, without yielding: every batch from nxt on, then the live stream.
        last_sent = nxt - 1
        for b in list(self.retained) + list(self.inflight):
            if b.last < nxt:
                continue
            if b.first < nxt:
                payload, _ = clip_frames(b.payload, nxt, b.last + 1)
                part = Batch(nxt, b.last, payload, [], [])
                self._send_to(link, part)
            else:
                self._send_to(link, b)
            last_sent = b.last
        link.state = "joining"
        while link.acked < last_sent:
            if link.conn is not conn or link.state == "down":
                raise ReplicaUnavailable(f"replica {link.address} failed while catching up")
            await self._progress.wait()
        await self._record_in_session(link.address)
        if link.conn is conn and link.state == "joining":
            link.state = "in_sync"
            for b in self.inflight:
                if b.last <= link.acked:
                    b.acks.add(link.address)
            self._advance()
            log.info("partition %d: replica %s caught up and back in sync", self.partition, link.address)
            if not self.writable.is_set() and len(self.in_sync()) >= self.quorum:
                self._become_writable()

    async def _record_in_session(self, address: str) -> None:
        """Counted only once the metadata says it is engaged in this session (see module doc).
        Through the one metadata writer: a conflict re-reads and retries, and only metadata
        that moved to another session (or generation) fences."""
        def engage(meta: PartitionMeta) -> None:
            meta.replicas[address] = ReplicaState(self.session, UNRESOLVED)

        try:
            meta = await self.meta_writer.update(engage)
        except MetadataError as exc:
            raise ReplicaUnavailable(f"cannot record {address} as caught up: {exc}") from exc
        self.replica_states = dict(meta.replicas)

    # --- helpers used by recovery ---------------------------------------------------------

    def check_status(self, resp: Response, address: str, what: str) -> None:
        if resp.status == Status.OK:
            return
        if resp.status == Status.FENCED:
            raise SessionFenced(f"storage node {address} refused {what}: {resp.message}")
        if resp.status == Status.WRONG_CLUSTER:
            raise ReplicationError(f"storage node {address} refused {what}: {resp.message}")
        raise ReplicaUnavailable(f"storage node {address} refused {what}: {resp.status.name}: {resp.message}")

    async def read(self, start: int, max_bytes: int = 1 << 20) -> bytes:
        """Committed record frames from ``start`` (up to the committed end), from an in-sync replica."""
        if start > self.committed:
            return b""
        for _attempt in range(2):  # a session that closes under the read: once more in the next one
            if self.restarting:
                with trio.move_on_at(self._restart_by):
                    await self._restart_over.wait()
            for a in self.in_sync():
                conn = self.links[a].conn
                if conn is None:
                    continue
                try:
                    resp = await conn.call(MsgType.READ, self.session, start, max_bytes)
                    if resp.status == Status.TRIMMED:  # everything below was trimmed: read from the first kept
                        start = max(start, struct.unpack("<Q", resp.payload[:8])[0])
                        resp = await conn.call(MsgType.READ, self.session, start, max_bytes)
                except ReplicaUnavailable:
                    continue
                if resp.ok:
                    return clip_frames(resp.payload, start, self.committed + 1)[0]
            if not self.restarting:
                break
        raise QuorumLost(f"partition {self.partition}: no in-sync replica answered a read at LSN {start}")
