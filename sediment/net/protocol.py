"""The sediment Flight protocol's constants and codecs, shared by the server and the client.

Pure encoding: JSON arguments, locks, read-plan metadata and
feed-event metadata. No engine, no server, no Flight here (only pyarrow), so the
client and the server agree on the wire by importing the same functions.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from sediment.errors import InvalidArgument

PROTOCOL_VERSION = 1
TOKEN_ENV = "SEDIMENT_TOKEN"
AUTH_HEADER = "authorization"
PLAN_METADATA_KEY = b"sediment.plan"
# builtin exceptions the engine raises on purpose (bad argument types and values); anything
# else that is not a sediment error comes back as sediment.errors.ServerError
BUILTIN_ERRORS = ("ValueError", "TypeError", "KeyError", "LookupError", "IndexError")
FEED_BATCH_ROWS = 65536  # rows per record batch of a feed event on the wire
PLAN_FIELDS = ("lease", "relation", "relation_id", "key_columns", "since", "sealed", "as_of", "blob_uri",
               "s3_endpoint", "batches", "schema_history")


def json_arg(raw: bytes, what: str) -> dict[str, Any]:
    """A request's JSON object (descriptor, ticket, action body), or ValueError naming ``what``."""
    try:
        value = json.loads(raw) if raw else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"the {what} is not valid JSON ({exc}); see docs/formats.md "
                         "(Network protocol)") from None
    if not isinstance(value, dict):
        raise ValueError(f"the {what} must be a JSON object, not {type(value).__name__}")
    return value


def field(args: dict[str, Any], key: str, what: str) -> Any:
    try:
        return args[key]
    except KeyError:
        raise ValueError(f"the {what} lacks {key!r}; see docs/formats.md (Network protocol)") from None


def tuples(value: Any) -> Any:
    """JSON lists back to the tuples they were (lock ids are (name, id) tuples, hashed by repr)."""
    return tuple(tuples(v) for v in value) if isinstance(value, list) else value


def encode_locks(locks: Any) -> dict[str, Any] | None:
    """A ``sediment.Locks`` as the wire's JSON object (ids must be JSON scalars or tuples of them)."""
    if locks is None:
        return None
    spec = {"high_water": locks.high_water,
            **{kind: [list(lock) for lock in getattr(locks, kind)] for kind in ("write", "read", "append")}}
    try:
        json.dumps(spec)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"lock ids must be strings, numbers, booleans or tuples of them to cross the "
                              f"network ({exc})") from None
    return spec


def decode_locks(spec: object) -> Any:
    """A ``locks`` JSON object ({high_water, write, read, append}) as a sediment.Locks, or None.
    (The server's side: Locks is the engine's type, imported only when locks arrive.)"""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ValueError(f"locks must be a JSON object {{high_water, write, read, append}}, not {spec!r}")
    from sediment.engine.locks import Locks

    return Locks(field(spec, "high_water", "locks"), **{kind: [tuples(lock) for lock in spec.get(kind) or ()]
                                                        for kind in ("write", "read", "append")})


def plan_metadata(plan: Any) -> bytes:
    """A read plan's fields besides its tail rows, as the JSON the plan stream's schema carries."""
    return json.dumps({name: getattr(plan, name) for name in PLAN_FIELDS}).encode()


def event_metadata(kind: str, time: int, last: bool, initial: bool = False, records: int = 1) -> bytes:
    """A feed event batch's app metadata; ``last`` ends the event; ``initial``: one of the
    subscription's initial events, which its client's max_lag check does not count;
    ``records`` (sent when more than one): the feed entries a catch-up in bulk merged into
    it, which that check counts as the engine's feed does."""
    meta = {"kind": kind, "time": time, "last": last, "initial": initial}
    if records != 1:
        meta["records"] = records
    return json.dumps(meta).encode()


def event_records(meta: dict[str, Any]) -> int:
    """The feed entries an event's app metadata says it stands for (1 when absent)."""
    return int(meta.get("records", 1))


def event_batches(event: Any, schema: pa.Schema, initial: bool = False) -> list[tuple[pa.RecordBatch, bytes]]:
    """One feed event on the wire: batches of the update schema, the last one marked. A
    snapshot's rows get ``time`` = the snapshot's time so that every batch has the one
    update schema; a progress event is one empty batch."""
    table = event.table
    if table is None:
        table = schema.empty_table()
    elif "time" not in table.column_names:
        table = table.append_column("time", pa.repeat(pa.scalar(event.time, pa.int64()), table.num_rows))
    batches = table.select(schema.names).cast(schema).to_batches(max_chunksize=FEED_BATCH_ROWS) or \
        [pa.RecordBatch.from_pylist([], schema=schema)]
    last = len(batches) - 1
    records = getattr(event, "records", 1)
    return [(batch, event_metadata(event.kind, event.time, i == last, initial, records))
            for i, batch in enumerate(batches)]
