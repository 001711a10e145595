"""Columns by field id: bringing updates written under an older schema version to the current one.

A relation's columns each carry a field id that is never reused (``PARQUET:field_id`` in
the Arrow field's metadata, which Parquet stores as the column's ``field_id``). Updates
are stored as they were written; a read projects them by field id: a column the current
schema has and the stored updates lack reads as its default (null unless one was given),
a renamed column keeps its data (same id), a widened one is cast, and a stored column
whose id the current schema no longer has is left out, so a column dropped and later
added again under the same name (a new id) never shows the dropped data.

This module is pure (no I/O): the engine builds a :class:`Layout` from the relation's
schema history (engine/schema_history.py) and hands it to the trace store and its own
WAL decoding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

FIELD_ID = b"PARQUET:field_id"
VERSION_KEY = b"sediment.schema_version"
RESERVED = ("time", "diff")
KEEP_DEFAULT_ROWS = 1 << 20  # the longest default column a layout keeps for reuse


def field_id(f: pa.Field) -> int | None:
    """The field id recorded on ``f``, or None when it has none."""
    meta = f.metadata
    if not meta or FIELD_ID not in meta:
        return None
    return int(meta[FIELD_ID])


def with_id(f: pa.Field, fid: int) -> pa.Field:
    """``f`` carrying field id ``fid``."""
    return f.with_metadata({FIELD_ID: str(fid).encode()})


@dataclass(frozen=True, eq=False)
class Layout:
    """How to read a relation's stored updates: ``versions`` maps each schema version to its
    update schema (columns with field ids, then ``time`` and ``diff``); the last version is
    current. ``defaults`` gives added columns their value in rows written before them, by
    field id."""

    versions: Mapping[int, pa.Schema]
    current_version: int
    defaults: Mapping[int, Any] = field(default_factory=dict)
    # per stored schema and target version: where each target column comes from (planned once,
    # not per batch); per (field id, type): one default array, sliced for each batch
    _plans: dict[Any, list[int | None]] = field(default_factory=dict, repr=False)
    _filled: dict[Any, pa.Array] = field(default_factory=dict, repr=False)

    @property
    def stored(self) -> pa.Schema:
        """The current update schema with field ids and the version stamp: what new batches are written with."""
        return self.versions[self.current_version].with_metadata({VERSION_KEY: str(self.current_version).encode()})

    @property
    def plain(self) -> pa.Schema:
        """The current update schema without metadata: what reads hand out."""
        return self._plain_of(self.current_version)

    def ids(self) -> list[int | None]:
        return [field_id(f) for f in self.versions[self.current_version]]

    def decode_schema(self, version: int) -> pa.Schema | None:
        """The update schema of ``version`` (a WAL record's), or None when it is unknown."""
        return self.versions.get(version)

    def project(self, data: pa.Table | pa.RecordBatch, to_version: int | None = None) -> pa.Table | pa.RecordBatch:
        """``data`` (updates stored under any version of this layout) in the current update
        schema (or that of ``to_version``). Columns are found by field id; a column without
        an id (a batch written before field ids existed) by its name in version 0."""
        version = self.current_version if to_version is None else to_version
        target = self.versions[version]
        plan = self._plan(data.schema, version)
        columns = []
        for f, at in zip(target, plan, strict=True):
            if at is None:
                key = f.name if f.name in RESERVED else field_id(f)
                columns.append(self._default(key, f.type, data.num_rows, isinstance(data, pa.Table)))
                continue
            col = data.column(at)
            if col.type != f.type:
                col = col.cast(f.type)  # a widening: Arrow's cast kernel, never a narrowing
            columns.append(col)
        build = pa.Table.from_arrays if isinstance(data, pa.Table) else pa.RecordBatch.from_arrays
        return build(columns, schema=self._plain_of(version))

    def _plan(self, schema: pa.Schema, version: int) -> list[int | None]:
        """For each column of ``version``: the index of the stored column with its id, or None."""
        key = (version, tuple(schema.names), tuple(field_id(f) for f in schema))
        plan = self._plans.get(key)
        if plan is None:
            source = {k: i for i, k in enumerate(self._keys(schema)) if k is not None}
            target = self.versions[version]
            plan = self._plans[key] = [source.get(k) for k in self._keys(target)]
        return plan

    def _plain_of(self, version: int) -> pa.Schema:
        got = self._filled.get(("plain", version))
        if got is None:
            got = self._filled[("plain", version)] = _plain(self.versions[version])
        return got

    def _default(self, fid: Any, typ: pa.DataType, rows: int, chunked: bool) -> pa.Array | pa.ChunkedArray:
        held = self._filled.get((fid, typ))
        if held is None or len(held) < rows:
            if rows > KEEP_DEFAULT_ROWS:  # a large batch gets its own: the cache stays small
                return self._filled_now(fid, typ, rows, chunked)
            held = self._filled[(fid, typ)] = self._filled_now(fid, typ, max(rows, 1 << 16), False)
        arr = held.slice(0, rows)
        return pa.chunked_array([arr], typ) if chunked else arr

    def _filled_now(self, fid: Any, typ: pa.DataType, rows: int, chunked: bool) -> pa.Array | pa.ChunkedArray:
        value = self.defaults.get(fid)
        if value is None:
            arr = pa.nulls(rows, typ)
        else:
            scalar = value if isinstance(value, pa.Scalar) else pa.scalar(value)
            arr = pa.repeat(scalar.cast(typ), rows) if rows else pa.array([], typ)
        return pa.chunked_array([arr], typ) if chunked else arr

    def optional(self, version: int | None = None) -> list[str]:
        """The columns an append may leave out: those an alter added (not in version 0), which
        it fills with their default (null unless one was given). Version 0's are required."""
        target = self.versions[self.current_version if version is None else version]
        first = {field_id(f) for f in self.versions[min(self.versions)]}
        return [f.name for f in target if f.name not in RESERVED and field_id(f) not in first]

    def fill(self, updates: pa.Table, missing: list[str], version: int | None = None) -> pa.Table:
        """``updates`` with those of the ``missing`` columns that may be left out (:meth:`optional`)
        appended as their default; the others stay missing."""
        target = self.versions[self.current_version if version is None else version]
        optional = set(self.optional(version))
        for f in target:
            if f.name in missing and f.name in optional:
                updates = updates.append_column(f.name, self._default(field_id(f), f.type, updates.num_rows, True))
        return updates

    def _keys(self, schema: pa.Schema) -> list[Any]:
        """Each column's identity: ``time``/``diff`` by name, others by field id (by the name
        in version 0 for a column stored without one)."""
        legacy = {f.name: field_id(f) for f in self.versions[min(self.versions)]}
        keys: list[Any] = []
        for f in schema:
            if f.name in RESERVED:
                keys.append(f.name)
            else:
                fid = field_id(f)
                keys.append(fid if fid is not None else legacy.get(f.name))
        return keys

    def stored_names(self, schema: pa.Schema) -> dict[str, str]:
        """Current column name -> the name of the stored column of ``schema`` with its field
        id (``time``/``diff`` by name), for the columns the stored data has."""
        by_key = dict(zip(self._keys(schema), schema.names, strict=True))
        target = self.versions[self.current_version]
        return {f.name: by_key[k] for f, k in zip(target, self._keys(target), strict=True) if k in by_key}

    def keeps_order(self, schema: pa.Schema) -> bool:
        """Whether projecting data of ``schema`` keeps it sorted and consolidated: only when no
        stored column is dropped (added columns go last and hold one value per old row;
        renames and widenings keep each value's place)."""
        current = set(self._keys(self.versions[self.current_version]))
        return all(key in current for key in self._keys(schema))

    def is_current(self, schema: pa.Schema) -> bool:
        """Whether data of ``schema`` already has the current columns (by id, name and type)."""
        target = self.versions[self.current_version]
        return (schema.names == target.names and schema.types == target.types
                and self._keys(schema) == self._keys(target))


def _plain(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, f.type, nullable=f.nullable) for f in schema])
