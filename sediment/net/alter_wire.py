"""``alter_relation`` over the network: its arguments as one JSON document and back.

Types travel as Arrow IPC schemas (base64), so every column type the engine takes
crosses unchanged; defaults as a one-row Arrow IPC stream typed by the added columns.
Shared by the client (encode) and the server (decode); pure.
"""

from __future__ import annotations

import binascii
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from sediment.arrow_codec import schema_from_text, schema_to_text, table_from_text, table_to_text
from sediment.engine.schema_rules import check_alter_args, typed_default
from sediment.errors import InvalidArgument


def encode_alter(add: Sequence[pa.Field] = (), defaults: Mapping[str, Any] | None = None,
                 widen: Mapping[str, pa.DataType] | None = None, rename: Mapping[str, str] | None = None,
                 drop: Sequence[str] = (), relation: str = "") -> dict[str, Any]:
    """The JSON body of an ``alter_relation`` action (of ``relation``); InvalidArgument for
    arguments of the wrong shape, and the engine's SchemaChangeRefused for a default that is
    not of its added column's type (sent as text, the server would take it for a string
    column: ``5`` would be stored as ``"5"``)."""
    defaults, widen, rename = defaults or {}, widen or {}, rename or {}
    check_alter_args(add, defaults, widen, rename, drop)
    doc: dict[str, Any] = {"add": schema_to_text(pa.schema(list(add))),
                           "widen": schema_to_text(pa.schema([pa.field(k, v) for k, v in widen.items()])),
                           "rename": dict(rename), "drop": list(drop)}
    if defaults:
        added = {f.name: f for f in add}
        arrays = []
        for name, value in defaults.items():
            if name in added:
                arrays.append(pa.array([typed_default(relation, added[name], value)]))
                continue
            try:
                arrays.append(pa.array([value]))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                arrays.append(pa.array([str(value)]))  # not an added column: the server refuses it by its rule
        batch = pa.RecordBatch.from_arrays(arrays, list(defaults))
        doc["defaults"] = table_to_text(pa.Table.from_batches([batch]))
    return doc


def wire_schema(text: object, what: str) -> pa.Schema:
    """A schema sent as base64 Arrow IPC; InvalidArgument naming ``what`` when it is not one."""
    try:
        if not isinstance(text, str):
            raise TypeError(f"a {type(text).__name__}, not text")
        return schema_from_text(text)
    except (binascii.Error, pa.ArrowException, TypeError, ValueError) as exc:
        raise InvalidArgument(f"{what} must be a base64 Arrow IPC schema ({exc}); nothing was changed") from None


def decode_alter(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``Engine.alter_relation`` from an action's JSON body, of the
    shapes sent: the engine refuses wrong ones (a string ``drop`` is not a list of names)."""
    defaults: dict[str, Any] = {}
    if doc.get("defaults"):
        try:
            table = table_from_text(doc["defaults"])
        except (binascii.Error, pa.ArrowException, TypeError, ValueError) as exc:
            raise InvalidArgument(f"alter_relation: defaults must be a base64 Arrow IPC stream of one row ({exc}); "
                                  "nothing was changed") from None
        if table.num_rows != 1:
            raise InvalidArgument(f"alter_relation: defaults must be one row, not {table.num_rows}; nothing was changed")
        defaults = {name: table.column(name)[0].as_py() for name in table.column_names}
    empty = schema_to_text(pa.schema([]))
    return {"add": list(wire_schema(doc.get("add") or empty, "alter_relation: add")),
            "widen": {f.name: f.type for f in wire_schema(doc.get("widen") or empty, "alter_relation: widen")},
            "rename": doc.get("rename") or {}, "drop": doc.get("drop") or [], "defaults": defaults}
