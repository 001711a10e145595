"""The engine's in-memory view of one relation, and the small value types its reads hand out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pyarrow as pa

from sediment.arrow_codec import GROUP_VERSION, decode_updates, updates_body_version
from sediment.engine.catalog import RelationEntry
from sediment.engine.feed import FeedLog
from sediment.engine.read_plan import ReadPlan  # noqa: F401  (re-exported: the reads hand it out)
from sediment.errors import WalCorruption
from sediment.trace.evolve import Layout
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
    schema_version: int = 0  # the relation's schema version the record was written under


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
    data_added_at: float | None = None  # clock time a pass last took its WAL records, or a bulk load committed
    counters: Any = None  # sediment.metrics.RelationCounters: bumped as its appends become durable
    layout: Layout | None = None  # its schema versions, to read updates written under older ones
    shape: tuple[int, pa.Schema] = (0, pa.schema([]))  # (schema version, update schema), replaced as one
    encoders: dict[int, Any] = field(default_factory=dict)  # schema version -> SmallBodyEncoder (engine/writer.py)

    @property
    def schema_version(self) -> int:
        return self.shape[0]

    def decode_body(self, body: object, version: int, to_version: int | None = None) -> pa.RecordBatch:
        """An UPDATES record's body (written under schema ``version``) in the current update
        schema, or that of ``to_version`` (a feed delivering updates made before an alter).
        WalCorruption for a group body of a version this build does not read."""
        try:
            if version == self.schema_version and to_version in (None, version) or self.layout is None:
                return decode_updates(body, self.update_schema)
            schema = self.layout.decode_schema(version)
            if schema is None:
                raise WalCorruption(f"relation {self.entry.name!r}: a WAL record is written under schema version "
                                    f"{version}, which its schema history does not have (current "
                                    f"{self.schema_version}); the log and the catalog disagree: run `sediment verify`")
            return self.layout.project(decode_updates(body, schema), to_version)
        except ValueError:
            check_body_version(self.entry.name, body)
            raise

    def needs_from(self) -> int | None:
        """The least LSN of this relation's records that are not yet in its trace."""
        lsns = [e.lsn for e in self.tail] + [lsn for lsn, _t in self.progress]
        return min(lsns) if lsns else None

    @property
    def keys(self) -> list[str]:
        return self.entry.schema.names

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


def set_shape(rel: Relation, entry: RelationEntry, traces: Any) -> None:
    """Give ``rel`` the catalog entry's schema version: its layout first, then its shape, so
    an append that reads the new shape finds the layout that knows it."""
    layout = entry.schema_history.layout()
    rel.layout = layout
    rel.update_schema = layout.plain
    rel.entry = entry
    rel.shape = (layout.current_version, rel.update_schema)
    traces.set_layout(entry.id, layout)


def check_body_version(relation: str, body: object) -> None:
    """WalCorruption when an UPDATES body that failed to decode is a group body of a version
    this build does not read (a newer build wrote it): said as such, not as pyarrow's error."""
    got = updates_body_version(body)
    if got > GROUP_VERSION:
        raise WalCorruption(f"relation {relation!r}: a WAL record's UPDATES body is of version {got}, which this "
                            f"build does not read (it reads up to {GROUP_VERSION}); open the data directory with the "
                            "build that wrote it") from None
