"""The recovery procedure a new store session runs before it accepts writes (Waltz's; the
rules in prose are in docs/architecture.md, "Replication", and docs/formats.md, "The vote").

1. Take a new store session id by compare-and-set of the partition metadata (refused
   when the metadata's generation is newer than the coordinator's).
2. Open a replica session on every assigned storage node (OPEN fences older sessions).
3. Each replica classifies itself (:func:`classify`) before any vote: it may be truncated
   to a mark already known to be committed, and then does not vote.
4. Vote (wal/replication/vote.py) every time the situation changes, catching replicas
   below the highest report up meanwhile; absent replicas are retried. The result does
   not depend on who reports first: a decided mark is confirmed by every later report.
5. On every reachable replica: truncate dirty records above the result, set the
   low-water mark to it, catch up from a replica that holds it: then it is clean.
6. Update the metadata (:func:`final_states`): clean replicas join the new session.
"""

from __future__ import annotations

import logging
import struct
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from sediment.errors import ReplicaUnavailable, SessionFenced
from sediment.wal import record as rec
from sediment.wal.replication.partition_meta import (
    UNRESOLVED,
    PartitionMeta,
    PartitionMetaWriter,
    ReplicaState,
)
from sediment.wal.replication.replica import Connect, ReplicaConnection
from sediment.wal.replication.vote import EMPTY, Decision, decide
from sediment.wal.replication.wire import MsgType, Response, Status

log = logging.getLogger(__name__)


class RecoveryHost(Protocol):
    """What recovery needs from its coordinator (wal/replication/store_session.py's Coordinator)."""

    replicas: list[str]
    partition: int
    connect: Connect
    cluster_key: uuid.UUID
    timeout: float
    retry_interval: float
    catchup_bytes: int
    meta_writer: PartitionMetaWriter

    def check_status(self, resp: Response, address: str, what: str) -> None: ...


@dataclass
class RecoveryResult:
    session_id: int
    meta: PartitionMeta
    closing_hwm: int
    clean: dict[str, ReplicaConnection] = field(default_factory=dict)
    previous_session: int = 0  # the metadata's session before this one took over


@dataclass(frozen=True)
class Classification:
    keep_through: int | None  # truncate to this mark (drop every LSN above it), or None
    voting: bool


def classify(state: ReplicaState | None, storage_session: int, low_water_mark: int, max_lsn: int) -> Classification:
    """Step 3 as a pure decision. ``state`` is None for a replica new to the metadata; session
    -1 marks one added before but never clean: it also keeps no more than its own
    low-water mark (its storage may hold another history above it)."""
    if state is None or storage_session < state.session_id:
        return Classification(low_water_mark if max_lsn > low_water_mark else None, False)
    if state.session_id < 0:
        mark = min(low_water_mark, state.closing_hwm) if state.closing_hwm != UNRESOLVED else low_water_mark
        return Classification(mark if max_lsn > mark else None, False)
    if state.closing_hwm != UNRESOLVED and storage_session > state.session_id:
        # A later session engaged this storage, but its metadata update never landed: it
        # may have set a low-water mark above the metadata's closing mark (committed, and
        # held consistently), or crashed before (then the closing mark still holds).
        mark = max(low_water_mark, state.closing_hwm)
        return Classification(mark if max_lsn > mark else None, False)
    if state.closing_hwm != UNRESOLVED:
        return Classification(state.closing_hwm if max_lsn > state.closing_hwm else None, False)
    return Classification(None, max_lsn >= low_water_mark)


@dataclass
class Joined:
    """A replica that reported: its connection, where it stands and how it counts."""

    address: str
    conn: ReplicaConnection
    mark: int
    voting: bool
    new: bool
    storage_session: int = 0  # the session its storage had opened before this one
    low_water_mark: int = EMPTY  # stored on the node: it never moves backwards


async def truncate_to(host: RecoveryHost, conn: ReplicaConnection, session: int, mark: int) -> int:
    """Drop every record above ``mark``; the replica's max LSN after it. A node keeps at least
    up to its first record - 1 (below it was trimmed: those records are in batches, so
    committed), so a mark below that becomes first - 1: the replica is emptied."""
    probe = await conn.call(MsgType.READ, session, max(mark + 1, 0), 1)
    if probe.status == Status.TRIMMED:
        mark = max(mark, struct.unpack("<Q", probe.payload[:8])[0] - 1)
    resp = await conn.call(MsgType.TRUNCATE, session, mark + 1)
    host.check_status(resp, conn.address, f"TRUNCATE to {mark}")
    return resp.max_lsn


