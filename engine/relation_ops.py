"""The engine's relations: creating, dropping and describing them, and moving their
compaction frontier. A mixin of :class:`sediment.engine.engine.Engine`, kept apart so
that each file holds one concern; the relations themselves are held in one
:class:`sediment.engine.bookkeeping.Relations` (by name and by id)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa

from sediment.engine.args import check_time
from sediment.engine.catalog import RelationEntry
from sediment.engine.feed import SCHEMA, FeedLog
from sediment.engine.relation import _Relation, set_shape
from sediment.engine.schema import check_name, check_schema, update_schema
from sediment.engine.schema_history import describe_relation
from sediment.engine.schema_rules import evolve
from sediment.errors import (
    CoordinatorSuperseded,
    EngineClosed,
    FrontierRegression,
    RelationExists,
    UnknownRelation,
)
from sediment.metadata import names
from sediment.trace.state import TraceState

log = logging.getLogger(__name__)

INTERNAL_PREFIX = "_"


def is_internal(name: str) -> bool:
    """Whether ``name`` is one of sediment's own bookkeeping relations (a name starting with
    an underscore, such as the Spark sink's ``_spark_sink.<id>``): listings meant for users
    leave them out unless asked, so they do not crowd the user's own relations."""
    return name.startswith(INTERNAL_PREFIX)


class RelationOps:
    """Relation management of the Engine (mixin)."""

    def _check_open(self) -> None:
        if self.superseded is not None:  # closing or closed because a newer coordinator took over
            raise CoordinatorSuperseded(str(self.superseded))
        if self._closed:
            raise EngineClosed(f"the engine on {self.data_dir} is closed")

    def _rel(self, name: str) -> _Relation:
        self._check_open()
        check_name(name)
        rel = self._relations.get(name)
        if rel is None:
            raise UnknownRelation(f"no relation named {name!r} in {self.data_dir}; known: "
                                  f"{sorted(self._relations) or 'none'}")
        return rel

    def add_relation(self, name: str, schema: pa.Schema) -> None:
        """Create an empty relation. Its updates will carry ``schema``'s columns plus
        ``time`` and ``diff``. Raises RelationExists, InvalidRelationName, SchemaMismatch."""
        check_name(name)
        schema = check_schema(schema)
        with self._lock:
            self._check_open()
            if name in self._relations:
                raise RelationExists(f"relation {name!r} already exists; drop it first or pick another name")
            self._register(self.catalog.create(name, schema))

    def drop_relation(self, name: str) -> None:
        """Forget a relation and its data. Its WAL records are ignored from now on and
        go away when the log is trimmed."""
        with self._compact_lock, self._lock:
            rel = self._rel(name)
            self.catalog.drop(rel.entry)
            self._relations.remove(rel)
            self.metrics.forget_relation(name)
            self._backlog.remove(sum(e.bytes for e in rel.tail))
            for step in ("pass", "merge"):  # a relation added again under this name starts clean
                self._compaction_failures.pop((name, step), None)
            self._garbage += rel.trace.keys()
            try:
                self._meta.delete(names.trace_key(rel.entry.id))
            except Exception as exc:  # noqa: BLE001 - the start-up sweep removes what is left
                log.warning("could not delete the trace state of dropped relation %r: %s", name, exc)
        self._collect()

    def relations(self, include_internal: bool = False) -> list[str]:
        """Names of the relations, sorted; internal ones (names starting with an underscore,
        see :func:`is_internal`) only with ``include_internal``."""
        with self._lock:
            self._check_open()
            return sorted(n for n in self._relations if include_internal or not is_internal(n))

    def schema(self, name: str) -> pa.Schema:
        """The relation's own columns (without ``time`` and ``diff``)."""
        with self._lock:
            return self._rel(name).entry.schema

    def since(self, name: str) -> int:
        """The compaction frontier: reads at times below it are no longer possible."""
        with self._lock:
            return self._rel(name).entry.since

    def sealed(self, name: str) -> int:
        """The greatest t of a durable ``close t`` (-1 when never sealed)."""
        with self._lock:
            return self._rel(name).sealed_durable

    def _register(self, entry: RelationEntry, trace: TraceState | None = None) -> _Relation:
        trace = trace or TraceState(entry.id)
        rel = _Relation(entry, update_schema(entry.schema), trace, feed=FeedLog(),
                        counters=self.metrics.relation_counters(entry.name))
        rel.sealed = rel.sealed_durable = trace.upper - 1
        set_shape(rel, entry, self.traces)
        self._relations.add(rel)
        return rel

    def alter_relation(self, name: str, *, add: Sequence[pa.Field] = (), defaults: Mapping[str, Any] | None = None,
                       widen: Mapping[str, pa.DataType] | None = None, rename: Mapping[str, str] | None = None,
                       drop: Sequence[str] = ()) -> int:
        """Change the relation's columns without rewriting its history; the new schema
        version (unchanged when nothing changes). See engine/schema_rules.py for what is
        allowed; a refused change raises SchemaChangeRefused naming the column and the rule,
        with nothing changed. All changes or none (one compare-and-set of the catalog entry),
        durable on return, and every append that starts after it uses the new schema."""
        check_name(name)
        with self._merge_lock, self._compact_lock, self._lock:  # no pass or merge is writing old-schema batches
            rel = self._rel(name)
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
        with self._lock:
            rel = self._rel(name)
            history, entry, sealed = rel.entry.schema_history, rel.entry, rel.sealed_durable
        return describe_relation(entry, history, sealed)

    def schema_version(self, name: str) -> int:
        """The relation's current schema version: 0 when created, one more with each alter."""
        with self._lock:
            return self._rel(name).schema_version

    def _referenced_blobs(self) -> set[str]:
        return {k for rel in self._relations.values() for k in rel.trace.keys()}

    def set_since(self, name: str, t: int) -> None:
        """Advance the compaction frontier: history before ``t`` may be consolidated away."""
        t = check_time(t, "since")
        with self._lock:
            rel = self._rel(name)
            if t < rel.entry.since:
                raise FrontierRegression(f"since of {name!r} is {rel.entry.since}; it cannot move back to {t}")
            if t > rel.sealed_durable:
                raise FrontierRegression(f"since {t} for {name!r} would pass its sealed frontier "
                                         f"{rel.sealed_durable}; seal first")
            if t == rel.entry.since:
                return
            rel.entry = self.catalog.update(replace(rel.entry, since=t))
