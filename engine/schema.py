"""Relation schemas: which column types a relation may have, and checking appended updates.

A relation's stored updates are its own columns plus ``time`` and ``diff`` (both
int64). Those two names are reserved. Column types must be ones that the engine can
sort, group, store in Parquet and read back as the same type, since consolidation
and compaction do all of that: integers, float32/float64, booleans, strings, binary
(also fixed-size), dates, times, timestamps (with or without a time zone),
durations and decimals; their text form (``--schema``) is in engine/schema_text.py.
Refused (tests/engine/test_column_types.py tries each end to end): float16 (Arrow cannot
sort it), nested types (list, struct, map: no comparison kernels), dictionary and null
columns.
"""

from __future__ import annotations

import re
import zoneinfo
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sediment.errors import InvalidRelationName, InvalidUpdates, SchemaMismatch

RESERVED = ("time", "diff")
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,127}")

def check_name(name: object) -> str:
    """The relation name, if valid: ``[A-Za-z_][A-Za-z0-9_.-]{0,127}``, never a path."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise InvalidRelationName(
            f"invalid relation name {name!r}: use 1-128 characters from [A-Za-z0-9_.-], starting with a "
            "letter or underscore"
        )
    return name


def _supported(t: pa.DataType) -> bool:
    return (
        pa.types.is_integer(t) or pa.types.is_float32(t) or pa.types.is_float64(t) or pa.types.is_boolean(t)
        or pa.types.is_string(t) or pa.types.is_large_string(t)
        or pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
        or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_timestamp(t)
        or pa.types.is_duration(t) or pa.types.is_decimal(t)
    )


_OFFSET = re.compile(r"[+-]\d\d:\d\d")


def known_zone(tz: str) -> bool:
    """Whether ``tz`` is a time zone reads can convert with: UTC, an offset such as +05:30,
    or an IANA name (a timestamp column with another zone is stored but cannot be read)."""
    if tz == "UTC" or _OFFSET.fullmatch(tz):
        return True
    try:
        zoneinfo.ZoneInfo(tz)
    except (ValueError, zoneinfo.ZoneInfoNotFoundError):
        return False
    return True


def check_schema(schema: object) -> pa.Schema:
    """A relation schema, checked: at least one column, unique names, no reserved names,
    sortable types. Metadata on the schema is dropped."""
    if not isinstance(schema, pa.Schema):
        raise SchemaMismatch(f"a relation schema must be a pyarrow.Schema, not {type(schema).__name__}")
    if len(schema) == 0:
        raise SchemaMismatch("a relation needs at least one column")
    names = schema.names
    if len(set(names)) != len(names):
        raise SchemaMismatch(f"duplicate column names in schema: {names}")
    for field in schema:
        if field.name in RESERVED:
            raise SchemaMismatch(
                f"column {field.name!r} is reserved: every relation's updates carry `time` and `diff` "
                "themselves; rename the column"
            )
        if not field.name:
            raise SchemaMismatch("column names must not be empty")
        if pa.types.is_timestamp(field.type) and field.type.tz is not None and not known_zone(field.type.tz):
            raise SchemaMismatch(f"column {field.name!r} has type {field.type}: unknown time zone {field.type.tz!r}; "
                                 "use an IANA name such as UTC or Europe/Paris, or an offset such as +05:30")
        if not _supported(field.type):
            raise SchemaMismatch(
                f"column {field.name!r} has type {field.type}, which the engine cannot sort, group and store; use "
                "integers, float32/float64, booleans, strings, binary, dates, times, timestamps, durations or "
                "decimals"
            )
    return pa.schema([pa.field(f.name, f.type, nullable=True) for f in schema])


def _family(t: pa.DataType) -> str:
    for name, test in (("int", pa.types.is_integer), ("float", pa.types.is_floating),
                       ("str", lambda x: pa.types.is_string(x) or pa.types.is_large_string(x)),
                       ("bin", lambda x: pa.types.is_binary(x) or pa.types.is_large_binary(x)),
                       ("bool", pa.types.is_boolean), ("date", pa.types.is_date),
                       ("ts", pa.types.is_timestamp), ("dec", pa.types.is_decimal), ("null", pa.types.is_null)):
        if test(t):
            return name
    return str(t)


def _may_cast(src: pa.DataType, dst: pa.DataType) -> bool:
    """Only conversions that keep the meaning: within a family (or ints into floats), never
    strings parsed into numbers."""
    a, b = _family(src), _family(dst)
    return a == b or a == "null" or (a == "int" and b == "float")


def update_schema(schema: pa.Schema) -> pa.Schema:
    """The schema of a relation's stored updates: its columns, then ``time`` and ``diff``."""
    return pa.schema(list(schema) + [pa.field("time", pa.int64()), pa.field("diff", pa.int64())])


