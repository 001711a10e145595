"""Consolidation on read: snapshots of sorted batches, combined by a streaming merge of runs.

A batch is consolidated at its ``since`` and sorted by (row, time) (the batch format's
invariant, covered by the object checksum the trace state records). So a snapshot of
it never needs a sort: keeping the times <= ``as_of`` keeps the row order, and summing
adjacent equal rows gives a *run* -- rows strictly increasing, non-zero diffs. When all
the batch's times are one time (``since`` at or past its last time, as compaction
leaves a relation whose ``since`` was advanced), its rows are already distinct and the
batch is a run as stored: nothing is summed at all.

Several runs (batches and the WAL tail, or the streamed inputs of a compaction's merge,
trace/merge.py) are merged a window at a time, as differential
dataflow and Materialize's persist consolidate on read: each round takes the next
``chunk_rows`` of every run, finds the *frontier* (the least of the windows' last rows,
over runs that continue past their window) and emits every windowed row <= the
frontier; no row after it can sort before it, since each run is sorted. Rows from a
single run in a round pass through untouched; only rows of different runs that
interleave in a round are sorted together (at most ``runs x chunk_rows`` at a time).
Order is pyarrow's (NULLs last, NaN after numbers), as in :mod:`sediment.trace.consolidate`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from sediment.read_ahead import ordered_map
from sediment.trace.consolidate import (
    DIFF,
    TIME,
    first_unsorted,
    permuted,
    sort_indices,
    sort_keys,
    sum_sorted,
)

DEFAULT_RUN_CHUNK_ROWS = 1 << 20


@dataclass
class RunStats:
    """What consolidation on read did (tests assert on it; no timing involved)."""

    batches_as_is: int = 0  # batches used as stored: one time, rows already distinct
    batches_summed: int = 0  # batches filtered to as_of and/or summed per row, without a sort
    rounds: int = 0
    rows_passed: int = 0  # rows emitted without a sort (one run in their round)
    rows_sorted: int = 0  # rows of interleaving runs sorted together
    max_held_rows: int = 0  # most rows the streamed runs held at once (their current pieces)

    def count_batch(self, as_of: int, min_time: int, max_time: int) -> None:
        """Count one batch's snapshot (:func:`batch_run`, whole or in pieces) by how it is made."""
        if min_time <= as_of:
            if min_time == max_time:
                self.batches_as_is += 1
            else:
                self.batches_summed += 1


class _Run:
    """One run as the merge reads it: a table, or a stream of tables that together are one
    run (each strictly increasing and above the one before), held one piece at a time."""

    def __init__(self, source: pa.Table | Iterable[pa.Table], cols: list[str]) -> None:
        self.cols = cols
        self.pos = 0
        if isinstance(source, pa.Table):
            self.table: pa.Table | None = source.select(cols)
            self.stream: Iterator[pa.Table] | None = None
        else:
            self.table, self.stream = None, iter(source)
            self._pull()

    def _pull(self) -> None:
        self.table, self.pos = None, 0
        for piece in self.stream:  # type: ignore[union-attr]
            if piece.num_rows:
                self.table = piece.select(self.cols)
                return
        self.stream = None

    @property
    def live(self) -> bool:
        return self.table is not None and self.pos < self.table.num_rows

    @property
    def held(self) -> int:
        return self.table.num_rows if self.stream is not None and self.table is not None else 0

    def window(self, n: int) -> pa.Table:
        return self.table.slice(self.pos, n)  # type: ignore[union-attr]

    def continues_after(self, n: int) -> bool:
        """Whether rows may follow the next ``n``: a stream not yet ended may always continue,
        so its window's last row bounds the round as any other run's does."""
        return self.pos + n < self.table.num_rows or self.stream is not None  # type: ignore[union-attr]

    def advance(self, n: int) -> None:
        self.pos += n
        if self.stream is not None and self.pos >= self.table.num_rows:  # type: ignore[union-attr]
            self._pull()


def batch_run(table: pa.Table, key_columns: Sequence[str], as_of: int, *, min_time: int, max_time: int,
              stats: RunStats | None = None) -> pa.Table:
    """The snapshot at ``as_of`` of one stored batch (sorted by (row, time), consolidated),
    as a run: ``key_columns + [diff]``, rows strictly increasing. ``min_time``/``max_time``
    are the batch's time bounds from its description: when they are equal and <= as_of the
    rows are already distinct and are returned as stored."""
    keys = list(key_columns)
    if stats is not None:
        stats.count_batch(as_of, min_time, max_time)
    if min_time > as_of:
        return table.select([*keys, DIFF]).slice(0, 0)
    if min_time == max_time:
        return table.select([*keys, DIFF])
    if max_time > as_of:
        table = table.filter(pc.less_equal(table.column(TIME), pa.scalar(as_of, pa.int64())))
    return sum_sorted(table.select([*keys, DIFF]), keys)


