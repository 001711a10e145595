"""An UPDATES body for a small append, built without leaving the interpreter.

Why: ``Table.to_batches`` and ``RecordBatch.serialize`` release the GIL on every call. With
many writer threads runnable, each release hands the interpreter to another thread and the
appender queues to get it back: with 64 one-row writers that convoy cost about two thirds
of the CPU per append (docs/benchmarks.md, "Small writes"). Here the body is the same bytes
``serialize`` writes (one IPC record batch message, docs/formats.md): the message's metadata
depends only on the row count and the buffers' lengths, so it is taken once per such shape
from a real ``serialize`` and checked against it, and later bodies of that shape are that
metadata followed by the column buffers, each padded to 8 bytes. Anything else (nulls,
sliced or chunked columns, types other than fixed-width and 32-bit-offset binary/string, a
shape whose check failed) returns None and the caller serializes as before.
"""

from __future__ import annotations

import pyarrow as pa

_ZEROS = bytes(8)
_MAX_SHAPES = 4096  # shapes remembered per encoder; past it, new shapes serialize as before


def _kind(t: pa.DataType) -> int:
    """0: not handled; 1: fixed width (its byte width); 2: 32-bit offsets + data."""
    if pa.types.is_binary(t) or pa.types.is_string(t):
        return 2
    if pa.types.is_boolean(t):
        return 0
    try:
        return 1 if t.bit_width >= 8 and t.bit_width % 8 == 0 and not pa.types.is_nested(t) else 0
    except ValueError:
        return 0


class SmallBodyEncoder:
    """Bodies for small tables of one schema. Not thread-safe by itself: the caches are only
    ever added to, and a racing duplicate computes the same value."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self._kinds = [(_kind(f.type), f.type.bit_width // 8 if _kind(f.type) == 1 else 0) for f in schema]
        self.usable = all(k for k, _w in self._kinds)  # flat fixed-width and binary/string columns only
        self._meta: dict[tuple, bytes | None] = {}

    def encode(self, table: pa.Table) -> bytes | None:
        """``table.to_batches()[0].serialize()`` as bytes, or None when not handled here."""
        got = self._build(table)
        return None if got is None else got[0]

    def encode_with_times(self, table: pa.Table) -> tuple[bytes, int, int] | None:
        """:meth:`encode` and the least and greatest value of the second-last column (an
        update schema's ``time``), read from the buffer the body copies: a writer that has
        this need not look the columns up a second time to check the times. None when not
        handled here, or when the table has no rows."""
        got = self._build(table)
        if got is None or got[1] is None or not table.num_rows:
            return None
        body, times = got
        values = times.cast("q")
        if len(values) == 1:
            return body, values[0], values[0]
        return body, min(values), max(values)

    def _build(self, table: pa.Table) -> tuple[bytes, memoryview | None] | None:
        """The body, and the second-last column's data when it is 8 bytes wide."""
        if not self.usable:
            return None
        n = table.num_rows
        pieces: list = []
        lengths = [n]
        times = None
        last = len(self._kinds) - 2
        for i, (kind, width) in enumerate(self._kinds):
            col = table.column(i)
            if col.num_chunks != 1:
                return None
            arr = col.chunk(0)
            if arr.offset or arr.null_count:
                return None
            bufs = arr.buffers()
            if kind == 1:
                size = n * width
                data = memoryview(bufs[1])[:size]
                if len(data) != size:
                    return None
                pieces.append(data)
                lengths.append(size)
                if i == last and width == 8:
                    times = data
            else:
                offsets = memoryview(bufs[1]).cast("i")
                if len(offsets) < n + 1 or offsets[0] != 0:
                    return None
                end = offsets[n]
                pieces.append(memoryview(bufs[1])[:4 * (n + 1)])
                data = memoryview(bufs[2])[:end] if bufs[2] is not None else memoryview(b"")
                if len(data) != end:
                    return None
                pieces.append(data)
                lengths.append(end)
        body = bytearray()
        for p in pieces:
            body += p
            pad = -len(p) % 8
            if pad:
                body += _ZEROS[:pad]
        key = tuple(lengths)
        meta = self._meta.get(key, False)
        if meta is False:
            meta = self._learn(table, bytes(body))
            if len(self._meta) < _MAX_SHAPES:
                self._meta[key] = meta
        if meta is None:
            return None
        return meta + body, times

    def _learn(self, table: pa.Table, body: bytes) -> bytes | None:
        """The metadata part of ``serialize`` for this shape, when the rest is ``body``."""
        batches = table.to_batches()
        if len(batches) != 1 or not batches[0].schema.equals(self.schema):
            return None
        whole = batches[0].serialize().to_pybytes()
        if len(whole) <= len(body) or whole[len(whole) - len(body):] != body:
            return None
        return whole[:len(whole) - len(body)]
