"""Which allocator Arrow uses in an engine's process.

pyarrow's default pool (mimalloc or jemalloc) keeps freed memory for reuse. A merge
streams many short-lived row groups through, so with the default pool its resident
memory grew to about 1.5x that of the system allocator, past the merge's memory
bound, and was no faster (docs/benchmarks.md, merge). The engine therefore asks for
the system allocator unless the user chose one (ARROW_DEFAULT_MEMORY_POOL) or opts out.
"""

from __future__ import annotations

import os

import pyarrow as pa

from sediment.errors import InvalidArgument

POOLS = {"system": pa.system_memory_pool, "jemalloc": pa.jemalloc_memory_pool, "mimalloc": pa.mimalloc_memory_pool}


def configure_memory_pool(name: str | None) -> None:
    """Make ``name`` (one of :data:`POOLS`) Arrow's default pool; None or an
    ARROW_DEFAULT_MEMORY_POOL in the environment leave it as it is. InvalidArgument for a
    name not in POOLS or a pool this build of pyarrow lacks."""
    if not name or os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return
    if name not in POOLS:
        raise InvalidArgument(f"arrow_memory_pool must be one of {sorted(POOLS)} or None, not {name!r}")
    try:
        pool = POOLS[name]()
    except NotImplementedError:
        raise InvalidArgument(f"arrow_memory_pool={name!r} is not built into this pyarrow; use 'system' or "
                              "None") from None
    pa.set_memory_pool(pool)