def stitched(pieces: Iterable[pa.Table], key_columns: Sequence[str]) -> Iterator[pa.Table]:
    """Consecutive pieces of one sorted batch, each made a run on its own (:func:`batch_run`
    of a row group), joined into one run: where a row continues from one piece into the
    next (a row's times spread over a row group boundary), its two sums are added (exactly,
    as :func:`sum_sorted` adds) and it is dropped if they cancel. Yields non-empty tables
    that are together one run. Why: each row group can then be decoded and summed on its
    own core, and only the rows at the boundaries are looked at twice."""
    keys = list(key_columns)
    held: pa.Table | None = None
    for piece in pieces:
        if not piece.num_rows:
            continue
        if held is None or not held.num_rows:
            held = piece
            continue
        n = held.num_rows
        edge = sum_sorted(pa.concat_tables([held.slice(n - 1), piece.slice(0, 1)]), keys)
        if edge.num_rows == 2:  # the rows differ: nothing continues
            yield held
            held = piece
            continue
        if n > 1:
            yield held.slice(0, n - 1)
        held = pa.concat_tables([edge, piece.slice(1)]) if edge.num_rows else piece.slice(1)
    if held is not None and held.num_rows:
        yield held


def _is_nan(value: pa.Scalar) -> bool:
    v = value.as_py()
    return isinstance(v, float) and math.isnan(v)


def _compare(col: pa.ChunkedArray | pa.Array, value: pa.Scalar) -> tuple[pa.Array, pa.Array]:
    """(col < value, col == value) in sort order: numbers, then NaN, then NULL; never null."""
    floating = pa.types.is_floating(col.type)
    if not value.is_valid:
        return pc.is_valid(col), pc.is_null(col)
    if floating and _is_nan(value):
        nan = pc.fill_null(pc.is_nan(col), False)
        return pc.and_(pc.is_valid(col), pc.invert(nan)), nan
    return pc.fill_null(pc.less(col, value), False), pc.fill_null(pc.equal(col, value), False)


def _row_at_most(window: pa.Table, i: int, keys: list[str], frontier: dict[str, pa.Scalar]) -> bool:
    """Whether row ``i`` of the window is <= the frontier row, in sort order."""
    row = window.slice(i, 1)
    le = None
    for c in reversed(keys):
        lt, eq = _compare(row.column(c), frontier[c])
        le = pc.or_(lt, eq) if le is None else pc.or_(lt, pc.and_(eq, le))
    return bool(le[0].as_py())


def _python_ordered(t: pa.DataType) -> bool:
    """Types whose Python values compare in pyarrow's sort order: integers, and strings and
    binaries (UTF-8 byte order is code point order)."""
    return (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_binary(t) or pa.types.is_large_binary(t))


def _sort_key(value: object) -> tuple:
    return (1,) if value is None else (0, value)  # NULL after every value, equal to NULL


