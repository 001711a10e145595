"""Streamed k-way merge of sorted batches with bounded memory (the design's TODO 2).

Merging whole batches in memory is what choked the 2021 prototype. Here each input
is read a chunk at a time and only rows that can no longer be joined by a row from
another input are emitted: the *frontier* is the smallest of the inputs' last-read
(row, time); every buffered row <= the frontier is final, because each input is
strictly increasing (after per-input consolidation), so nothing <= the frontier can
still arrive. An input is refilled only when none of its rows remain buffered, so at
most one chunk per input is held: memory ~ inputs x chunk_rows, whatever the input
length. All comparisons are pyarrow sorts (no per-row Python), and the order is the
one :func:`sediment.trace.consolidate.consolidate` produces (nulls last).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from sediment.errors import TraceError
from sediment.trace.batch import DEFAULT_ROW_GROUP_ROWS, BatchDescription, write_batch_stream
from sediment.trace.consolidate import (
    DIFF,
    TIME,
    advance_times,
    first_unsorted,
    sort_keys,
    sorted_table,
    sum_sorted,
)

DEFAULT_CHUNK_ROWS = 64 * 1024
_SRC = "__sediment_src"
_TB = "__sediment_tb"


@dataclass
class MergeStats:
    """Counters for tests and metrics: the bound on buffered rows is the point of the merge."""

    rows_in: int = 0
    rows_out: int = 0
    rounds: int = 0
    max_buffered_rows: int = 0


def _as_table(chunk: pa.Table | pa.RecordBatch, cols: list[str]) -> pa.Table:
    if isinstance(chunk, pa.RecordBatch):
        chunk = pa.Table.from_batches([chunk])
    return chunk.select(cols)


def _consolidated_stream(
    which: int,
    chunks: Iterable[pa.Table | pa.RecordBatch],
    key_columns: list[str],
    since: int | None,
    chunk_rows: int,
    stats: MergeStats,
) -> Iterator[pa.Table]:
    """One input as chunks of at most ``chunk_rows + 1`` rows, times advanced, strictly
    increasing in (row, time) across chunks. The last group of each chunk is held back
    (before zero-dropping, as the next chunk may continue it)."""
    cols = [*key_columns, TIME]
    carry: pa.Table | None = None
    seen = 0
    for chunk in chunks:
        table = _as_table(chunk, [*cols, DIFF])
        stats.rows_in += table.num_rows
        for start in range(0, table.num_rows, chunk_rows):
            piece = advance_times(table.slice(start, chunk_rows), since)
            if carry is not None:
                piece = pa.concat_tables([carry, piece])
            bad = first_unsorted(piece, cols, strict=False)
            if bad is not None:
                raise TraceError(
                    f"merge input {which}: row {seen + start + bad - (carry is not None)} is not "
                    f"sorted after its predecessor by {cols} (nulls last); sort each input before merging"
                )
            summed = sum_sorted(piece, cols, drop_zeros=False)
            carry = summed.slice(summed.num_rows - 1)
            out = _nonzero(summed.slice(0, summed.num_rows - 1))
            if out.num_rows:
                yield out
        seen += table.num_rows
    if carry is not None:
        carry = _nonzero(carry)
        if carry.num_rows:
            yield carry


def _nonzero(table: pa.Table) -> pa.Table:
    """The rows with a non-zero diff; the table itself when all are (a filter copies every column)."""
    keep = pc.not_equal(table.column(DIFF), 0)
    return table if pc.all(keep).as_py() else table.filter(keep)


def merge_sorted(
    inputs: Sequence[Iterable[pa.Table | pa.RecordBatch]],
    key_columns: Sequence[str],
    since: int | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    *,
    stats: MergeStats | None = None,
) -> Iterator[pa.Table]:
    """Merge inputs, each sorted by (row, time), into consolidated tables at ``since``.

    Output: tables with columns ``key_columns + ["time", "diff"]`` of at most
    ``chunk_rows`` rows, sorted across chunks, no zero diff, and no (row, time) twice
    anywhere in the output. Inputs need not be consolidated, only sorted (NULLs last,
    NaN before NULL, as pyarrow sorts); order is checked as rows arrive (vectorised)
    and an unsorted input raises TraceError naming it and the row. Buffered rows stay
    below ``len(inputs) * (chunk_rows + 1)``.
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows={chunk_rows} must be >= 1")
    stats = stats if stats is not None else MergeStats()
    keys = list(key_columns)
    cols = [*keys, TIME]
    order = sort_keys(keys)
    streams = {i: _consolidated_stream(i, inp, keys, since, chunk_rows, stats) for i, inp in enumerate(inputs)}
    last: dict[int, pa.Table] = {}
    pending: pa.Table | None = None
    need = set(streams)

    while True:
        parts = [] if pending is None else [pending]
        for i in sorted(need):
            nxt = next(streams[i], None)
            if nxt is None:
                del streams[i]
                last.pop(i, None)
                continue
            n = nxt.num_rows
            nxt = nxt.append_column(_SRC, pa.nulls(n, pa.int32()).fill_null(i))
            nxt = nxt.append_column(_TB, pa.nulls(n, pa.int8()).fill_null(0))
            last[i] = nxt.slice(n - 1).select(cols)
            parts.append(nxt)
        if not parts:
            return
        buffered = pa.concat_tables(parts)
        stats.max_buffered_rows = max(stats.max_buffered_rows, buffered.num_rows)
        stats.rounds += 1

        if not streams:
            done = sorted_table(buffered, order)
            yield from _emit(done, cols, chunk_rows, stats)
            return

        frontier = pa.concat_tables(list(last.values())).sort_by(order).slice(0, 1)
        sentinel = frontier.append_column(DIFF, pa.array([0], pa.int64()))
        sentinel = sentinel.append_column(_SRC, pa.array([-1], pa.int32()))
        sentinel = sentinel.append_column(_TB, pa.array([1], pa.int8()))
        merged = pa.concat_tables([buffered, sentinel.select(buffered.column_names)])
        merged = sorted_table(merged, [*order, (_TB, "ascending")])
        cut = pc.index(merged.column(_TB), pa.scalar(1, pa.int8())).as_py()
        yield from _emit(merged.slice(0, cut), cols, chunk_rows, stats)
        pending = merged.slice(cut + 1)
        remaining = set(pc.unique(pending.column(_SRC)).to_pylist())
        need = {i for i in streams if i not in remaining}
        if not need:
            raise TraceError(
                f"merge inputs {sorted(streams)} are not sorted by (row, time) as pyarrow sorts them "
                "(nulls last); sort each input before merging"
            )


def _emit(sorted_rows: pa.Table, cols: list[str], chunk_rows: int, stats: MergeStats) -> Iterator[pa.Table]:
    if sorted_rows.num_rows == 0:
        return
    out = sum_sorted(sorted_rows, cols)
    for start in range(0, out.num_rows, chunk_rows):
        piece = out.slice(start, chunk_rows)
        stats.rows_out += piece.num_rows
        yield piece


def merge_to_batch(
    inputs: Sequence[Iterable[pa.Table | pa.RecordBatch]],
    key_columns: Sequence[str],
    schema: pa.Schema,
    desc: BatchDescription,
    sink: str | pa.NativeFile | io.IOBase,
    *,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
    stats: MergeStats | None = None,
) -> BatchDescription:
    """Merge inputs at ``desc.since`` and write the result as one batch to ``sink``
    (a local temporary file path or a stream) incrementally; the output never sits in
    memory whole. Returns ``desc`` with ``rows`` set to the rows written."""
    chunks = merge_sorted(inputs, key_columns, desc.since, chunk_rows, stats=stats)
    return write_batch_stream(chunks, schema, desc, sink, row_group_rows=row_group_rows)