async def open_replica(host: RecoveryHost, nursery: trio.Nursery, address: str, session: int,
                       meta: PartitionMeta) -> Joined:
    """Connect, OPEN, classify and truncate (step 3)."""
    conn = await ReplicaConnection.open(nursery, address, host.connect, host.cluster_key, host.partition,
                                        host.timeout)
    resp = await conn.call(MsgType.OPEN, session)
    host.check_status(resp, address, "OPEN")
    before = int.from_bytes(resp.payload[:8], "little", signed=True)
    members = meta.replicas or {a: ReplicaState() for a in host.replicas}
    state = members.get(address)
    c = classify(state, before, resp.low_water_mark, resp.max_lsn)
    mark = resp.max_lsn
    if c.keep_through is not None:
        log.warning("replica %s: truncating to LSN %d before the vote (state %s, storage session %d, "
                    "low-water mark %d)", address, c.keep_through, state, before, resp.low_water_mark)
        mark = await truncate_to(host, conn, session, c.keep_through)
    return Joined(address, conn, mark, c.voting, state is None, before, resp.low_water_mark)


def clip_frames(payload: bytes, start: int, stop: int) -> tuple[bytes, int]:
    """The frames of ``payload`` with LSN in [start, stop), and how many there are."""
    view = memoryview(payload)
    pos = 0
    begin = end = -1
    count = 0
    while pos < len(payload):
        head = rec.decode_header(view, pos)
        if head is None:
            raise ReplicaUnavailable(f"damaged record frame at payload offset {pos}")
        if start <= head.lsn < stop:
            if begin < 0:
                begin = pos
            end = pos + head.frame_size
            count += 1
        pos += head.frame_size
    return (bytes(view[begin:end]) if begin >= 0 else b""), count


async def copy_records(host: RecoveryHost, source: ReplicaConnection, target: ReplicaConnection, session: int,
                       start: int, stop: int) -> None:
    """Copy LSNs [start, stop) from ``source`` to ``target`` (catch-up)."""
    nxt = start
    while nxt < stop:
        resp = await source.call(MsgType.READ, session, nxt, host.catchup_bytes)
        if resp.status == Status.TRIMMED:  # the source compacted past us: the target skips ahead
            (first,) = struct.unpack("<Q", resp.payload[:8])
            reset = await target.call(MsgType.RESET, session, first, 0)
            host.check_status(reset, target.address, "RESET")
            nxt = first
            continue
        host.check_status(resp, source.address, "READ")
        if not resp.payload:
            raise ReplicaUnavailable(f"catch-up source {source.address} has nothing at LSN {nxt}")
        payload, count = clip_frames(resp.payload, nxt, stop)
        resp = await target.call(MsgType.APPEND, session, nxt, 0, payload)
        host.check_status(resp, target.address, "APPEND (catch-up)")
        nxt += count


