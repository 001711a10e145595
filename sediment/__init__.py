"""sediment: a write-ahead log plus compacted traces over object storage.

    import sediment
    with sediment.open("./data") as engine:
        engine.add_relation("orders", schema)
        engine.append("orders", updates)      # columns + time + diff; durable on return
        engine.seal("orders", 7)              # close 7: no more updates at times <= 7
        engine.snapshot("orders", as_of=7)    # consolidated rows with their diffs
"""

from __future__ import annotations

import os
from typing import Any

from sediment import errors
from sediment.engine.engine import Engine
from sediment.engine.schema import parse_schema_spec
from sediment.engine.transaction import Transaction

__all__ = ["Engine", "Transaction", "errors", "open", "parse_schema_spec"]
__version__ = "0.1.0"


def open(data_dir: str | os.PathLike[str], **options: Any) -> Engine:  # noqa: A001 - the API's name
    """Open (creating if needed) the engine on ``data_dir``; use it as a context manager.

    Options: ``wal`` ("file", or "device:<path>" with ``wal_capacity``),
    ``segment_bytes``, ``max_record_bytes``, ``metadata`` (a MetadataStore or a spec
    such as "zk://127.0.0.1:2181/sediment"), ``repair`` (cut a damaged log instead
    of refusing to open).
    """
    return Engine(data_dir, **options)
