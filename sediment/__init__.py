"""sediment: a write-ahead log plus compacted traces over object storage.

    import sediment
    with sediment.open("./data") as engine:
        engine.add_relation("orders", schema)
        engine.append("orders", updates)      # columns + time + diff; durable on return
        engine.seal("orders", 7)              # close 7: no more updates at times <= 7
        engine.snapshot("orders", as_of=7)    # consolidated rows with their diffs
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from sediment import errors

if TYPE_CHECKING:
    from sediment.client import Client
    from sediment.engine.engine import Engine
    from sediment.engine.locks import Locks
    from sediment.engine.schema_text import parse_schema_spec
    from sediment.engine.transaction import Transaction

__all__ = ["Engine", "Locks", "Transaction", "connect", "errors", "open", "parse_schema_spec"]
__version__ = "0.1.0"

# Names loaded on first use (PEP 562), so that `import sediment` (or importing one pure
# module such as sediment.wal.replication.vote) does not load the engine, pyarrow, trio,
# boto3 or kazoo.
_LAZY = {
    "Engine": "sediment.engine.engine",
    "Locks": "sediment.engine.locks",
    "Transaction": "sediment.engine.transaction",
    "parse_schema_spec": "sediment.engine.schema_text",
}


# Subpackages reachable as attributes after a bare `import sediment` (as when this module
# imported the engine eagerly), each loaded on first use.
_SUBMODULES = frozenset({"blob", "cli", "client", "engine", "metrics", "net", "progress", "server", "spark_jobs",
                         "trace", "wal"})


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"sediment.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sediment' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*__all__, "__version__", *(n for n in globals() if n.startswith("__"))})


def open(data_dir: str | os.PathLike[str], **options: Any) -> Engine:  # noqa: A001 - the API's name
    """Open (creating if needed) the engine on ``data_dir``; use it as a context manager.

    Options: ``wal`` ("file", or "device:<path>" with ``wal_capacity``),
    ``segment_bytes``, ``max_record_bytes``, ``metadata`` (a MetadataStore or a spec
    such as "zk://127.0.0.1:2181/sediment" or "s3://bucket/prefix"), ``blob`` ("file:///path", "memory://",
    "s3://bucket/prefix" with ``s3_endpoint``; default ``<data_dir>/blobs``, refused with
    ``replicas``: every coordinator must reach the batches), ``replicas`` with
    ``cluster_key`` (the replicated log; needs ``metadata``; ``log_partition``: its partition
    number on the storage nodes, default 0, one per engine of a cluster; ``wal_capacity``,
    ``cluster_key`` and ``log_partition`` given for another kind of log are refused), ``compact`` (run the
    background compacter, default True), ``compact_interval`` (seconds between passes
    besides the wake-up on every finished segment, default 5; a segment holding data
    that old is finished, so a sealed update reaches a batch within about twice it;
    None: only on finished segments), ``clock`` (a :class:`sediment.clock.Clock` for the
    compacter's wake-ups and read-plan leases, e.g. ``sediment.clock.ManualClock`` or
    ``trio.testing.MockClock`` in tests), ``merge_factor``, ``memory_bound`` (bytes a merge may hold, default
    256 MiB), ``lock_slots`` (size of the optimistic lock table), ``arrow_memory_pool`` (Arrow's
    allocator for the process: "system" (default), "jemalloc", "mimalloc", or None to leave it;
    ``ARROW_DEFAULT_MEMORY_POOL`` set wins), ``repair`` (cut a
    damaged log instead of refusing to open), ``take_over_blob_prefix`` (make this engine
    the owner of a blob prefix whose owner marker names another engine; only once that
    engine is gone for good: see docs/architecture.md), ``max_wal_backlog`` (bytes of
    updates in the WAL not yet compacted beyond which appends wait for the compacter,
    default 1 GiB, None: unbounded; enforced while the background compacter runs),
    ``wal_backlog_timeout`` (seconds an append waits before WalBacklogFull, default 60) and
    ``major_compaction_quiet`` (seconds a relation with no history left must go without new
    records before the background merges its batches into one, read as stored, provided the
    batches besides the largest hold at least 1/8 of its rows; default 10, None: only
    ``compact()`` does; needs the compacter's timed wakes, i.e. a ``compact_interval``).
    """
    import inspect

    from sediment.engine.engine import Engine

    known = [p for p in inspect.signature(Engine.open).parameters if p not in ("cls", "data_dir")]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise errors.InvalidArgument(f"unknown option(s) {unknown} for sediment.open; known: {', '.join(known)}")
    return Engine.open(data_dir, **options)


def connect(uri: str, token: str | None = None, **options: Any) -> Client:
    """Connect to a ``sediment serve`` coordinator at ``grpc://HOST:PORT``: a client with the
    Engine's methods (``token`` defaults to $SEDIMENT_TOKEN). A cluster of coordinators is
    reached as ``zk://HOST:PORT/NAME`` or through any member's ``grpc://`` address: the
    client then follows each relation's owner (sediment/cluster_client.py). Options: ``timeout``
    (seconds per call), ``tls_root_certs`` (for ``grpc+tls://``) and ``deadline`` (a cluster's:
    seconds a call keeps following redirects); any other is InvalidArgument. Imported on use,
    so ``import sediment`` does not load Arrow Flight."""
    from sediment.client import connect as _connect
    from sediment.net.connect_options import check_connect_options

    check_connect_options(uri, options)
    if isinstance(uri, str) and uri.startswith(("zk://", "s3://")):  # a cluster of coordinators
        from sediment.cluster_client import ClusterClient

        return ClusterClient(uri, token, **options)
    if "deadline" in options:  # a cluster's option: checked here, as the address may be a member's
        from sediment.engine.args import check_number

        check_number(options["deadline"], "deadline (seconds a call may take, retries included)")
    client = _connect(uri, token, **{k: v for k, v in options.items() if k != "deadline"})
    if client.cluster is None:
        return client
    from sediment.cluster_client import ClusterClient  # a cluster member: follow its redirects

    client.close()
    return ClusterClient(uri, token, **options)