async def read_back_ours(host: RecoveryHost, clean: dict[str, ReplicaConnection], session: int,
                         sent: Iterable[Any], closing_hwm: int) -> int:
    """The highest LSN, at most ``closing_hwm``, through which a clean replica holds exactly
    the frames a coordinator ``sent`` (its batches in flight, consecutive: ``first``,
    ``payload``, ``sizes``); the first batch's first LSN - 1 if none. A clean replica holds
    the resolved log, so a frame that differs (another session's record) means ours is
    not in the log there nor above. ReplicaUnavailable if no clean replica can be read."""
    expected: list[bytes] = []
    first = -1
    for b in sent:
        first = b.first if first < 0 else first
        pos = 0
        for size in b.sizes:
            expected.append(b.payload[pos:pos + size])
            pos += size
    stop = min(first + len(expected), closing_hwm + 1)
    for address, conn in clean.items():
        nxt = first
        try:
            while nxt < stop:
                resp = await conn.call(MsgType.READ, session, nxt, host.catchup_bytes)
                host.check_status(resp, address, f"READ at LSN {nxt}")
                frames, _ = clip_frames(resp.payload, nxt, stop)
                if not frames:
                    raise ReplicaUnavailable(f"storage node {address} has nothing at LSN {nxt}")
                view, pos = memoryview(frames), 0
                while pos < len(frames):
                    head = rec.decode_header(view, pos)
                    if head is None or head.lsn != nxt:
                        raise ReplicaUnavailable(f"storage node {address} sent a damaged frame at LSN {nxt}")
                    if view[pos:pos + head.frame_size] != expected[nxt - first]:
                        log.warning("partition %d: LSN %d holds another session's record, not the one this "
                                    "coordinator sent there", host.partition, nxt)
                        return nxt - 1
                    pos += head.frame_size
                    nxt += 1
            return stop - 1
        except (ReplicaUnavailable, SessionFenced) as exc:
            log.info("recovery: reading back the appends in flight from %s failed: %s", address, exc)
    raise ReplicaUnavailable(f"partition {host.partition} session {session}: no clean replica could be read "
                             f"to tell which appends in flight from LSN {first} the log kept")


