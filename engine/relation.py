"""The engine's in-memory view of one relation, and the small value types its reads hand out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pyarrow as pa

from sediment.engine import args
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
class _Relation:
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


_check_time = args.check_time
