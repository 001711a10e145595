"""Filters Spark pushes into the ``sediment`` reader, as plain picklable tuples, and what they
mean for a row group: whether its statistics rule it out, and which of its rows match.

A filter is ``(op, column, value)`` with ``op`` one of ``= < <= > >= in isnull notnull``.
Only filters on the relation's own columns are taken: a row's identity is all of its
columns, so filtering rows before consolidating gives what consolidating then filtering
gives. Filters on ``diff`` (a sum known only after consolidation) stay with Spark.
Pure logic, no I/O: tested against a brute-force scan in tests/spark/test_spark_pushdown.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

Pushed = tuple[str, str, Any]

_SPARK_OPS = {"EqualTo": "=", "LessThan": "<", "LessThanOrEqual": "<=", "GreaterThan": ">",
              "GreaterThanOrEqual": ">=", "In": "in", "IsNull": "isnull", "IsNotNull": "notnull"}


def from_spark(f: Any, columns: Sequence[str]) -> Pushed | None:
    """The tuple for a Spark ``pyspark.sql.datasource`` filter on one of ``columns``, or None."""
    op = _SPARK_OPS.get(type(f).__name__)
    attribute = getattr(f, "attribute", None)
    if op is None or not attribute or len(attribute) != 1 or attribute[0] not in columns:
        return None
    value = getattr(f, "value", None)
    if op in ("isnull", "notnull"):
        return (op, attribute[0], None)
    if value is None or (op == "in" and (not value or any(v is None for v in value))):
        return None  # comparisons with NULL are never true: leave those odd cases to Spark
    return (op, attribute[0], tuple(value) if op == "in" else value)


def expression(f: Pushed, column_type: pa.DataType) -> pc.Expression:
    """The Arrow expression that keeps exactly the rows ``f`` keeps."""
    op, name, value = f
    field = pc.field(name)
    if op == "isnull":
        return field.is_null()
    if op == "notnull":
        return field.is_valid()
    if op == "in":
        return field.isin(pa.array(list(value)).cast(column_type))
    scalar = pa.scalar(value).cast(column_type)
    return {"=": field == scalar, "<": field < scalar, "<=": field <= scalar,
            ">": field > scalar, ">=": field >= scalar}[op]


def usable(f: Pushed, schema: pa.Schema) -> bool:
    """Whether Arrow can evaluate ``f`` on ``schema`` exactly (the literal casts to the
    column's type without loss); otherwise Spark keeps the filter."""
    op, name, value = f
    column_type = schema.field(name).type
    if pa.types.is_floating(column_type):
        return False  # Spark orders NaN above every number and equal to itself; Arrow does not
    try:
        values = list(value) if op == "in" else ([] if value is None else [value])
        for v in values:
            back = pa.scalar(v).cast(column_type).as_py()
            if back != v:
                return False
        schema.empty_table().filter(expression(f, column_type))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return False
    return True


def combined(filters: Iterable[Pushed], schema: pa.Schema) -> pc.Expression | None:
    expr = None
    for f in filters:
        e = expression(f, schema.field(f[1]).type)
        expr = e if expr is None else expr & e
    return expr


def mask(f: Pushed, column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """The rows of ``column`` that ``f`` keeps, as booleans without nulls (the same rows as
    :func:`expression`, computed without Acero, which warns about IPC buffers' alignment)."""
    op, _, value = f
    if op == "isnull":
        return pc.is_null(column)
    if op == "notnull":
        return pc.is_valid(column)
    if op == "in":
        kept = pc.is_in(column, value_set=pa.array(list(value)).cast(column.type))
    else:
        scalar = pa.scalar(value).cast(column.type)
        kept = {"=": pc.equal, "<": pc.less, "<=": pc.less_equal, ">": pc.greater,
                ">=": pc.greater_equal}[op](column, scalar)
    return pc.fill_null(kept, False)


def apply(table: pa.Table, filters: Iterable[Pushed]) -> pa.Table:
    """``table``'s rows that every filter keeps."""
    keep = None
    for f in filters:
        m = mask(f, table.column(f[1]))
        keep = m if keep is None else pc.and_(keep, m)
    return table if keep is None else table.filter(keep)


def may_match(f: Pushed, lo: Any, hi: Any, nulls: int | None, rows: int) -> bool:
    """False only when no row of a row group with statistics ``lo``/``hi`` (None: unknown),
    ``nulls`` null values (None: unknown) and ``rows`` rows can satisfy ``f``."""
    op, _, value = f
    if op == "isnull":
        return nulls is None or nulls > 0
    if op == "notnull":
        return nulls is None or nulls < rows
    if lo is None or hi is None:
        return True
    try:
        if op == "=":
            return not (value < lo or value > hi)
        if op == "in":
            return any(not (v < lo or v > hi) for v in value)
        if op == "<":
            return lo < value
        if op == "<=":
            return lo <= value
        if op == ">":
            return hi > value
        if op == ">=":
            return hi >= value
    except TypeError:
        return True  # statistics and literal of types Python cannot compare: read the group
    return True


def describe(filters: Sequence[Pushed]) -> str:
    return ", ".join(f"{name} {op}" + ("" if value is None else f" {value!r}") for op, name, value in filters)
