"""Streamed merge of sorted batches with bounded memory (the design's TODO 2).

Merging whole batches in memory is what choked the 2021 prototype. Here each input is
read a chunk at a time and consolidated on its own (times advanced to ``since``, equal
(row, time) summed), which makes it a *run*: strictly increasing in (row, time). The runs
are then merged by the one merge of sorted runs, :func:`sediment.trace.runs.iter_merge_runs`,
with time as the last key: a round emits only rows at or below the frontier, which no later
row can precede. A run holds one chunk at a time, so memory ~ inputs x chunk_rows, whatever
the input length; the order is the one :func:`sediment.trace.consolidate.consolidate`
produces (nulls last).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from sediment.errors import TraceError
from sediment.trace.batch import DEFAULT_ROW_GROUP_ROWS, BatchDescription, write_batch_stream
from sediment.trace.consolidate import DIFF, TIME, advance_times, first_unsorted, nonzero, sum_sorted
from sediment.trace.runs import RunStats, iter_merge_runs

DEFAULT_CHUNK_ROWS = 64 * 1024


@dataclass
class MergeStats:
    """Counters for tests and metrics: the bound on buffered rows is the point of the merge."""

    rows_in: int = 0
    rows_out: int = 0
    rounds: int = 0
    max_buffered_rows: int = 0  # rows of the inputs' current chunks held at once


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
            out = nonzero(summed.slice(0, summed.num_rows - 1))
            if out.num_rows:
                yield out
        seen += table.num_rows
    if carry is not None:
        carry = nonzero(carry)
        if carry.num_rows:
            yield carry


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
    streams = [_consolidated_stream(i, inp, keys, since, chunk_rows, stats) for i, inp in enumerate(inputs)]
    rounds = RunStats()
    try:
        for rows in iter_merge_runs(streams, [*keys, TIME], chunk_rows=chunk_rows, stats=rounds):
            stats.max_buffered_rows = max(stats.max_buffered_rows, rounds.max_held_rows)
            for start in range(0, rows.num_rows, chunk_rows):
                piece = rows.slice(start, chunk_rows)
                stats.rows_out += piece.num_rows
                yield piece
    finally:
        stats.rounds = rounds.rounds
        stats.max_buffered_rows = max(stats.max_buffered_rows, rounds.max_held_rows)


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