class Vote:
    """Steps 2 to 4: joins, catch-ups and the vote, re-run on every change."""

    def __init__(self, host: RecoveryHost, nursery: trio.Nursery, session: int, meta: PartitionMeta) -> None:
        self.host, self.nursery, self.session, self.meta = host, nursery, session, meta
        self.members = list(meta.replicas) or list(host.replicas)  # who votes or counts as absent
        self.joined: dict[str, Joined] = {}
        self.catching: set[str] = set()
        self.rejoining: set[str] = set()
        self.decided: int | None = None
        self._changed = trio.Event()

    def decision(self) -> Decision:
        counted = [j for j in self.joined.values() if not j.new]
        absent = sum(1 for m in self.members if m not in self.joined)
        floor = max((j.low_water_mark for j in counted if j.mark >= j.low_water_mark), default=EMPTY)
        return decide([j.mark for j in counted if j.voting], [j.mark for j in counted if not j.voting], absent,
                      len(self.members) // 2 + 1, floor)

    async def run(self) -> int:
        async with trio.open_nursery() as copiers:
            async with trio.open_nursery() as joins:
                for r in self.host.replicas:
                    joins.start_soon(self._join, r)
                while True:
                    d = self.decision()
                    if d.resolved is not None:
                        self.decided = d.resolved
                        joins.cancel_scope.cancel()
                        break
                    self._start_catch_ups(copiers)
                    self._rejoin_dropped(joins)
                    with trio.move_on_after(self.host.retry_interval):  # a connection dies unannounced
                        await self._changed.wait()
                    self._changed = trio.Event()
        return self.decided  # copies still running finished first: clean-up asks each replica

    async def _join(self, address: str) -> None:
        while self.decided is None:
            try:
                j = await open_replica(self.host, self.nursery, address, self.session, self.meta)
            except SessionFenced as exc:
                if not await self.host.meta_writer.still_ours():
                    raise
                log.warning("recovery: replica %s claims a newer session than the metadata's %d (%s); "
                            "treating it as unavailable", address, self.session, exc)
                await trio.sleep(self.host.retry_interval)
                continue
            except (ReplicaUnavailable, OSError) as exc:
                log.info("recovery: replica %s unavailable (%s); retrying", address, exc)
                await trio.sleep(self.host.retry_interval)
                continue
            if self.decided is not None:
                j.conn.kill("recovery already decided")
                return
            self.joined[address] = j
            self.rejoining.discard(address)
            self._changed.set()
            return

    def _rejoin_dropped(self, joins: trio.Nursery) -> None:
        """Join again each replica whose connection dropped after it reported. Its report
        stays counted until the new one replaces it, but a catch-up needs a live connection:
        when the only replica ahead had dropped, no copy could start and no join was left to
        run, and the vote waited for ever."""
        for address, j in self.joined.items():
            if j.conn.dead and address not in self.rejoining:
                self.rejoining.add(address)
                joins.start_soon(self._join, address)

    def _start_catch_ups(self, copiers: trio.Nursery) -> None:
        counted = [j for j in self.joined.values() if not j.new and not j.conn.dead]
        if not counted:
            return
        top = max(counted, key=lambda j: j.mark)
        for j in counted:
            if j.mark < top.mark and j.address not in self.catching:
                self.catching.add(j.address)
                copiers.start_soon(self._catch_up, j, top)

    async def _catch_up(self, target: Joined, source: Joined) -> None:
        try:
            await copy_records(self.host, source.conn, target.conn, self.session, target.mark + 1, source.mark + 1)
            target.mark = max(target.mark, source.mark)
        except SessionFenced:
            if not await self.host.meta_writer.still_ours():
                raise
            log.warning("recovery: catching %s up from %s: a node claims a newer session", target.address,
                        source.address)
        except ReplicaUnavailable as exc:
            log.info("recovery: catching %s up from %s failed: %s", target.address, source.address, exc)
        finally:
            self.catching.discard(target.address)
            self._changed.set()


async def finish_replica(host: RecoveryHost, j: Joined, session: int, hwm: int, sources: list[Joined]) -> bool:
    """Step 5 for one replica: truncate above ``hwm``, set the low-water mark, catch up.
    True once it is clean (holds exactly [.., hwm])."""
    info = await j.conn.call(MsgType.INFO, session)
    host.check_status(info, j.address, "INFO")
    have = info.max_lsn
    if have > hwm:
        have = await truncate_to(host, j.conn, session, hwm)
    host.check_status(await j.conn.call(MsgType.SET_LWM, session, hwm), j.address, f"SET_LWM {hwm}")
    if have >= hwm:
        return True
    for src in sources:
        if src is j or src.conn.dead:
            continue
        try:
            await copy_records(host, src.conn, j.conn, session, have + 1, hwm + 1)
            return True
        except ReplicaUnavailable:
            if j.conn.dead:
                raise
    return False


def final_states(before: PartitionMeta, assigned: list[str], clean: set[str], session: int,
                 hwm: int) -> dict[str, ReplicaState]:
    """Step 6 as a pure function: the replica states the new session writes."""
    out: dict[str, ReplicaState] = {}
    for r in assigned:
        state = before.replicas.get(r)
        if r in clean:
            out[r] = ReplicaState(session, UNRESOLVED)
        elif state is None:
            out[r] = ReplicaState(-1, hwm)
        elif state.session_id < session and state.closing_hwm == UNRESOLVED:
            out[r] = ReplicaState(state.session_id, hwm)
        else:
            out[r] = state
    return out


async def recover(host: RecoveryHost, nursery: trio.Nursery) -> RecoveryResult:
    """Run the procedure; returns once the metadata names the clean replicas of the new session."""
    before, session = await host.meta_writer.begin_session()
    log.info("partition %d: store session %d", host.partition, session)
    vote = Vote(host, nursery, session, before)
    hwm = await vote.run()
    log.info("partition %d session %d: closing high-water mark %d (marks %s)", host.partition, session, hwm,
             {a: (j.mark, j.voting, j.new) for a, j in vote.joined.items()})
    sources = sorted(vote.joined.values(), key=lambda j: -j.mark)
    clean: dict[str, ReplicaConnection] = {}

    async def clean_up(j: Joined) -> None:
        try:
            if await finish_replica(host, j, session, hwm, sources):
                clean[j.address] = j.conn
        except SessionFenced:
            if not await host.meta_writer.still_ours():
                raise
            log.warning("recovery: replica %s claims a newer session; not clean", j.address)
        except ReplicaUnavailable as exc:
            log.warning("recovery: replica %s failed while being cleaned: %s", j.address, exc)

    async with trio.open_nursery() as cleaners:
        for j in vote.joined.values():
            cleaners.start_soon(clean_up, j)
    states = final_states(before, host.replicas, set(clean), session, hwm)

    def record(m: PartitionMeta) -> None:
        m.replicas = dict(states)

    try:
        meta = await host.meta_writer.update(record)
    except BaseException:
        for j in vote.joined.values():
            j.conn.kill("recovery failed")
        raise
    for j in vote.joined.values():
        if j.address not in clean:
            j.conn.kill("not clean after recovery")
    return RecoveryResult(session, meta, hwm, clean, before.session_id)
