"""The engine's in-memory view of one relation, and the small value types its reads hand out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pyarrow as pa

from sediment.engine.catalog import RelationEntry
from sediment.engine.feed import FeedLog
from sediment.engine.read_plan import ReadPlan  # noqa: F401  (re-exported: the reads hand it out)
from sediment.trace.state import TraceState


class TailEntry(NamedTuple):
    """A durable, committed UPDATES record still in the WAL (not yet in a batch). A named
    tuple, not a frozen dataclass: an open builds one per record of the log (0.2 us against
    0.55 us), and recovery builds them in bulk straight from the header's fields."""

    lsn: int
    t_lo: int
    t_hi: int
    rows: int
    bytes: int = 0  # the record's body: what compaction still has to read back


@dataclass
class Relation:
    """One relation as the engine holds it in memory: its catalog entry, its trace, its
    frontiers and the WAL records not yet compacted (its tail). Guarded by the engine lock."""

    entry: RelationEntry
    update_schema: pa.Schema
    trace: TraceState
    sealed: int = -1  # admitted seals: appends at times <= this are refused
    sealed_durable: int = -1  # durable seals: reads may ask for as_of <= this
    tail: list[TailEntry] = field(default_factory=list)
    progress: list[tuple[int, int]] = field(default_factory=list)  # (lsn, t) of close records not in the trace
    seal_ticket: Any = None
    feed: FeedLog | None = None
    trace_changed_at: float | None = None  # monotonic time this process last changed the trace
    data_added_at: float | None = None  # clock time a pass last took this relation's WAL records
    counters: Any = None  # sediment.metrics.RelationCounters: bumped as its appends become durable

    def needs_from(self) -> int | None:
        """The least LSN of this relation's records that are not yet in its trace."""
        lsns = [e.lsn for e in self.tail] + [lsn for lsn, _t in self.progress]
        return min(lsns) if lsns else None

    @property
    def keys(self) -> list[str]:
        return self.entry.schema.names

    def decode(self, body: bytes) -> pa.RecordBatch:
        """An UPDATES record's body (an Arrow IPC record batch) in this relation's update schema."""
        return pa.ipc.read_record_batch(pa.py_buffer(body), self.update_schema)

    def conform(self, table: pa.Table) -> pa.Table:
        """A stored batch in the update schema (Parquet returns some types in another unit);
        a no-op, without a cast, when it already is."""
        if table.schema.names == self.update_schema.names and table.schema.types == self.update_schema.types:
            return table
        return table.select(self.update_schema.names).cast(self.update_schema)


INTERNAL_PREFIX = "_"


def is_internal(name: str) -> bool:
    """Whether ``name`` is one of sediment's own bookkeeping relations (a name starting with
    an underscore, such as the Spark sink's ``_spark_sink.<id>``): listings meant for users
    leave them out unless asked, so they do not crowd the user's own relations."""
    return name.startswith(INTERNAL_PREFIX)
