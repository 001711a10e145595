"""A small append's time bounds and null checks read from its serialized body.

Why: a lone writer's append serializes its one record batch anyway (``RecordBatch.serialize``,
the UPDATES body, docs/formats.md), and that message already says what the append's checks
need: its metadata lists each column's length and null count (the flatbuffer ``FieldNode``
vector) and where each buffer lies in the message body, and the ``time`` values are one of
those buffers. Asking pyarrow instead (:func:`sediment.engine.schema.small_bounds`: two
column lookups, a chunk, ``to_pylist``) built four wrapper objects per append, about 2 us
hot and twice that right after the fdatasync. Here it is one ``struct`` unpack at offsets
found once per metadata layout, plus a view of the time values.

The layout of the metadata depends only on the schema and on which fields are present
(never on the values), so one generic walk of the flatbuffer finds the offsets; that walk
is checked against pyarrow's own answer for the same table (:func:`small_bounds`) and, if
they ever differ, this reader is turned off and every append asks pyarrow as before.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable

import pyarrow as pa

from sediment.engine.schema import small_bounds

_U8, _U16, _I32, _U32 = struct.Struct("<B"), struct.Struct("<H"), struct.Struct("<i"), struct.Struct("<I")
_I64 = struct.Struct("=q")  # the native order, as the multi-row path's memoryview cast reads them
_RECORD_BATCH = 3  # MessageHeader.RecordBatch in Arrow's Message.fbs
_CONTINUATION = 0xFFFFFFFF
_UNREAD = object()  # the message does not have the layout known


def _field(buf: object, table: int, k: int) -> int | None:
    """Where field ``k`` of the flatbuffer table at ``table`` is stored, or None if absent."""
    vtable = table - _I32.unpack_from(buf, table)[0]
    if 4 + 2 * k + 2 > _U16.unpack_from(buf, vtable)[0]:
        return None
    at = _U16.unpack_from(buf, vtable + 4 + 2 * k)[0]
    return table + at if at else None


def _deref(buf: object, at: int) -> int:
    return at + _U32.unpack_from(buf, at)[0]


def _layout(body: object, columns: int) -> tuple[struct.Struct, Callable, int, int, int] | None:
    """The offsets of an IPC record batch message's metadata length, its ``FieldNode``
    count and the time and diff nodes (the last two), its buffer count and the time data
    buffer (third from last), as a ``struct`` over the message and the getter that puts the
    unpacked values in that order; then the metadata length, buffer count and where the
    message body starts. None for anything but an uncompressed record batch of ``columns``
    flat columns."""
    if len(body) < 16 or _U32.unpack_from(body, 0)[0] != _CONTINUATION:
        return None
    meta = _I32.unpack_from(body, 4)[0]
    root = _deref(body, 8)
    kind, header = _field(body, root, 1), _field(body, root, 2)
    if kind is None or header is None or _U8.unpack_from(body, kind)[0] != _RECORD_BATCH:
        return None
    batch = _deref(body, header)
    nodes_at, buffers_at = _field(body, batch, 1), _field(body, batch, 2)
    if nodes_at is None or buffers_at is None or _field(body, batch, 3) is not None \
            or _field(body, batch, 4) is not None:  # compressed, or variadic buffers: not ours
        return None
    nodes, buffers = _deref(body, nodes_at), _deref(body, buffers_at)
    if _U32.unpack_from(body, nodes)[0] != columns:
        return None
    n_buffers = _U32.unpack_from(body, buffers)[0]
    fields = [(4, "i"), (nodes, "I"), (nodes + 4 + 16 * (columns - 2), "qqqq"),
              (buffers, "I"), (buffers + 4 + 16 * (n_buffers - 3), "qq")]
    order = sorted(range(len(fields)), key=lambda i: fields[i][0])
    fmt, at, slots, position = "<", 0, [], 0
    for i in order:
        start, codes = fields[i]
        if start < at:
            return None  # overlapping: not the layout this reads
        fmt += f"{start - at}x" if start > at else ""
        fmt += codes
        slots.append((i, position))
        position += len(codes)
        at = start + 4 * codes.count("i") + 4 * codes.count("I") + 8 * codes.count("q")
    first = dict(slots)
    widths = [len(codes) for _start, codes in fields]
    picks = [first[i] + j for i in range(len(fields)) for j in range(widths[i])]
    return struct.Struct(fmt), operator.itemgetter(*picks), meta, n_buffers, 8 + meta


class BodyBounds:
    """Bounds of serialized small appends of one update schema (a relation at one schema
    version). Safe to share between threads: the layout is one tuple, read once per call and
    replaced whole (a racing relearn computes the same one)."""

    __slots__ = ("columns", "_layout", "usable")

    def __init__(self, columns: int) -> None:
        self.columns = columns
        self._layout: tuple[struct.Struct, Callable, int, int, int] | None = None
        self.usable = True  # False once the walked layout disagreed with pyarrow: ask pyarrow from then on

    def bounds(self, body: pa.Buffer, table: pa.Table) -> tuple[int, int] | None:
        """(least, greatest) time of ``table`` (1-16 rows in an update schema) read from
        ``body``, its batch's ``serialize()``; None, as from :func:`small_bounds`, when its
        time or diff has a null or a time is negative (the caller then takes the full path
        for the typed error)."""
        layout = self._layout
        if layout is not None:
            got = _read(layout, self.columns, body, table.num_rows)
            if got is not _UNREAD:
                return got
        return self._learn(body, table)

    def _learn(self, body: pa.Buffer, table: pa.Table) -> tuple[int, int] | None:
        """pyarrow's answer; and, when the message is one this reads, its layout, kept if
        reading it gives that same answer (else this reader is turned off for good)."""
        expected = small_bounds(table)
        if not self.usable:
            return expected
        layout = _layout(body, self.columns)
        if layout is None:
            return expected
        if _read(layout, self.columns, body, table.num_rows) == expected:
            self._layout = layout
        else:
            self.usable = False
            self._layout = None
        return expected


def _read(layout: tuple[struct.Struct, Callable, int, int, int], columns: int, body: pa.Buffer,
          n: int) -> tuple[int, int] | None | object:
    """:meth:`BodyBounds.bounds` of a body of ``n`` rows read with ``layout``, or _UNREAD
    when the message does not have that layout."""
    fmt, pick, meta_len, n_buffers, body_at = layout
    if len(body) < fmt.size:
        return _UNREAD
    meta, nodes, t_len, t_nulls, d_len, d_nulls, buffers, t_at, t_size = pick(fmt.unpack_from(body))
    if meta != meta_len or nodes != columns or buffers != n_buffers or t_len != n or d_len != n or t_size != 8 * n:
        return _UNREAD
    if t_nulls or d_nulls:
        return None
    at = body_at + t_at
    if n == 1:
        lo = hi = _I64.unpack_from(body, at)[0]
    else:
        values = memoryview(body)[at:at + t_size].cast("q")
        lo, hi = min(values), max(values)
    return None if lo < 0 else (lo, hi)
