"""Appends applied once across a failover: the last applied sequence number per client,
kept in the partition's own log.

A client append carries an idempotency key (client id, sequence number); a client id is one
thread of one client, whose appends are sequential, so "applied" is "sequence <= the last
applied". The owner writes the append together with a row of the internal relation
``_cluster.applied`` (client, seq) in one ``append_many`` (one WAL transaction), retracting
the client's previous row, so the key is durable exactly when the append is. A new owner
rebuilds the table from the relation's committed rows after the engine's recovery, so a
retry sent to it after a failover is recognised and answered with success, not applied twice.

A keyed write that fails with anything but NothingWritten (a lost quorum: QuorumLost, an
OutcomeUnknown) may be in the log, where the next recovery keeps it, while the engine that
wrote it shows nothing of it: its table cannot tell a retry from a new write. That engine
then takes no keyed write (NotPartitionOwner: nothing written, retry) and ``on_doubt`` has
the partition opened again, whose recovery settles the log and whose table is rebuilt
from it.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sediment.errors import (
    AppliedKeysUnavailable,
    InvalidArgument,
    NothingWritten,
    NotPartitionOwner,
    RelationExists,
)

APPLIED = "_cluster.applied"
SCHEMA = pa.schema([("client", pa.string()), ("seq", pa.int64())])
CREATION_WAIT = 10.0  # seconds a keyed write waits for a replaced coordinator's entry of APPLIED to go
CREATION_POLL = 0.1  # seconds between tries meanwhile


def _marks(rows: list[tuple[str, int, int]]) -> pa.Table:
    return pa.table({"client": pa.array([r[0] for r in rows], pa.string()),
                     "seq": pa.array([r[1] for r in rows], pa.int64()),
                     "time": pa.array([0] * len(rows), pa.int64()),
                     "diff": pa.array([r[2] for r in rows], pa.int64())})


def load(engine: Any, wait: float = CREATION_WAIT) -> dict[str, int]:
    """client -> last applied sequence, from the relation's committed rows (created if missing).

    The relation may exist in the metadata without being this engine's: a coordinator this one
    replaced, not yet aware of it, wrote the entry, and its confirmation will remove it again
    (engine/catalog.py). Taking RelationExists for "made" then cached an empty table over a
    relation the engine does not have, and every keyed write failed with UnknownRelation. So
    the creation is tried again until the entry is gone or the engine has it, for ``wait``
    seconds at most, then AppliedKeysUnavailable (nothing written, not cached)."""
    deadline = time.monotonic() + wait
    while APPLIED not in engine.relations(include_internal=True):
        try:
            engine.add_relation(APPLIED, SCHEMA)
            return {}
        except RelationExists as exc:
            if APPLIED in engine.relations(include_internal=True):
                break  # another thread of this engine made it
            if time.monotonic() > deadline:
                raise AppliedKeysUnavailable(f"{APPLIED} exists in the metadata but not in this engine ({exc}): a "
                                             f"coordinator this one replaced created it and has not removed it "
                                             f"within {wait:g} s; nothing was written: retry, or reopen the engine "
                                             "(it then serves the relation)") from None
        time.sleep(CREATION_POLL)
    batches = list(engine.replay(APPLIED))
    if not batches:
        return {}
    table = pa.Table.from_batches(batches).group_by(["client", "seq"]).aggregate([("diff", "sum")])
    table = table.filter(pc.greater(table.column("diff_sum"), 0))
    last: dict[str, int] = {}
    for client, seq in zip(table.column("client").to_pylist(), table.column("seq").to_pylist(), strict=True):
        last[client] = max(seq, last.get(client, seq))
    return last


class KeyLocks:
    """A lock per key, kept only while a thread holds or waits for it: a member serves
    clients that come and go (a client id per thread of each client), so a lock kept per id
    ever seen would grow for as long as the member runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[Hashable, list] = {}  # key -> [its lock, threads holding or waiting]

    @contextmanager
    def hold(self, key: Hashable) -> Iterator[None]:
        with self._lock:
            entry = self._held.get(key)
            if entry is None:
                entry = self._held[key] = [threading.Lock(), 0]
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._lock:
                entry[1] -= 1
                if not entry[1]:
                    del self._held[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)


class AppliedOnce:
    """The owner's side: each partition engine's table, loaded on first use after it opened.
    ``on_doubt(partition, engine)``: called once a keyed write on ``engine`` failed with its
    outcome unknown (see the module doc); it should open the partition again.

    The table keeps one entry per client id that ever wrote to the partition (and the
    relation one row each): see docs/formats.md. The engine it was loaded from is held
    weakly, so a partition handed to another member does not keep its closed engine."""

    def __init__(self, on_doubt: Callable[[int, Any], None] | None = None,
                 doubted: Callable[[int, str, int], Exception] | None = None) -> None:
        """``doubted(partition, client, seq)``: the error refusing a keyed write on an engine in
        doubt (default: NotPartitionOwner, a cluster's redirect; a single engine, which refuses
        everything once failed, says EngineFailed)."""
        self._lock = threading.Lock()
        self._doubted_error = doubted
        self._tables: dict[int, tuple[weakref.ref, dict[str, int]]] = {}
        self._client_locks = KeyLocks()  # (partition, client) while one of its writes is decided
        self._doubted: weakref.WeakSet = weakref.WeakSet()  # engines whose log may hold more than their table
        self._on_doubt = on_doubt

    def _table(self, engine: Any, partition: int) -> dict[str, int]:
        with self._lock:
            held = self._tables.get(partition)
            if held is not None and held[0]() is engine:
                return held[1]
        table = load(engine)
        with self._lock:
            held = self._tables.get(partition)
            if held is None or held[0]() is not engine:
                self._tables[partition] = held = (weakref.ref(engine), table)
            return held[1]

    def append_many(self, engine: Any, partition: int, updates: Mapping[str, pa.Table], client: str,
                    seq: int, locks: Any = None) -> bool:
        """``append_many(updates, locks=locks)`` unless (client, seq) was applied already (then
        the locks are not checked: the write they guarded is in); True if applied now."""
        extra = {} if locks is None else {"locks": locks}
        return self.apply(engine, partition, client, seq,
                          lambda marks: engine.append_many({**updates, APPLIED: marks}, **extra))

    def apply(self, engine: Any, partition: int, client: str, seq: int, write: Callable[[pa.Table], Any]) -> bool:
        """``write(marks)`` unless (client, seq) was applied already; True if applied now.
        ``write`` must make the marks (rows of APPLIED) durable and visible exactly when its
        own write is: in the same WAL transaction."""
        if not isinstance(client, str) or not client or not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
            raise InvalidArgument(f"an append's idempotency key must be a client id and a sequence number >= 0, "
                                  f"not ({client!r}, {seq!r})")
        table = self._table(engine, partition)
        with self._client_locks.hold((partition, client)):
            if engine in self._doubted:
                if self._doubted_error is not None:
                    raise self._doubted_error(partition, client, seq)
                raise NotPartitionOwner(f"partition {partition} is being opened again after a write whose outcome is "
                                        f"unknown; nothing was written for ({client!r}, {seq}): retry",
                                        partition=partition)
            last = table.get(client)
            if last is not None and seq <= last:
                return False
            marks = [(client, seq, 1)] + ([(client, last, -1)] if last is not None else [])
            try:
                write(_marks(marks))
            except NothingWritten:
                raise
            except BaseException:
                self._doubted.add(engine)
                if self._on_doubt is not None:
                    self._on_doubt(partition, engine)
                raise
            table[client] = seq
            return True
