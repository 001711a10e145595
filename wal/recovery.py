"""The recovery procedure a new store session runs before it accepts writes (Waltz's).

1. Take a new store session id by compare-and-set of the partition metadata.
2. Open a replica session on every storage node (OPEN fences every older session).
3. Per replica: if its metadata state and its storage disagree (the storage remembers
   an older session than the metadata says it was engaged in: e.g. restored from an old
   copy), truncate it to the low-water mark saved in its storage; else if its state
   already has a closing high-water mark, truncate to that. Then report its max LSN.
4. Vote (wal/vote.py), waiting while undecidable: offline replicas are retried, and
   replicas that are online but behind are caught up from the one furthest ahead (the
   seed's "Replica C catches up with Replica A"); every new report re-runs the vote.
   Copying is safe because after step 3 every replica holds a prefix of one history.
   Without it, one dead replica and two that disagree would wait for ever.
5. On every reachable replica: truncate dirty records above the result, catch up from
   a replica that is ahead, set the low-water mark: it is now clean.
6. Update the metadata (compare-and-set on the version from step 1, so a coordinator
   that lost the race is fenced): clean replicas join the new session with
   UNRESOLVED; other replicas still UNRESOLVED get the resolved mark, keeping their
   session id; the rest stay as they were.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass, field

import trio

from sediment.errors import MetadataConflict, ReplicaUnavailable, SessionFenced
from sediment.wal.partition_meta import UNRESOLVED, PartitionMeta, ReplicaState
from sediment.wal.replica import ReplicaConnection
from sediment.wal.vote import resolve_closing_hwm
from sediment.wal.wire import MsgType, Status

log = logging.getLogger(__name__)


@dataclass
class RecoveryResult:
    session_id: int
    meta: PartitionMeta
    meta_version: int
    closing_hwm: int
    clean: dict[str, ReplicaConnection] = field(default_factory=dict)


def pre_vote_truncation(state: ReplicaState, storage_session: int, low_water_mark: int, max_lsn: int) -> int | None:
    """Step 3 as a pure decision: the LSN to truncate at (drop >= it), or None to keep all."""
    if storage_session < state.session_id:
        return low_water_mark + 1 if max_lsn > low_water_mark else None
    if state.closing_hwm != UNRESOLVED and max_lsn > state.closing_hwm:
        return state.closing_hwm + 1
    return None


async def open_replica(coord, nursery: trio.Nursery, address: str, session: int,
                       states: dict[str, ReplicaState]) -> tuple[ReplicaConnection, int, int]:
    """Connect, OPEN, apply step 3. Returns (connection, max LSN after truncation, lwm)."""
    conn = await ReplicaConnection.open(nursery, address, coord.connect, coord.cluster_key, coord.partition,
                                        coord.timeout)
    resp = await conn.call(MsgType.OPEN, session)
    coord.check_status(resp, address, "OPEN")
    before = int.from_bytes(resp.payload[:8], "little", signed=True)
    state = states.get(address, ReplicaState())
    cut = pre_vote_truncation(state, before, resp.low_water_mark, resp.max_lsn)
    max_lsn = resp.max_lsn
    if cut is not None:
        log.warning("replica %s: truncating at LSN %d before the vote (state %s, storage session %d)",
                    address, cut, state, before)
        resp = await conn.call(MsgType.TRUNCATE, session, cut)
        coord.check_status(resp, address, "TRUNCATE")
        max_lsn = resp.max_lsn
    return conn, max_lsn, resp.low_water_mark


async def copy_records(coord, source: ReplicaConnection, target: ReplicaConnection, session: int,
                       start: int, stop: int) -> None:
    """Copy LSNs [start, stop) from ``source`` to ``target`` (catch-up)."""
    nxt = start
    while nxt < stop:
        resp = await source.call(MsgType.READ, session, nxt, coord.catchup_bytes)
        if resp.status == Status.TRIMMED:  # the source compacted past us: the target skips ahead
            (first,) = struct.unpack("<Q", resp.payload[:8])
            reset = await target.call(MsgType.RESET, session, first, 0)
            coord.check_status(reset, target.address, "RESET")
            nxt = first
            continue
        coord.check_status(resp, source.address, "READ")
        if not resp.payload:
            raise ReplicaUnavailable(f"catch-up source {source.address} has nothing at LSN {nxt}")
        payload, count = coord.clip(resp.payload, nxt, stop)
        resp = await target.call(MsgType.APPEND, session, nxt, 0, payload)
        coord.check_status(resp, target.address, "APPEND (catch-up)")
        nxt += count


async def recover(coord, nursery: trio.Nursery) -> RecoveryResult:
    """Run the procedure; returns once the metadata names the clean replicas of the new session."""
    meta, version = await coord.blocking(coord.meta.load)
    session = meta.session_id + 1
    meta.session_id = session
    for r in coord.replicas:
        meta.replicas.setdefault(r, ReplicaState())
    version = await coord.blocking(coord.meta.save, meta, version)
    log.info("partition %d: store session %d", coord.partition, session)

    reports: dict[str, int] = {}
    conns: dict[str, ReplicaConnection] = {}
    changed = trio.Event()
    decided: list[int] = []

    async def join(address: str) -> None:
        nonlocal changed
        while not decided:
            try:
                conn, max_lsn, _lwm = await open_replica(coord, nursery, address, session, meta.replicas)
            except (ReplicaUnavailable, OSError) as exc:
                log.info("recovery: replica %s unavailable (%s); retrying", address, exc)
                await trio.sleep(coord.retry_interval)
                continue
            if decided:
                conn.kill("recovery already decided")
                return
            conns[address] = conn
            reports[address] = max_lsn
            changed.set()
            return

    catching: set[str] = set()

    async def catch_up(address: str, source: str) -> None:
        nonlocal changed
        try:
            await copy_records(coord, conns[source], conns[address], session, reports[address] + 1,
                               reports[source] + 1)
            reports[address] = max(reports[address], reports[source])
        except ReplicaUnavailable as exc:
            log.info("recovery: catching %s up from %s failed: %s", address, source, exc)
        finally:
            catching.discard(address)
            changed.set()

    async with trio.open_nursery() as copiers:
        async with trio.open_nursery() as joins:
            for r in coord.replicas:
                joins.start_soon(join, r)
            while True:
                hwm = resolve_closing_hwm(reports, len(coord.replicas))
                if hwm is not None:
                    decided.append(hwm)
                    joins.cancel_scope.cancel()
                    break
                if reports:
                    top = max(reports, key=lambda a: reports[a])
                    for a in list(reports):
                        if reports[a] < reports[top] and a not in catching and not conns[a].dead:
                            catching.add(a)
                            copiers.start_soon(catch_up, a, top)
                await changed.wait()
                changed = trio.Event()
        # copies still running finish first: clean-up asks each replica where it stands
    hwm = decided[0]
    log.info("partition %d session %d: closing high-water mark %d (reports %s)", coord.partition, session,
             hwm, reports)

    clean: dict[str, ReplicaConnection] = {}

    async def clean_up(address: str) -> None:
        conn = conns[address]
        try:
            info = await conn.call(MsgType.INFO, session)
            coord.check_status(info, address, "INFO")
            have = info.max_lsn
            if have > hwm:
                coord.check_status(await conn.call(MsgType.TRUNCATE, session, hwm + 1), address, "TRUNCATE")
            elif have < hwm:
                for src in [a for a in conns if reports[a] >= hwm and a != address]:
                    try:
                        await copy_records(coord, conns[src], conn, session, have + 1, hwm + 1)
                        break
                    except ReplicaUnavailable:
                        if conn.dead:
                            raise
                        continue
                else:
                    return
            coord.check_status(await conn.call(MsgType.SET_LWM, session, hwm), address, "SET_LWM")
            clean[address] = conn
        except ReplicaUnavailable as exc:
            log.warning("recovery: replica %s failed while being cleaned: %s", address, exc)

    async with trio.open_nursery() as cleaners:
        for a in conns:
            cleaners.start_soon(clean_up, a)

    new = PartitionMeta(meta.generation, session, {})
    for r, state in meta.replicas.items():
        if r in clean:
            new.replicas[r] = ReplicaState(session, UNRESOLVED)
        elif state.closing_hwm == UNRESOLVED:
            new.replicas[r] = ReplicaState(state.session_id, hwm)
        else:
            new.replicas[r] = state
    try:
        version = await coord.blocking(coord.meta.save, new, version)
    except MetadataConflict as exc:
        for c in conns.values():
            c.kill("fenced")
        raise SessionFenced(f"partition {coord.partition}: another coordinator changed the partition metadata "
                            f"while session {session} was recovering; this coordinator must stop") from exc
    for a, c in conns.items():
        if a not in clean:
            c.kill("not clean after recovery")
    return RecoveryResult(session, new, version, hwm, clean)

