"""Time-ordered replay of stored updates in bounded memory.

Items (whole batches and WAL records) each cover a time range ``[t_lo, t_hi]``, but
arrive in storage order. A sweep over time loads an item only when the sweep reaches
its ``t_lo`` and emits rows strictly below the next unloaded item's ``t_lo``, so memory
holds just the items whose ranges overlap the current time. A batch is loaded whole:
it is sorted by (row, time), so every row group of it spans its whole time range.

Rows of one time keep their storage order: items in the order given, rows within an
item as stored. The order is found in two passes, so that no gather reads a whole
(row, time)-sorted batch in time order (each value's cache line once per time it holds:
about 40 ms a column at 8.5M rows here). As an item is loaded, each of its blocks (a row
group as it is decoded, or a WAL record) is stably sorted by time and run-end encoded
(:class:`Block`) while it is still in the CPU cache, on a read-ahead thread; the sweep then
cuts a block at a boundary by bisecting its runs. Emitting is a k-way merge by time in
windows of whole times: a window takes from every block the slice of its times, concatenates them and
sorts that with one stable counting sort (``array_sort_indices``), whose gather reads runs
of neighbouring rows. Binary and string columns whose values share one width are sorted
as fixed-size binary and viewed back without a copy: Arrow's variable-length ``take``
costs about 60 ns a row on time-interleaved indices here, the fixed-size one 10.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import lru_cache, partial
from typing import NamedTuple, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from sediment.read_ahead import ordered_map, pieces_in_flight

Piece = pa.Table | pa.RecordBatch


class Ranged(Protocol):
    t_lo: int
    t_hi: int


def time_ordered(
    items: Sequence[Ranged],
    load: Callable[[Ranged, Callable[[Piece], list[Block]]], Iterable[list[Block]] | None],
    schema: pa.Schema,
    batch_rows: int = 65536,
) -> Iterator[pa.RecordBatch]:
    """Yield every row of every item, ordered by ``time`` (rows of one time in item order,
    then as stored), in record batches of <= ``batch_rows`` rows of ``schema``. ``load(item,
    sort)`` gives ``sort(piece)`` for each piece of the item's rows (a table or record batch)
    in storage order; best one row group each, sorted as it is decoded, while it is still in
    the CPU cache, several at a time on the read-ahead pool."""
    sort = partial(sorted_piece, schema=schema)
    pending = sorted(range(len(items)), key=lambda n: items[n].t_lo)
    active: list[tuple[int, list[Block]]] = []
    i = 0

    def load_from(t_lo: int) -> None:
        nonlocal i
        while i < len(pending) and items[pending[i]].t_lo == t_lo:
            pieces = load(items[pending[i]], sort)
            blocks = [block for sorted_ in pieces for block in sorted_] if pieces is not None else []
            if blocks:
                active.append((pending[i], blocks))
            i += 1

    while i < len(pending) or active:
        if not active:
            load_from(items[pending[i]].t_lo)
        boundary = items[pending[i]].t_lo if i < len(pending) else None
        take: list[Block] = []
        keep = []
        for n, blocks in sorted(active, key=lambda a: a[0]):
            if boundary is None or items[n].t_hi < boundary:
                take += blocks
                continue
            rest = []
            for block in blocks:
                below, above = block.cut(boundary)
                if below is not None:
                    take.append(below)
                if above is not None:
                    rest.append(above)
            if rest:
                keep.append((n, rest))
        active = keep
        yield from merged(take, schema, batch_rows)
        if boundary is not None:
            load_from(boundary)


def in_time_order(table: pa.Table, schema: pa.Schema, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """``table``'s rows stably sorted by ``time``, as record batches of ``schema`` (cast from
    the stored types where Parquet changed them) of <= ``batch_rows`` rows."""
    if table.num_rows:
        yield from merged(sorted_blocks(table, schema), schema, batch_rows)


def sorted_piece(piece: Piece, schema: pa.Schema) -> list[Block]:
    """:func:`sorted_blocks` of one piece (a table's chunks, or one record batch)."""
    return sorted_blocks(piece if isinstance(piece, pa.Table) else [piece], schema)


class Block(NamedTuple):
    """Rows sorted by time, with their runs found while the rows are still in the CPU cache
    (on a read-ahead thread), so the merge that follows starts without a pass over every
    block on the caller's thread."""

    rows: pa.RecordBatch
    times: list[int]  # the distinct times, ascending
    ends: list[int]  # where each one's rows end
    counts: pa.StructArray  # (t, n): each time and its number of rows

    @classmethod
    def of(cls, rows: pa.RecordBatch, at: int) -> Block:
        """``rows`` (sorted by the time column at ``at``) with their runs."""
        return cls(rows, *_runs(rows.column(at)))

    def cut(self, bound: int) -> tuple[Block | None, Block | None]:
        """The rows of times below ``bound`` and the rest, each None when empty."""
        k = bisect_left(self.times, bound)
        if k == 0:
            return None, self
        if k == len(self.times):
            return self, None
        at = self.ends[k - 1]
        return (Block(self.rows.slice(0, at), self.times[:k], self.ends[:k], self.counts.slice(0, k)),
                Block(self.rows.slice(at), self.times[k:], [e - at for e in self.ends[k:]], self.counts.slice(k)))


def sorted_blocks(rows: pa.Table | Iterable[pa.RecordBatch], schema: pa.Schema) -> list[Block]:
    """``rows``' chunks (row groups, records), each stably sorted by time, in ``schema``'s
    column types except that binary columns of one width may come as fixed-size binary."""
    at = schema.get_field_index("time")
    out = []
    for block in rows.to_batches() if isinstance(rows, pa.Table) else rows:
        if not block.num_rows:
            continue
        if not block.schema.equals(schema):
            block = block.cast(schema)
        block = pa.RecordBatch.from_arrays([_fixed_or_same(col) for col in block.columns], names=schema.names)
        times = block.column(at)
        span = pc.min_max(times)
        if span["min"] != span["max"]:
            block = _permuted(block, _narrow(pc.array_sort_indices(times)))
        out.append(Block.of(block, at))
    return out


def merged(blocks: list[Block], schema: pa.Schema, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The rows of ``blocks`` (each sorted by time) merged by time, stably, as record batches
    of ``schema`` of <= ``batch_rows`` rows: a k-way merge in windows of whole times. Each
    window takes from every block the slice of rows whose times fall in it and sorts just
    those, so memory is allocated (and reused) a window at a time."""
    if not blocks:
        return
    distinct, counts = _counts(blocks)
    limit = max(batch_rows, WINDOW_ROWS)

    def windows() -> Iterator[tuple[list[pa.RecordBatch], bool]]:
        cursors = [0] * len(blocks)
        i = 0
        while i < len(distinct):
            j, rows = i + 1, counts[i]
            while j < len(distinct) and rows + counts[j] <= limit:
                rows += counts[j]
                j += 1
            parts = []
            for n, block in enumerate(blocks):
                if j == len(distinct):
                    stop = block.rows.num_rows
                else:  # where the block's rows of times before the next window end
                    k = bisect_left(block.times, distinct[j])
                    stop = block.ends[k - 1] if k else 0
                if stop > cursors[n]:
                    parts.append(block.rows.slice(cursors[n], stop - cursors[n]))
                    cursors[n] = stop
            yield parts, j == i + 1
            i = j

    def window(w: tuple[list[pa.RecordBatch], bool]) -> list[pa.RecordBatch]:
        return list(_window(w[0], schema, batch_rows, one_time=w[1]))

    per_row = sum(b.rows.nbytes for b in blocks) / max(1, sum(b.rows.num_rows for b in blocks))
    for out in ordered_map(window, windows(), ahead=pieces_in_flight(int(per_row * limit), WINDOWS_AHEAD)):
        yield from out


WINDOW_ROWS = 1 << 19  # rows merged at once (about 20 MB of the benchmark's rows)
# Windows merged on the read-ahead pool beyond the one being yielded (narrow rows; fewer
# within the pool's byte budget), and row groups of an item decoded and sorted ahead. The
# pool's threads take the next queued piece without waiting for the caller's thread, which
# on a loaded machine may wait for a core after each result; an item's pieces are all held
# until it is merged anyway, so queued row groups add no memory beyond the running ones.
WINDOWS_AHEAD = 3
PIECES_AHEAD = 16


def _runs(times: pa.Array) -> tuple[list[int], list[int], pa.Array]:
    """The distinct values of the non-decreasing ``times``, where each one's run ends, and
    the runs' lengths."""
    ree = pc.run_end_encode(times, run_end_type=pa.int64())
    ends = ree.run_ends
    lengths = pc.subtract(ends, pa.concat_arrays([pa.array([0], pa.int64()), ends.slice(0, len(ends) - 1)]))
    return ree.values.to_pylist(), ends.to_pylist(), pa.StructArray.from_arrays([ree.values, lengths], ["t", "n"])


def _counts(blocks: list[Block]) -> tuple[list[int], list[int]]:
    """The distinct times of all ``blocks``, ascending, and how many rows each has. Up to
    ``PYTHON_RUNS`` runs are summed from the blocks' own run lists in Python, without a call
    into Arrow: each such call lets go of the interpreter lock and, beside busy threads,
    waits for it again, and the first hash ``group_by`` in a process imports Acero and the
    dataset modules; together most of a short replay's time there. Above that, a hash
    ``group_by`` over the runs (a sort of millions of runs takes 3-4x longer)."""
    if sum(len(b.times) for b in blocks) <= PYTHON_RUNS:
        rows: dict[int, int] = {}
        for b in blocks:
            start = 0
            for t, end in zip(b.times, b.ends, strict=True):
                rows[t] = rows.get(t, 0) + end - start
                start = end
        distinct = sorted(rows)
        return distinct, [rows[t] for t in distinct]
    table = pa.Table.from_struct_array(pa.concat_arrays([b.counts for b in blocks]))
    total = table.group_by("t", use_threads=False).aggregate([("n", "sum")]).sort_by("t")
    return total.column("t").to_pylist(), total.column("n_sum").to_pylist()


PYTHON_RUNS = 4096


def _window(parts: list[pa.RecordBatch], schema: pa.Schema, batch_rows: int, *,
            one_time: bool) -> Iterator[pa.RecordBatch]:
    """``parts`` (each sorted by time) stably merged by time, as record batches of ``schema``
    of <= ``batch_rows`` rows."""
    if one_time:  # already in order: concatenated in storage order
        for part in parts:
            for start in range(0, part.num_rows, batch_rows):
                yield _restored(part.slice(start, batch_rows), schema)
        return
    if any(not p.schema.equals(parts[0].schema) for p in parts):  # values of several widths
        parts = [_restored(p, schema) for p in parts]
    window = pa.concat_batches(parts)
    out = _restored(_permuted(window, pc.array_sort_indices(window.column(schema.get_field_index("time")))), schema)
    for start in range(0, out.num_rows, batch_rows):
        yield out.slice(start, batch_rows)


def _permuted(block: pa.RecordBatch, order: pa.Array) -> pa.RecordBatch:
    """``block``'s rows in ``order``, a permutation of its own row numbers from a sort, so
    every index is in range: the gather skips Arrow's bounds check, a pass over the indices
    for each column (10-14% of a row group's gather here)."""
    return pc.take(block, order, boundscheck=False)


def _narrow(order: pa.Array) -> pa.Array:
    """A row group's sort indices (64-bit) as 16-bit ones when its rows allow (a row group
    of 64Ki rows or fewer, the default): the gather that follows reads a quarter of the
    bytes of them, 20-25% less time in this in-cache gather here. A merge window's gather
    reads from memory, not cache, and gains nothing from it."""
    if len(order) <= 1 << 16:
        return order.cast(pa.uint16(), safe=False)  # a permutation of the block's rows: every index fits
    return order


def _restored(block: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``block`` with any fixed-size binary column turned back into its type in ``schema``."""
    if block.schema.equals(schema):
        return block
    return pa.RecordBatch.from_arrays([col if col.type == f.type else _unfixed(col, f.type)
                                       for col, f in zip(block.columns, schema, strict=True)], schema=schema)


def _unfixed(col: pa.Array, typ: pa.DataType) -> pa.Array:
    """A fixed-size binary ``col`` as ``typ`` (binary or string): its data buffer reused under
    offsets ``0, w, 2w, ...``, without a copy where the offsets fit."""
    w = col.type.byte_width
    raw, offset_type = _BINARY_OF[typ]
    end = col.offset + len(col)
    if col.null_count or (offset_type == pa.int32() and 2 * (end + 1) * w >= 1 << 31):
        return col.cast(typ)
    offsets = _offsets(w, 1 << end.bit_length(), offset_type)
    out = pa.Array.from_buffers(raw, len(col), [None, offsets, col.buffers()[1]], offset=col.offset)
    return out if raw == typ else out.view(typ)


_BINARY_OF = {
    pa.binary(): (pa.binary(), pa.int32()),
    pa.string(): (pa.binary(), pa.int32()),
    pa.large_binary(): (pa.large_binary(), pa.int64()),
    pa.large_string(): (pa.large_binary(), pa.int64()),
}


@lru_cache(maxsize=16)
def _offsets(width: int, rows: int, offset_type: pa.DataType) -> pa.Buffer:
    """The offsets ``0, width, 2 * width, ...`` of ``rows`` values of one width."""
    steps = pc.cumulative_sum(pa.repeat(pa.scalar(width, offset_type), rows))
    return pa.concat_arrays([pa.array([0], offset_type), steps]).buffers()[1]


def _fixed_or_same(col: pa.Array) -> pa.Array:
    """``col`` viewed, without a copy, as fixed-size binary when it is a binary or string
    column whose values are all non-null and of one non-zero width (hashes, UUIDs,
    fixed-width keys); else ``col`` itself."""
    entry = _BINARY_OF.get(col.type)
    if entry is None or col.null_count or not len(col):
        return col
    raw, offset_type = entry
    view = col.view(raw)
    span = pc.min_max(pc.binary_length(view))
    width = span["min"].as_py()
    if not width or width != span["max"].as_py():
        return col
    _validity, offsets, data = view.buffers()
    first = pa.Array.from_buffers(offset_type, 1, [None, offsets], offset=view.offset)[0].as_py()
    return pa.Array.from_buffers(pa.binary(width), len(col), [None, data.slice(first, width * len(col))])
