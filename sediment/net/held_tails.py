"""WAL-tail rows that a read plan leaves on the coordinator, for distributed readers to fetch
part by part (the ``plan`` ticket with ``hold_tail``, the ``tail_part`` ticket).

Why: a plan's uncompacted rows used to travel in the plan itself, so Spark's planning
worker on the driver received all of them and pickled each task's share into the task.
Held, they stay where they are until the lease ends; the planner gets only their count and,
to cut key ranges when there are no batch statistics to cut by, quantiles of the first key
column; each task asks the coordinator for its own range (or row slice) directly.

A part is a pure function of the held rows and the request: a key range ``index`` of
``cuts`` (:func:`range_index`: how many cuts are <= the row's first key column, nulls in
range 0) or a slice ``[start, stop)`` of rows; neither: all of them. Held rows count against
``max_bytes``; a plan that would pass it gets its rows inline instead (the old way), so the
coordinator's memory stays bounded whatever readers do.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sediment.arrow_codec import schema_to_text, table_from_text, table_to_text
from sediment.clock import MONOTONIC, Clock
from sediment.engine.args import check_int, check_number
from sediment.errors import InvalidArgument
from sediment.trace.consolidate import sort_indices

HELD_TAIL_BYTES = 256 << 20  # the most WAL-tail rows held for readers at once


def range_index(column: pa.ChunkedArray | pa.Array, cuts: Sequence[Any] | pa.Array) -> pa.Array:
    """Each value's key range: how many cut points are <= it (nulls: 0)."""
    idx = pa.array([0] * len(column), pa.int32()) if len(column) else pa.array([], pa.int32())
    for cut in cuts:
        scalar = cut if isinstance(cut, pa.Scalar) else pa.scalar(cut)
        ge = pc.fill_null(pc.greater_equal(column, scalar.cast(column.type)), False)
        idx = pc.add(idx, pc.cast(ge, pa.int32()))
    return idx


def _kind(t: pa.DataType) -> str:
    """What a value of type ``t`` compares with: numbers with numbers, text with text, ..."""
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "number"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "text"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "bytes"
    return str(t)


