"""The server's half of keyed (idempotent) writes: a cluster client's appends (with or without
locks), ``append_many`` calls, transaction commits and ``commit_all`` calls that carry an
idempotency key (client id, sequence number), and alters that name the schema version they
start from.

The key goes to the cluster member's engine (cluster/router.py), which records it in the
partition's log with the write and answers a repeat of an applied key with success, so a
client may resend a write whose answer it lost, here or at a later owner of the partition.
A server of one engine (no cluster) keeps the same table itself for keyed appends and
``append_many`` (:func:`engine_keys`): the key goes into the engine's log with the write, so
a resend to this server, to a reopened engine or to a coordinator that took the deployment
over (an S3-only or replicated one) is applied once. Keyed commits and alters stay a
cluster member's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from sediment.cluster.applied import AppliedOnce
from sediment.errors import EngineFailed, InvalidArgument
from sediment.net.protocol import decode_locks, field
from sediment.txn_state import COMMITTED


def _key(args: dict[str, Any], what: str) -> tuple[Any, Any]:
    return field(args, "client", what), field(args, "seq", what)


def _member(engine: Any, what: str) -> Any:
    if not hasattr(engine, "append_once"):
        raise InvalidArgument(f"{what} with an idempotency key (client, seq) is for a cluster member (sediment serve "
                              "--cluster); this server runs one engine, which takes keys on appends and append_many "
                              "only: send it without a key; nothing was written")
    return engine


def _outside_transactions(args: dict[str, Any], what: str) -> dict[str, Any]:
    """The keyword arguments for the member: its ``locks``, when the write carries them (the
    key is checked first, so a retry of a locked write that landed is not checked again)."""
    if args.get("txn") is not None:
        raise InvalidArgument(f"{what} with an idempotency key goes outside transactions (a transaction's commit "
                              "carries the key); nothing was written")
    locks = args.get("locks")
    return {} if locks is None else {"locks": decode_locks(locks)}


def _failed(_partition: int, client: str, seq: int) -> Exception:
    return EngineFailed(f"a keyed write on this engine failed with its outcome unknown, so its log may hold a key "
                        f"its table of applied keys lacks; nothing was written for ({client!r}, {seq}): the engine "
                        "must be opened again (sediment serve does so itself), then retry")


def engine_keys() -> AppliedOnce:
    """The applied keys of a server of one engine: one table (partition 0), loaded from the
    engine's log at its first keyed write and again for a reopened engine. A keyed write whose
    outcome is unknown fails the engine (engine/view.py ``fail``), which is then opened again."""
    return AppliedOnce(doubted=_failed)


def append_once(engine: Any, name: str, table: pa.Table, meta: dict[str, Any], keys: AppliedOnce) -> None:
    """One keyed append of the append stream (``meta``: its metadata); ``keys``: the server's
    :func:`engine_keys`, for an engine that is not a cluster member."""
    extra = _outside_transactions(meta, "an append")
    client, seq = _key(meta, "append stream metadata")
    if hasattr(engine, "append_once"):
        engine.append_once(name, table, client, seq, **extra)
    else:
        keys.append_many(engine, 0, {name: table}, client, seq, extra.get("locks"))


def append_many_once(engine: Any, tables: dict[str, pa.Table], args: dict[str, Any], keys: AppliedOnce) -> None:
    """A keyed ``append_many`` of the staged ``tables`` (``keys`` as in :func:`append_once`)."""
    extra = _outside_transactions(args, "append_many")
    client, seq = _key(args, "append_many")
    if hasattr(engine, "append_many_once"):
        engine.append_many_once(tables, client, seq, **extra)
    elif tables:
        keys.append_many(engine, 0, tables, client, seq, extra.get("locks"))


def commit_once(engine: Any, args: dict[str, Any], txn: Callable[[], Any],
                end: Callable[[Any, Callable[[], None]], str]) -> str:
    """A keyed commit: ``txn()`` finds the open transaction (TransactionError when this server
    does not hold it), ``end(tx, how)`` commits it as an unkeyed commit does; a key already
    applied answers ``committed`` without looking for the transaction."""
    name = field(args, "relation", "commit")

    def commit(partition: int, marks: pa.Table) -> None:
        tx = txn()
        end(tx, lambda: tx.commit_marked(partition, marks))

    _member(engine, "commit").commit_once(name, *_key(args, "commit"), commit)
    return COMMITTED


def commit_all_once(engine: Any, args: dict[str, Any], txns: Callable[[], list[Any]],
                    settle: Callable[[list[Any]], None]) -> list[str]:
    """A keyed ``commit_all``: ``txns()`` finds the open transactions (TransactionError, each
    aborted, when one is not held here), ``settle(txns)`` forgets them once done; the key's
    marks go into the first one. A key already applied answers ``committed`` for each without
    looking for them (at a later owner they are gone)."""
    name = field(args, "relation", "commit_all")
    count = len(field(args, "txns", "commit_all"))

    def commit(partition: int, marks: pa.Table) -> None:
        found = txns()
        try:
            engine.commit_all_marked(found, partition, marks)
        finally:
            settle(found)

    _member(engine, "commit_all").commit_once(name, *_key(args, "commit_all"), commit)
    return [COMMITTED] * count


def alter_from(engine: Any, name: str, base: Any, changes: dict[str, Any]) -> int:
    """An alter that starts from schema version ``base`` (cluster/alter_once.py): applied when
    the relation is at ``base``, answered with ``base + 1`` when that version is this change."""
    if isinstance(base, bool) or not isinstance(base, int) or base < 0:
        raise InvalidArgument(f"alter_relation: base must be a schema version (an int >= 0), not {base!r}; "
                              "nothing was changed")
    return _member(engine, "an alter from a schema version").alter_relation(name, base=base, **changes)
