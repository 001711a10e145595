"""The state a store session's coordinator keeps (wal/replication/store_session.py): each
submission waiting for its quorum, each batch in flight, and its view of each replica."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sediment.wal import record as rec
from sediment.wal.replication.replica import ReplicaConnection

Done = Callable[[int, BaseException | None], None]  # (last LSN, error) once acknowledged or failed


@dataclass(slots=True, eq=False)
class Pending:
    """One submission: its records, its callback, and how many of them (a prefix) are
    already durable from an earlier session (only the rest is sent again)."""

    records: Sequence[rec.Record]
    done: Done
    skip: int = 0


@dataclass
class Batch:
    first: int
    last: int
    payload: bytes
    sizes: list[int]
    waiters: list[Pending]
    acks: set[str] = field(default_factory=set)


@dataclass
class Link:
    """The coordinator's view of one replica in this session."""

    address: str
    conn: ReplicaConnection | None = None
    state: str = "down"  # down | catching | joining | in_sync (only in_sync counts for the quorum)
    acked: int = -1  # highest LSN the replica acknowledged as durable in this session
    unacked: deque = field(default_factory=deque)  # (last LSN, sent at) of appends awaiting its reply
    catching_up: bool = False  # a catch-up task owns this link (at most one)
