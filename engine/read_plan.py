"""The read plan a distributed reader gets: a plain value, with nothing of the engine in it,
so the network client can build one without importing the engine."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa


@dataclass
class ReadPlan:
    """What a distributed reader (Spark) needs to read a relation as of a time without the
    engine in the data path: the batches to fetch straight from the blob store, plus the
    WAL tail rows. The batches stay in the store until :meth:`Engine.release_read` (or the
    lease expires)."""

    lease: int
    relation: str
    relation_id: int
    update_schema: pa.Schema
    key_columns: list[str]
    since: int
    sealed: int
    as_of: int
    blob_uri: str
    s3_endpoint: str | None
    batches: list[dict]  # BatchRef fields, for sediment.trace.store.TraceStore.read_stream
    tail: pa.Table  # WAL updates not yet in batches, times <= as_of (and > from_t when given)
    schema_history: dict | None = None  # SchemaHistory.to_json() of an altered relation: batches by field id
