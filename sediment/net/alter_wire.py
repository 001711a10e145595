"""``alter_relation`` over the network: its arguments as one JSON document and back.

Types travel as Arrow IPC schemas (base64), so every column type the engine takes
crosses unchanged; defaults as a one-row Arrow IPC stream typed by the added columns.
Shared by the client (encode) and the server (decode); pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from sediment.arrow_codec import schema_from_text, schema_to_text, table_from_text, table_to_text
from sediment.engine.schema_rules import check_alter_args


def encode_alter(add: Sequence[pa.Field] = (), defaults: Mapping[str, Any] | None = None,
                 widen: Mapping[str, pa.DataType] | None = None, rename: Mapping[str, str] | None = None,
                 drop: Sequence[str] = ()) -> dict[str, Any]:
    """The JSON body of an ``alter_relation`` action; InvalidArgument for arguments of the wrong shape."""
    defaults, widen, rename = defaults or {}, widen or {}, rename or {}
    check_alter_args(add, defaults, widen, rename, drop)
    doc: dict[str, Any] = {"add": schema_to_text(pa.schema(list(add))),
                           "widen": schema_to_text(pa.schema([pa.field(k, v) for k, v in widen.items()])),
                           "rename": dict(rename), "drop": list(drop)}
    if defaults:
        types = {f.name: f.type for f in add}
        arrays = []
        for name, value in defaults.items():
            try:
                arrays.append(pa.array([value], types.get(name)))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                arrays.append(pa.array([str(value)]))  # the server refuses it with the rule's own error
        batch = pa.RecordBatch.from_arrays(arrays, list(defaults))
        doc["defaults"] = table_to_text(pa.Table.from_batches([batch]))
    return doc


def decode_alter(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of ``Engine.alter_relation`` from an action's JSON body."""
    defaults: dict[str, Any] = {}
    if doc.get("defaults"):
        table = table_from_text(doc["defaults"])
        defaults = {name: table.column(name)[0].as_py() for name in table.column_names}
    return {"add": list(schema_from_text(doc.get("add") or schema_to_text(pa.schema([])))),
            "widen": {f.name: f.type for f in schema_from_text(doc.get("widen") or schema_to_text(pa.schema([])))},
            "rename": dict(doc.get("rename") or {}), "drop": list(doc.get("drop") or []), "defaults": defaults}
