"""Creating, describing and dropping relations, and moving their compaction frontier.

Why its own component: these change the catalog (metadata I/O) and the relation view
together, so that a relation the catalog holds is one the view holds, with its trace's
schema registered and its counters in the metrics.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from sediment.engine import staged
from sediment.engine.args import check_bool, check_time
from sediment.engine.catalog import Catalog, RelationEntry
from sediment.engine.feed import SCHEMA, FeedLog
from sediment.engine.relation import Relation, is_internal, set_shape
from sediment.engine.schema import check_name, check_schema, update_schema
from sediment.engine.schema_history import describe_relation
from sediment.engine.schema_rules import evolve
from sediment.engine.view import RelationView
from sediment.errors import FrontierRegression, InvalidArgument, RelationExists
from sediment.metadata import names
from sediment.metadata.protocol import MetadataStore
from sediment.metrics import EngineMetrics
from sediment.trace.state import TraceState
from sediment.trace.store import TraceStore

log = logging.getLogger(__name__)


@dataclass
class RelationRegistry:
    """The relations of ``view`` as ``catalog`` records them (``meta`` holds their traces' states)."""

    view: RelationView
    catalog: Catalog
    traces: TraceStore
    meta: MetadataStore
    metrics: EngineMetrics

    def register(self, entry: RelationEntry, trace: TraceState | None = None) -> Relation:
        """Put a catalog entry (with its stored trace) into the view."""
        trace = trace or TraceState(entry.id)
        rel = Relation(entry, update_schema(entry.schema), trace, feed=FeedLog(),
                       counters=self.metrics.relation_counters(entry.name))
        rel.sealed = rel.sealed_durable = trace.upper - 1
        set_shape(rel, entry, self.traces)
        self.view.relations.add(rel)
        return rel

    def referenced_blobs(self) -> set[str]:
        return {k for rel in self.view.relations.values() for k in rel.trace.keys()}

    def add_relation(self, name: str, schema: pa.Schema, partition: int | None = None) -> None:
        """Create an empty relation. Its updates will carry ``schema``'s columns plus
        ``time`` and ``diff``. Raises RelationExists, InvalidRelationName, SchemaMismatch.
        ``partition`` is a cluster's (cluster/router.py): taken here only to refuse it in one
        typed line, the same in process and through a server, rather than as a TypeError."""
        if partition is not None:
            raise InvalidArgument(f"add_relation({name!r}, partition={partition!r}): partitions belong to a cluster "
                                  f"of coordinators (sediment.connect('zk://...')); {self.view.where} is a single "
                                  f"engine: leave partition out")
        check_name(name)
        schema = check_schema(schema)
        with self.view.lock:
            self.view.check_open()
            if name in self.view.relations:
                raise RelationExists(f"relation {name!r} already exists; drop it first or pick another name")
            made: list[TraceState] = []  # its trace state first, then the entry (Catalog.create)
            entry = self.catalog.create(name, schema, lambda rid: made.append(self.traces.create(rid)))
            self.register(entry, made[0])

    def alter(self, name: str, *, add: Sequence[pa.Field] = (), defaults: Mapping[str, Any] | None = None,
              widen: Mapping[str, pa.DataType] | None = None, rename: Mapping[str, str] | None = None,
              drop: Sequence[str] = ()) -> int:
        """Under the lock, with no compaction pass or merge running (Engine.alter_relation):
        one compare-and-set of the catalog entry, then the relation's new shape and a schema
        event in its feed. The new schema version (unchanged when nothing changes)."""
        rel = self.view.get(name)
        history = evolve(name, rel.entry.schema_history, add=add, defaults=defaults, widen=widen,
                         rename=rename, drop=drop)
        if history is None:
            return rel.schema_version
        entry = self.catalog.update(replace(rel.entry, schema=history.plain(), history=history))
        set_shape(rel, entry, self.traces)
        rel.feed.add(SCHEMA, rel.trace.wal_through, history.version)
        return history.version

    def describe(self, name: str) -> dict[str, Any]:
        """The relation as JSON-ready values: its schema (``--schema`` text), schema version, each
        column's type, field id and default (null: none), and its frontiers."""
        with self.view.lock:
            rel = self.view.get(name)
            history, entry, sealed = rel.entry.schema_history, rel.entry, rel.sealed_durable
        return describe_relation(entry, history, sealed)

    def schema_version(self, name: str) -> int:
        """The relation's current schema version: 0 when created, one more with each alter."""
        with self.view.lock:
            return self.view.get(name).schema_version

    def drop(self, name: str, forget: Callable[[str, int], None]) -> Iterable[str]:
        """Forget a relation (under the lock, with no compaction pass running): its blobs,
        to be collected. ``forget(name, id)`` clears what other components keep by its name or id."""
        rel = self.view.get(name)
        self.catalog.drop(rel.entry)
        self.view.relations.remove(rel)
        rel.feed.close(dropped_as=name)
        self.metrics.forget_relation(name)
        self.view.backlog.remove(sum(e.bytes for e in rel.tail))
        forget(name, rel.entry.id)
        staged.drop_staging(self.traces.blobs, rel.entry.id)
        try:
            self.meta.delete(names.trace_key(rel.entry.id))
        except Exception as exc:  # noqa: BLE001 - the start-up sweep removes what is left
            log.warning("could not delete the trace state of dropped relation %r: %s", name, exc)
        self.traces.forget(rel.entry.id)
        return rel.trace.keys()

    def relations(self, include_internal: bool = False) -> list[str]:
        """Names of the relations, sorted; internal ones (names starting with an underscore,
        see :func:`sediment.engine.relation.is_internal`) only with ``include_internal``."""
        check_bool(include_internal, "include_internal")
        with self.view.lock:
            self.view.check_open()
            return sorted(n for n in self.view.relations if include_internal or not is_internal(n))

    def schema(self, name: str) -> pa.Schema:
        """The relation's own columns (without ``time`` and ``diff``)."""
        with self.view.lock:
            return self.view.get(name).entry.schema

    def since(self, name: str) -> int:
        """The compaction frontier: reads at times below it are no longer possible."""
        with self.view.lock:
            return self.view.get(name).entry.since

    def sealed(self, name: str) -> int:
        """The greatest t of a durable ``close t`` (-1 when never sealed)."""
        with self.view.lock:
            return self.view.get(name).sealed_durable

    def set_since(self, name: str, t: int) -> None:
        """Advance the compaction frontier: history before ``t`` may be consolidated away."""
        t = check_time(t, "since")
        with self.view.lock:
            rel = self.view.get(name)
            if t < rel.entry.since:
                raise FrontierRegression(f"since of {name!r} is {rel.entry.since}; it cannot move back to {t}")
            if t > rel.sealed_durable:
                raise FrontierRegression(f"since {t} for {name!r} would pass its sealed frontier "
                                         f"{rel.sealed_durable}; seal first")
            if t == rel.entry.since:
                return
            rel.entry = self.catalog.update(replace(rel.entry, since=t))