def conform_updates(relation: str, schema: pa.Schema | None, updates: object, target: pa.Schema | None = None,
                    *, layout: Any = None, version: int | None = None) -> tuple[pa.Table, tuple[int, int] | None]:
    """``updates`` as a table of exactly the relation's update schema, with its (least,
    greatest) time (None when empty), or a typed error.

    Columns are matched by name (order does not matter). With a ``layout``
    (trace/evolve.py), columns that an alter added may be left out and read as their
    default. Types that differ are cast
    only when the cast is safe (no overflow, no truncation), so an int32 column may
    feed an int64 one but a string column never feeds an int64 one.
    """
    if isinstance(updates, pa.RecordBatch):
        updates = pa.Table.from_batches([updates])
    if not isinstance(updates, pa.Table):
        raise InvalidUpdates(f"updates for {relation!r} must be a pyarrow.Table, not {type(updates).__name__}")
    target = target if target is not None else update_schema(schema)
    if updates.schema.equals(target):  # the common case: nothing to convert
        return updates, _check_time_and_diff(relation, updates)
    have = set(updates.column_names)
    if len(have) != updates.num_columns:
        raise SchemaMismatch(f"updates for {relation!r} have duplicate columns: {updates.column_names}")
    missing = [n for n in target.names if n not in have]
    if layout is not None and missing:  # columns added by an alter may be left out: they get their default
        updates = layout.fill(updates, missing, version)
        missing = [n for n in target.names if n not in updates.column_names]
    extra = [n for n in updates.column_names if n not in target.names]
    if "time" in missing or "diff" in missing:
        raise InvalidUpdates(
            f"updates for {relation!r} lack {' and '.join(n for n in RESERVED if n in missing)}: every update "
            "carries an int64 `time` (>= 0) and an int64 `diff`"
        )
    if missing or extra:
        wrong = "; ".join(f"{what} {names}" for what, names in (("missing", missing), ("unexpected", extra)) if names)
        raise SchemaMismatch(
            f"updates for {relation!r} do not match its schema: {wrong}; expected columns {target.names}"
        )
    columns = []
    for field in target:
        col = updates.column(field.name)
        if col.type != field.type:
            if not _may_cast(col.type, field.type):
                kind = InvalidUpdates if field.name in RESERVED else SchemaMismatch
                raise kind(f"column {field.name!r} of updates for {relation!r} has type {col.type}; the relation "
                           f"needs {field.type}")
            try:
                col = pc.cast(col, field.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                kind = InvalidUpdates if field.name in RESERVED else SchemaMismatch
                raise kind(
                    f"column {field.name!r} of updates for {relation!r} has type {updates.column(field.name).type}, "
                    f"which does not convert safely to {field.type}: {exc}"
                ) from None
        columns.append(col)
    table = pa.Table.from_arrays(columns, schema=target.remove_metadata()) if updates.num_rows else target.empty_table()
    return table, _check_time_and_diff(relation, table)


def time_range(table: pa.Table) -> tuple[int, int] | None:
    """(least, greatest) time of the updates, or None when there are none."""
    n = table.num_rows
    if not n:
        return None
    return _bounds(table.column("time"), n)


def _bounds(time: pa.ChunkedArray, n: int) -> tuple[int, int]:
    if n <= 16:  # a few rows: Python ints are cheaper than a kernel call
        values = time.chunk(0).to_pylist() if time.num_chunks == 1 else time.to_pylist()
        return min(values), max(values)
    lo, hi = pc.min_max(time).values()
    return lo.as_py(), hi.as_py()


def small_bounds(table: pa.Table) -> tuple[int, int] | None:
    """(least, greatest) time of a table of 1-16 rows already in an update schema, or None
    when its time or diff has a null, its time column more than one chunk, or a time is
    negative: the lone-append path's check (engine/writer.py), which sends anything else
    through :func:`conform_updates` for its error."""
    k = table.num_columns
    time = table.column(k - 2)
    if time.null_count or time.num_chunks != 1 or table.column(k - 1).null_count:
        return None
    values = time.chunk(0).to_pylist()
    lo = min(values)
    return None if lo < 0 else (lo, max(values))


def _check_time_and_diff(relation: str, table: pa.Table) -> tuple[int, int] | None:
    """Refuse nulls in ``time`` or ``diff`` and negative times; the time bounds. ``table``
    is in an update schema, so they are its last two columns (looked up by position: this
    runs for every append)."""
    k = table.num_columns
    time = table.column(k - 2)
    if time.null_count or table.column(k - 1).null_count:
        name = "time" if time.null_count else "diff"
        raise InvalidUpdates(f"column {name!r} of updates for {relation!r} contains nulls")
    n = table.num_rows
    if not n:
        return None
    bounds = _bounds(time, n)
    if bounds[0] < 0:
        raise InvalidUpdates(f"updates for {relation!r} have a negative time; times are >= 0")
    return bounds