def cuts_of(key_type: pa.DataType, cuts: pa.Array, key: str, lease: int) -> pa.Array:
    """``cuts`` as values of the key column's type; InvalidArgument when they are of another
    kind (text cuts on a number key) or do not fit in it."""
    if cuts.type == key_type:
        return cuts
    where = f"tail_part (read lease {lease}): cut points of type {cuts.type} on key column {key!r} of type {key_type}"
    if _kind(cuts.type) != _kind(key_type):
        raise InvalidArgument(f"{where} cannot be compared; send the cuts plan_read_held gave, or cuts of the key's type")
    try:
        return cuts.cast(key_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise InvalidArgument(f"{where} do not fit in the key's type ({exc}); send cuts of the key's type") from None


def quantile_cuts(column: pa.ChunkedArray | pa.Array, parts: int) -> pa.Array:
    """Strictly increasing cut points splitting a column's non-null values into about
    ``parts`` equal ranges (of the column's type; empty for one part or no values)."""
    values = pc.drop_null(column)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array([], column.type)
    if parts <= 1 or len(values) == 0:
        return pa.array([], column.type)
    ordered = values.take(sort_indices(values))
    picks = [ordered[k * len(ordered) // parts] for k in range(1, parts)]
    cuts: list[pa.Scalar] = []
    for v in picks:
        if not cuts or pc.greater(v, cuts[-1]).as_py():
            cuts.append(v)
    return pa.array([c.as_py() for c in cuts], column.type)


def first_key(key_columns: Sequence[str], names: Sequence[str]) -> str | None:
    """The column key ranges cut: the relation's first key column, else its first column."""
    keys = list(key_columns) or [n for n in names if n not in ("time", "diff")]
    return keys[0] if keys else None


def tail_parts(rows: int, part_rows: int, max_parts: int) -> int:
    """How many parts a tail of ``rows`` rows is read in: one per ``part_rows``, at most ``max_parts``."""
    return max(1, min(max_parts, -(-rows // max(1, part_rows))))


class HeldTails:
    """The tails held for leases (thread-safe). Entries end with :meth:`release` or at their
    deadline (checked whenever one is held or asked for)."""

    def __init__(self, max_bytes: int = HELD_TAIL_BYTES, clock: Clock = MONOTONIC) -> None:
        self._max_bytes = max_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._held: dict[int, tuple[pa.Table, float, str]] = {}  # lease -> (rows, deadline, relation)
        self._bytes = 0

    def hold(self, lease: int, relation: str, tail: pa.Table, seconds: float) -> bool:
        """Keep ``tail`` (of ``relation``) for ``lease`` for ``seconds``; False (nothing kept)
        when that would take the held rows past ``max_bytes``."""
        size = tail.get_total_buffer_size()
        with self._lock:
            self._sweep()
            if self._bytes + size > self._max_bytes:
                return False
            self._held[lease] = (tail, self._clock.current_time() + seconds, relation)
            self._bytes += size
            return True

    def part(self, lease: int, relation: str, *, key: str | None = None, cuts: pa.Array | None = None, index: int | None = None,
             start: int | None = None, stop: int | None = None) -> pa.Table:
        """The rows of one part of the tail held for ``lease`` (see the module's docstring)."""
        with self._lock:
            self._sweep()
            held = self._held.get(lease)
        if held is None:
            raise InvalidArgument(f"no WAL-tail rows are held for read lease {lease}: the lease was released or "
                                  "expired (lease_seconds), or the coordinator restarted; plan the read again")
        if held[2] != relation:
            raise InvalidArgument(f"read lease {lease} holds WAL-tail rows of relation {held[2]!r}, not {relation!r}")
        tail = held[0]
        if index is not None:
            if key is None or key not in tail.column_names:
                raise InvalidArgument(f"tail_part: key {key!r} is not a column of the held rows {tail.column_names}")
            if cuts is None or len(cuts) == 0:
                return tail if index == 0 else tail.slice(0, 0)
            column = tail.column(key)
            return tail.filter(pc.equal(range_index(column, cuts_of(column.type, cuts, key, lease)), index))
        if start is not None or stop is not None:
            lo = max(0, start or 0)
            hi = tail.num_rows if stop is None else min(tail.num_rows, stop)
            return tail.slice(lo, max(0, hi - lo))
        return tail

    def release(self, lease: int) -> None:
        with self._lock:
            self._drop(lease)

    def leases(self) -> list[int]:
        with self._lock:
            self._sweep()
            return sorted(self._held)

    def _sweep(self) -> None:
        now = self._clock.current_time()
        for lease in [lease for lease, (_, deadline, _) in self._held.items() if deadline <= now]:
            self._drop(lease)

    def _drop(self, lease: int) -> None:
        held = self._held.pop(lease, None)
        if held is not None:
            self._bytes -= held[0].get_total_buffer_size()


# --- the wire (docs/formats.md, "Network protocol": the plan ticket's hold_tail, the tail_part ticket) ---

HELD_METADATA_KEY = b"sediment.held_tail"


def encode_cuts(cuts: pa.Array) -> str:
    """Cut points for a ticket: base64 of an Arrow IPC stream of one column ``cut``."""
    return table_to_text(pa.table({"cut": cuts}))


def decode_cuts(text: str | None) -> pa.Array | None:
    if not text:
        return None
    try:
        table = table_from_text(text)
    except (ValueError, pa.ArrowException) as exc:
        raise InvalidArgument(f"tail_part: cuts is not base64 Arrow IPC of one column 'cut' ({exc})") from None
    return table.column("cut").combine_chunks() if table.num_rows else pa.array([], table.schema.field(0).type)


def _int_arg(args: dict[str, Any], key: str) -> int | None:
    value = args.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"tail_part: {key} must be an integer or null, not {value!r}")
    return value


def serve_hold(held: HeldTails, plan: Any, args: dict[str, Any]) -> tuple[pa.Table, dict[bytes, bytes]]:
    """The plan stream's body: the tail rows themselves, or, when the ticket asks to hold a
    tail of more than one part and it fits, the quantile cuts of its key column (one column
    ``cut``) of the first key column with the metadata ``sediment.held_tail`` = ``{"rows": N,
    "parts": P, "key": COLUMN|null, "update_schema": base64 IPC schema}`` (the body no longer
    has the update schema)."""
    import json

    ask = args.get("hold_tail")
    tail = plan.tail
    if not ask:
        return tail, {}
    if not isinstance(ask, dict):
        raise InvalidArgument(f"plan: hold_tail must be {{part_rows, max_parts}}, not {ask!r}")
    part_rows = check_int(ask.get("part_rows") or 65536, "plan: hold_tail part_rows", high=1 << 40)
    max_parts = check_int(ask.get("max_parts") or 16, "plan: hold_tail max_parts", high=1 << 16)
    parts = tail_parts(tail.num_rows, part_rows, max_parts)
    lease = check_number(args.get("lease_seconds", 600.0), "lease_seconds")
    if parts < 2 or not held.hold(plan.lease, plan.relation, tail, lease):
        return tail, {}
    key = first_key(plan.key_columns, plan.update_schema.names)
    cuts = quantile_cuts(tail.column(key), parts) if key is not None else pa.array([], pa.int64())
    body = pa.table({"cut": cuts})
    info = {"rows": tail.num_rows, "parts": parts, "key": key, "update_schema": schema_to_text(plan.update_schema)}
    return body, {HELD_METADATA_KEY: json.dumps(info).encode()}


def serve_tail_part(held: HeldTails, relation: str, args: dict[str, Any]) -> pa.Table:
    """The rows a ``tail_part`` ticket asks for."""
    lease = _int_arg(args, "lease")
    if lease is None:
        raise InvalidArgument("tail_part: the ticket needs lease (the read plan's)")
    return held.part(lease, relation, key=args.get("key"), cuts=decode_cuts(args.get("cuts")),
                     index=_int_arg(args, "index"), start=_int_arg(args, "start"), stop=_int_arg(args, "stop"))
