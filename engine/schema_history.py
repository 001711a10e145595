"""A relation's schema history: every version of its columns, with field ids and defaults.

The history lives in the relation's catalog entry (engine/catalog.py, docs/formats.md
"Schema history"), so an alter is one compare-and-set: the new version and the current
schema change together or not at all. Version 0 is the schema ``add_relation`` was given,
its columns numbered 1, 2, ... in order; each alter adds the next version. Field ids are
never reused (``next_field_id`` only grows), which is what lets a read tell a column
added again under a dropped column's name from the dropped one.

WAL UPDATES records carry the version they were written under, and batches their field
ids and version (trace/evolve.py): the :class:`Layout` made here brings them all to the
current version.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sediment.arrow_codec import schema_from_text, schema_to_text, table_from_text, table_to_text
from sediment.trace.evolve import Layout, field_id, with_id


@dataclass(frozen=True, eq=False)
class SchemaHistory:
    """Every schema version of one relation; the last one is current. ``versions`` holds
    (version, columns with field ids); ``defaults`` maps a field id to the value its rows
    written before the column existed read as."""

    versions: tuple[tuple[int, pa.Schema], ...]
    next_field_id: int
    defaults: dict[int, pa.Scalar] = field(default_factory=dict)

    @staticmethod
    def initial(schema: pa.Schema) -> SchemaHistory:
        """Version 0 of a new relation: its columns get field ids 1..n in order."""
        cols = pa.schema([with_id(f, i + 1) for i, f in enumerate(schema)])
        return SchemaHistory(((0, cols),), len(schema) + 1)

    @property
    def version(self) -> int:
        return self.versions[-1][0]

    @property
    def current(self) -> pa.Schema:
        """The current columns, with their field ids."""
        return self.versions[-1][1]

    def plain(self) -> pa.Schema:
        """The current columns without field ids: the relation's schema as users see it."""
        return pa.schema([pa.field(f.name, f.type) for f in self.current])

    def ids(self) -> dict[str, int]:
        """Current column name -> field id."""
        return {f.name: field_id(f) for f in self.current}

    def with_version(self, columns: pa.Schema, next_field_id: int, defaults: dict[int, pa.Scalar]) -> SchemaHistory:
        """This history with ``columns`` (field ids set) as the next version."""
        return SchemaHistory((*self.versions, (self.version + 1, columns)), next_field_id,
                             {**self.defaults, **defaults})

    def layout(self) -> Layout:
        """The projection of every version's updates onto the current one."""
        tail = [pa.field("time", pa.int64()), pa.field("diff", pa.int64())]
        return Layout({v: pa.schema([*cols, *tail]) for v, cols in self.versions}, self.version, dict(self.defaults))

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "next_field_id": self.next_field_id,
            "versions": [{"version": v, "schema": schema_to_text(cols)} for v, cols in self.versions],
        }
        if self.defaults:
            names = [str(fid) for fid in self.defaults]
            doc["defaults"] = table_to_text(pa.table([pa.array([s.as_py()], s.type) for s in self.defaults.values()],
                                                     names=names))
        return doc

    @staticmethod
    def from_json(doc: dict[str, Any]) -> SchemaHistory:
        versions = tuple((int(v["version"]), schema_from_text(v["schema"])) for v in doc["versions"])
        if not versions or any(field_id(f) is None for _v, cols in versions for f in cols):
            raise ValueError("schema history without versions or with a column lacking a field id")
        defaults: dict[int, pa.Scalar] = {}
        if doc.get("defaults"):
            table = table_from_text(doc["defaults"])
            defaults = {int(name): table.column(name)[0] for name in table.column_names}
        return SchemaHistory(versions, int(doc["next_field_id"]), defaults)


def describe_relation(entry: Any, history: SchemaHistory, sealed: int) -> dict[str, Any]:
    """``Engine.describe``'s answer (entry: the catalog's RelationEntry)."""
    from sediment.engine.schema_text import format_schema

    def shown(value: pa.Scalar | None) -> Any:
        got = None if value is None else value.as_py()
        return got if got is None or isinstance(got, (bool, int, float, str)) else str(got)

    optional = set(history.layout().optional())  # an append may leave these out (trace/evolve.py)
    columns = [{"name": f.name, "type": format_schema(pa.schema([pa.field("c", f.type)]))[2:],
                "field_id": field_id(f), "default": shown(history.defaults.get(field_id(f))),
                "required": f.name not in optional} for f in history.current]
    return {"name": entry.name, "id": entry.id, "schema": format_schema(history.plain()),
            "schema_version": history.version, "columns": columns, "since": entry.since, "sealed": sealed}
