"""Which schema changes a relation allows, and the next schema version they make.

Pure: no I/O. Allowed: adding a column that is nullable or has a non-null default; widening
int8 -> int16 -> int32 -> int64, float32 -> float64, decimal(P, S) -> decimal(P', S) with
P' > P, string -> large_string, binary -> large_binary; renaming; dropping any column but
the last. Everything else (narrowing, a change of kind, a name clash, a reserved name) is
refused with :class:`SchemaChangeRefused` naming the column and the rule. Old updates are
never rewritten to make a change possible: each allowed change is one that a read can
apply to them (trace/evolve.py), which is why only these are allowed.

A change that changes nothing (renaming a column to its own name, widening one to the type
it has) is no change: an alter made only of such changes, or of none, makes no schema
version and answers the current one, so that an alter can be sent again without effect.

The changes of one alter apply in this order, every name in them meaning the column as
it is before the alter: drop, rename, widen, add (``defaults`` names added columns).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from sediment.engine.schema import RESERVED, check_schema
from sediment.engine.schema_history import SchemaHistory
from sediment.errors import InvalidArgument, SchemaChangeRefused, SchemaMismatch
from sediment.trace.evolve import with_id

_INTS = (pa.int8(), pa.int16(), pa.int32(), pa.int64())


def is_widening(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether every value of ``src`` is a value of ``dst`` by one of the allowed promotions."""
    if src in _INTS and dst in _INTS:
        return _INTS.index(dst) > _INTS.index(src)
    if pa.types.is_float32(src):
        return pa.types.is_float64(dst)
    if pa.types.is_decimal(src) and pa.types.is_decimal(dst):
        return dst.scale == src.scale and dst.precision > src.precision
    return (pa.types.is_string(src) and pa.types.is_large_string(dst)) or \
        (pa.types.is_binary(src) and pa.types.is_large_binary(dst))


def _refuse(relation: str, column: str, rule: str, detail: str) -> SchemaChangeRefused:
    return SchemaChangeRefused(f"alter of {relation!r} refused: column {column!r}: {detail} (rule: {rule}); "
                               "nothing was changed", column=column, rule=rule)


def typed_default(relation: str, column: pa.Field, value: Any) -> pa.Scalar:
    """An added column's default as a scalar of its type, or the rule's refusal (the engine's
    alter and a network client's encoding of it both ask here)."""
    try:
        return pa.scalar(value, column.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
        raise _refuse(relation, column.name, "default of the column's type",
                     f"default {value!r} is not a {column.type}: {exc}") from None


def check_alter_args(add: object, defaults: object, widen: object, rename: object, drop: object) -> None:
    """Refuse arguments of the wrong shape before any rule is looked at."""
    if not isinstance(add, Sequence) or isinstance(add, (str, bytes)) or \
            not all(isinstance(f, pa.Field) for f in add):
        raise InvalidArgument(f"add must be a list of pyarrow.Field, not {add!r}")
    for name, value, types in (("defaults", defaults, object), ("widen", widen, pa.DataType), ("rename", rename, str)):
        if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, types)
                                                     for k, v in value.items()):
            raise InvalidArgument(f"{name} must map column names to {getattr(types, '__name__', types)}, "
                                  f"not {value!r}")
    if not isinstance(drop, Sequence) or isinstance(drop, (str, bytes)) or not all(isinstance(c, str) for c in drop):
        raise InvalidArgument(f"drop must be a list of column names, not {drop!r}")


def _apply_drop_rename_widen(relation: str, cols: list[pa.Field], widen: Mapping[str, pa.DataType],
                             rename: Mapping[str, str], drop: Sequence[str]) -> list[pa.Field]:
    names = [f.name for f in cols]
    for column in (*drop, *rename, *widen):
        if column not in names:
            raise _refuse(relation, column, "unknown column", f"the relation has no such column; it has {names}")
    for column in drop:
        if column in rename:
            raise _refuse(relation, column, "drop or rename", "a column cannot be both dropped and renamed")
    kept = [f for f in cols if f.name not in set(drop)]
    if not kept:
        raise _refuse(relation, drop[-1], "keep one column", "an alter may not drop the last column")
    out = []
    for f in kept:
        typ = f.type
        if f.name in widen:
            new = widen[f.name]
            if new != typ and not is_widening(typ, new):
                raise _refuse(relation, f.name, "widen only", f"{typ} -> {new} is not an allowed widening "
                              "(int8->int16->int32->int64, float32->float64, decimal(P,S)->decimal(P'>P,S), "
                              "string->large_string, binary->large_binary)")
            typ = new
        out.append(pa.field(rename.get(f.name, f.name), typ, metadata=f.metadata))
    return out


def _check_new_name(relation: str, name: str, taken: list[str], what: str) -> None:
    if name in RESERVED:
        raise _refuse(relation, name, "reserved name", f"{what} {name!r} is reserved for every relation's updates")
    if name in taken:
        raise _refuse(relation, name, "name clash", f"{what} {name!r} would clash with an existing column")


def evolve(relation: str, history: SchemaHistory, *, add: Sequence[pa.Field] = (),
           defaults: Mapping[str, Any] | None = None, widen: Mapping[str, pa.DataType] | None = None,
           rename: Mapping[str, str] | None = None, drop: Sequence[str] = ()) -> SchemaHistory | None:
    """The history with the next version these changes make, None when they change nothing,
    or SchemaChangeRefused / InvalidArgument."""
    defaults, widen, rename = ({} if x is None else x for x in (defaults, widen, rename))
    check_alter_args(add, defaults, widen, rename, drop)
    defaults, widen, rename = dict(defaults), dict(widen), dict(rename)
    if not (add or widen or rename or drop):
        if defaults:
            raise _refuse(relation, next(iter(defaults)), "default for an added column",
                          "defaults only apply to columns added in the same alter")
        return None
    cols = _apply_drop_rename_widen(relation, list(history.current), widen, rename, drop)
    renamed = [f.name for f in cols]
    for old, new in rename.items():
        if not new:
            raise _refuse(relation, old, "valid name", "a column cannot be renamed to an empty name")
        _check_new_name(relation, new, renamed[:renamed.index(new)] + renamed[renamed.index(new) + 1:],
                        f"new name of {old!r}")
    next_id, new_defaults = history.next_field_id, {}
    added_names = [f.name for f in add]
    for column in defaults:
        if column not in added_names:
            raise _refuse(relation, column, "default for an added column",
                          "defaults only apply to columns added in the same alter")
    for f in add:
        _check_new_name(relation, f.name, [c.name for c in cols], "added column")
        try:
            checked = check_schema(pa.schema([f]))[0]
        except SchemaMismatch as exc:
            raise _refuse(relation, f.name, "supported type", str(exc)) from None
        default = typed_default(relation, f, defaults[f.name]) if f.name in defaults else None
        if not f.nullable and (default is None or not default.is_valid):
            raise _refuse(relation, f.name, "nullable or default",
                          "an added column that is not nullable needs a non-null default (older rows read "
                          "as it); give one, or add the column nullable")
        if default is not None:
            new_defaults[next_id] = default
        cols.append(with_id(checked, next_id))
        next_id += 1
    if pa.schema(cols).equals(history.current, check_metadata=True):
        return None  # only renames to the same name and widenings to the same type: nothing changes
    return history.with_version(pa.schema(cols), next_id, new_defaults)
