"""The server's half of keyed (idempotent) writes: a cluster client's appends, ``append_many``
calls and transaction commits that carry an idempotency key (client id, sequence number).

The key goes to the cluster member's engine (cluster/router.py), which records it in the
partition's log with the write and answers a repeat of an applied key with success, so a
client may resend a write whose answer it lost, here or at a later owner of the partition.
A server of one engine (no cluster) has no such bookkeeping and refuses a key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from sediment.errors import InvalidArgument
from sediment.net.protocol import field


def _key(args: dict[str, Any], what: str) -> tuple[Any, Any]:
    return field(args, "client", what), field(args, "seq", what)


def _member(engine: Any, what: str) -> Any:
    if not hasattr(engine, "append_once"):
        raise InvalidArgument(f"{what} with an idempotency key (client, seq) is for a cluster member (sediment serve "
                              "--cluster); this server runs one engine: send it without a key; nothing was written")
    return engine


def _unlocked(args: dict[str, Any], what: str) -> None:
    if args.get("txn") is not None or args.get("locks") is not None:
        raise InvalidArgument(f"{what} with an idempotency key goes outside transactions and without locks (a lock "
                              "check is not idempotent); nothing was written")


def append_once(engine: Any, name: str, table: pa.Table, meta: dict[str, Any]) -> None:
    """One keyed append of the append stream (``meta``: its metadata)."""
    _unlocked(meta, "an append")
    _member(engine, "an append").append_once(name, table, *_key(meta, "append stream metadata"))


def append_many_once(engine: Any, tables: dict[str, pa.Table], args: dict[str, Any]) -> None:
    """A keyed ``append_many`` of the staged ``tables``."""
    _unlocked(args, "append_many")
    _member(engine, "append_many").append_many_once(tables, *_key(args, "append_many"))


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
    return "committed"