def _rows_at_most(window: pa.Table, keys: list[str], frontier: dict[str, pa.Scalar]) -> int:
    """How many leading rows of a sorted window are <= the frontier row: a binary search,
    so a round compares about log2(window) rows, not every byte of every key column (a
    window of wide rows, such as 1 KiB payloads, made a full comparison the merge's cost).
    Where every key column's Python values compare as pyarrow sorts them, a row is compared
    as a tuple of them: comparing through pyarrow's kernels cost ~30 us a row, a fifth of a
    merge of several writers' fresh ids."""
    n = window.num_rows
    if n == 0:
        return n
    if all(_python_ordered(window.schema.field(c).type) for c in keys):
        cols = [window.column(c) for c in keys]
        bound = tuple(_sort_key(frontier[c].as_py()) for c in keys)

        def at_most(i: int) -> bool:
            return tuple(_sort_key(col[i].as_py()) for col in cols) <= bound
    else:
        def at_most(i: int) -> bool:
            return _row_at_most(window, i, keys, frontier)
    if at_most(n - 1):
        return n
    if not at_most(0):
        return 0  # runs that do not interleave (fresh keys) settle in these two looks
    lo, hi = 1, n - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if at_most(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _apart(pieces: list[pa.Table], keys: list[str], order: list[tuple[str, str]]) -> list[pa.Table] | None:
    """The pieces in order if they do not interleave (each one's last row before the next
    one's first), else None."""
    if len(pieces) == 1:
        return pieces
    firsts = pa.concat_tables([p.slice(0, 1).select(keys) for p in pieces])
    ranked = [pieces[i] for i in sort_indices(firsts, order).to_pylist()]
    for a, b in zip(ranked, ranked[1:], strict=False):
        pair = pa.concat_tables([a.slice(a.num_rows - 1).select(keys), b.slice(0, 1).select(keys)])
        if first_unsorted(pair, keys, strict=True) is not None:
            return None
    return ranked


def _rounds(runs: list[_Run], keys: list[str], order: list[tuple[str, str]], chunk_rows: int,
            stats: RunStats) -> Iterator[tuple[bool, pa.Table]]:
    """The merge's rounds in output order: (False, rows to emit as they are) or (True, rows
    of interleaving runs still to be sorted and summed)."""
    while True:
        active = [r for r in runs if r.live]
        if not active:
            return
        stats.rounds += 1
        stats.max_held_rows = max(stats.max_held_rows, sum(r.held for r in runs))
        windows = [r.window(chunk_rows) for r in active]
        if len(active) == 1:
            active[0].advance(windows[0].num_rows)
            stats.rows_passed += windows[0].num_rows
            yield False, windows[0]
            continue
        bounded = [i for i, r in enumerate(active) if r.continues_after(windows[i].num_rows)]
        take = [w.num_rows for w in windows]
        if bounded:
            lasts = pa.concat_tables([windows[i].slice(windows[i].num_rows - 1).select(keys) for i in bounded])
            first = sort_indices(lasts, order)[0].as_py()
            frontier = {c: lasts.column(c)[first] for c in keys}
            for i, w in enumerate(windows):
                if i != bounded[first]:
                    take[i] = _rows_at_most(w, keys, frontier)
        pieces = [w.slice(0, n) for w, n in zip(windows, take, strict=True) if n]
        for r, n in zip(active, take, strict=True):
            r.advance(n)
        apart = _apart(pieces, keys, order)
        if apart is not None:
            for piece in apart:
                stats.rows_passed += piece.num_rows
                yield False, piece
            continue
        both = pa.concat_tables(pieces)
        stats.rows_sorted += both.num_rows
        yield True, both


def _combine(rows: pa.Table, keys: list[str], order: list[tuple[str, str]]) -> pa.Table:
    return sum_sorted(permuted(rows, sort_indices(rows.select(keys), order)), keys)


def iter_merge_runs(runs: Sequence[pa.Table | Iterable[pa.Table]], key_columns: Sequence[str], *,
                    chunk_rows: int = DEFAULT_RUN_CHUNK_ROWS, stats: RunStats | None = None,
                    workers: int = 1) -> Iterator[pa.Table]:
    """Merge runs (each ``key_columns + [diff]``, rows strictly increasing, no zero diff; a
    table, or an iterable of tables read one at a time) into one: diffs of equal rows summed, zeros dropped, rows strictly increasing across
    the yielded tables. Work is linear in the rows plus a sort of only the rows that
    interleave with another run's within a round. With ``workers`` > 1, the sorts of up
    to that many rounds run at once on a thread pool (Arrow's kernels release the GIL),
    as ``pq.read_table`` decodes on several threads; output order is unchanged."""
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows={chunk_rows} must be >= 1")
    stats = stats if stats is not None else RunStats()
    keys = list(key_columns)
    cols = [*keys, DIFF]
    live = [_Run(r, cols) for r in runs if not isinstance(r, pa.Table) or r.num_rows]
    order = sort_keys(keys, with_time=False)
    rounds = _rounds(live, keys, order, chunk_rows, stats)
    if workers <= 1 or sum(r.table.num_rows for r in live if r.stream is None and r.table is not None) \
            <= 2 * chunk_rows:
        for needs_sort, rows in rounds:
            out = _combine(rows, keys, order) if needs_sort else rows
            if out.num_rows:
                yield out
        return
    for out in ordered_map(lambda r: _combine(r[1], keys, order) if r[0] else r[1], rounds, ahead=workers):
        if out.num_rows:
            yield out


def merge_runs(runs: Sequence[pa.Table], key_columns: Sequence[str], schema: pa.Schema, *,
               chunk_rows: int = DEFAULT_RUN_CHUNK_ROWS, stats: RunStats | None = None,
               workers: int = 1) -> pa.Table:
    """:func:`iter_merge_runs` gathered into one table of ``schema`` (the run columns)."""
    parts = list(iter_merge_runs(runs, key_columns, chunk_rows=chunk_rows, stats=stats, workers=workers))
    if not parts:
        return schema.empty_table()
    if len(parts) == 1:
        return parts[0]
    return pa.concat_tables(parts)
