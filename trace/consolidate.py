"""Consolidation of ``(row, time, diff)`` updates, with pyarrow compute kernels only.

Every trace operation reduces to one idea from differential dataflow: updates to the
same row at the same (possibly advanced) time can be summed, and a zero sum is no
update at all. Storage stays proportional to the distinct rows once ``since`` moves.

Tables here have the relation's row columns plus ``time`` (int64) and ``diff`` (int64).
``key_columns`` names the row columns (all of them: a row's identity is its whole
value). NULLs in a key column group together as one value and sort last, as
pyarrow's ``sort_by`` places them; :mod:`sediment.trace.merge` relies on the same
order, so every sorted table in a trace is sorted by these functions' rules. Every sort
goes through :func:`sort_indices`, which sorts decimal32/decimal64 columns by value
(pyarrow cannot sort them by itself).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from sediment.errors import DiffOverflow

TIME = "time"
DIFF = "diff"
_TWO_63 = 1 << 63
_SPLIT = 31


def sort_keys(key_columns: Sequence[str], *, with_time: bool = True) -> list[tuple[str, str]]:
    """The sort order of every trace table: row columns ascending, then time, nulls last."""
    cols = list(key_columns) + ([TIME] if with_time else [])
    return [(c, "ascending") for c in cols]


def _sortable(col: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """``col`` as pyarrow sorts it by value: decimal32/decimal64 as decimal128 of the same
    precision and scale (exact). pyarrow 26 has no sort kernel for those two: alone they fail
    (ArrowNotImplementedError), and as one of several keys they sort by their bytes, not
    their value (-1.00 after 3.00), an order every comparison here disagrees with."""
    t = col.type
    if pa.types.is_decimal32(t) or pa.types.is_decimal64(t):
        return col.cast(pa.decimal128(t.precision, t.scale))
    return col


def sort_indices(data: pa.Table | pa.ChunkedArray | pa.Array,
                 order: Sequence[tuple[str, str]] | None = None) -> pa.Array:
    """``pc.sort_indices(data, order)`` in the trace's order for every column type the
    engine stores (see :func:`_sortable`); the one sort every trace table goes through."""
    if not isinstance(data, pa.Table):
        return pc.sort_indices(_sortable(data))
    names = {c for c, _ in order or ()}
    view = data
    for i, name in enumerate(data.column_names):
        if name in names:
            col = _sortable(data.column(i))
            if col.type != data.schema.field(i).type:
                view = view.set_column(i, name, col)
    return pc.sort_indices(view, list(order or ()))


def first_out_of_order(table: pa.Table, before: pa.Table | None = None) -> int | None:
    """The index of the first row of ``table`` (a stored batch's piece: its row columns, then
    ``time`` and ``diff``) that sorts before the row preceding it in the trace's order, or None
    when it is in order; ``before``: the last row of the previous piece, checked against the
    first. For ``sediment verify``: a batch out of order (written by a build whose sort
    disagreed with the comparisons, as decimal32/64 columns once did) breaks every merge."""
    data = pa.concat_tables([before, table]) if before is not None and before.num_rows else table
    shift = data.num_rows - table.num_rows
    if data.num_rows < 2:
        return None
    keys = [c for c in data.column_names if c not in (TIME, DIFF)]
    try:
        idx = sort_indices(data, sort_keys(keys))
    except pa.ArrowNotImplementedError:  # a type pyarrow cannot sort: nothing to compare with
        return None
    n = len(idx)
    if pc.all(pc.less(idx.slice(0, n - 1), idx.slice(1))).as_py():  # a permutation sorted ascending: the identity
        return None
    rank = pc.sort_indices(idx)  # each row's place in the sorted order (the stable sort keeps ties in place)
    descent = pc.less(rank.slice(1), rank.slice(0, n - 1))
    return max(0, int(pc.index(descent, True).as_py()) + 1 - shift)


RUN_SLICE_ROWS = 256  # mean length of in-order runs at which slices beat a gather


def sorted_table(table: pa.Table, order: Sequence[tuple[str, str]]) -> pa.Table:
    """``table.sort_by(order)``, without moving rows that are already in place.

    Appends usually arrive in order (fresh ids, a re-sent sorted batch), and a gather of
    wide columns is the costly half of a sort (1.6 s for 640 MB of 1 KiB payloads against
    8 ms for the sort itself). So the permutation is looked at first: the identity
    returns the table as it is, long in-order stretches become zero-copy slices, and only
    a scattered permutation pays for the gather, on combined chunks (a chunked gather costs
    about twice as much)."""
    if table.num_rows < 2:
        return table
    return permuted(table, sort_indices(table, order))


def permuted(table: pa.Table, indices: pa.Array) -> pa.Table:
    """``table.take(indices)`` for a permutation of its rows, by slices where it can."""
    n = len(indices)
    if n != table.num_rows or n < 2:
        return table.take(indices)
    signed = indices.cast(pa.int64())
    if n > _PROBE_ROWS and _breaks(signed.slice(0, _PROBE_ROWS)) * RUN_SLICE_ROWS > _PROBE_ROWS:
        return _gather(table, indices)  # scattered from the start (merged runs): no slices to find
    steps = pc.subtract(signed.slice(1), signed.slice(0, n - 1))
    breaks = pc.indices_nonzero(pc.not_equal(steps, 1))
    if not len(breaks) and indices[0].as_py() == 0:
        return table
    if (len(breaks) + 1) * RUN_SLICE_ROWS > n:
        return _gather(table, indices)
    starts = [0, *(b + 1 for b in breaks.to_pylist()), n]
    pieces = [table.slice(indices[a].as_py(), b - a) for a, b in zip(starts, starts[1:], strict=False)]
    return pa.concat_tables(pieces)


_PROBE_ROWS = 1 << 16


def _breaks(signed: pa.Array) -> int:
    """How many times a permutation's stretch does not continue by one."""
    n = len(signed)
    steps = pc.subtract(signed.slice(1), signed.slice(0, n - 1))
    return n - 1 - pc.sum(pc.equal(steps, 1)).as_py() if n > 1 else 0


def _gather(table: pa.Table, indices: pa.Array) -> pa.Table:
    cols = []
    for col in table.columns:
        if col.num_chunks > 1:
            with contextlib.suppress(pa.ArrowInvalid, pa.ArrowCapacityError):  # past 2 GiB: gather the chunks
                col = pa.chunked_array([pa.concat_arrays(col.chunks)], col.type)
        cols.append(pc.take(col, indices))
    return pa.Table.from_arrays(cols, schema=table.schema)


def _check_columns(table: pa.Table, key_columns: Sequence[str], *, need_time: bool = True) -> None:
    missing = [c for c in [*key_columns, *([TIME] if need_time else []), DIFF] if c not in table.column_names]
    if missing:
        raise ValueError(
            f"table lacks column(s) {missing}; it has {table.column_names}. Pass the row columns as "
            "key_columns and keep the 'time' and 'diff' columns."
        )
    if TIME in key_columns or DIFF in key_columns:
        raise ValueError(f"key_columns {list(key_columns)} must not include 'time' or 'diff'")


def advance_times(table: pa.Table, since: int | None) -> pa.Table:
    """``time := max(time, since)``: below ``since`` the exact time is no longer distinguishable.

    Order-preserving per row, so a table sorted by (row, time) stays sorted.
    """
    if since is None or table.num_rows == 0:
        return table
    idx = table.schema.get_field_index(TIME)
    advanced = pc.max_element_wise(table.column(idx), pa.scalar(since, pa.int64()))
    return table.set_column(idx, TIME, advanced.cast(pa.int64()))


def _same_as_previous(col: pa.ChunkedArray | pa.Array) -> pa.Array | pa.ChunkedArray:
    """For rows 1..n-1: is the value equal to the previous row's? NULL equals NULL, NaN equals NaN."""
    n = len(col)
    cur, prev = col.slice(1), col.slice(0, n - 1)
    if col.null_count == 0 and not pa.types.is_floating(col.type):
        return pc.equal(cur, prev)
    eq = pc.fill_null(pc.equal(cur, prev), False)
    eq = pc.or_(eq, pc.and_(pc.is_null(cur), pc.is_null(prev)))
    if pa.types.is_floating(col.type):
        both_nan = pc.and_(pc.fill_null(pc.is_nan(cur), False), pc.fill_null(pc.is_nan(prev), False))
        eq = pc.or_(eq, both_nan)
    return eq


def sum_sorted(table: pa.Table, group_cols: Sequence[str], *, drop_zeros: bool = True) -> pa.Table:
    """Sum ``diff`` over runs of equal ``group_cols`` in a table sorted by them; keeps the order.

    Works on adjacent runs (boundary mask, cumulative sum, take at run ends) rather
    than a hash ``group_by``, whose output order is not the input order even
    single-threaded. Sums are checked: a run whose diffs sum outside int64 raises
    DiffOverflow naming its row, never wraps. Output columns are ``group_cols + ["diff"]``.
    """
    cols = list(group_cols)
    n = table.num_rows
    if n == 0:
        return table.select([*cols, DIFF])
    same: pa.Array | pa.ChunkedArray | None = None
    for c in cols:
        eq = _same_as_previous(table.column(c))
        same = eq if same is None else pc.and_(same, eq)
        if not pc.any(same).as_py():  # no two neighbours agree on these columns: every row is its own run
            return _each_row_a_run(table, cols, drop_zeros)
    if same is None:
        is_end = pa.concat_arrays([pa.nulls(n - 1, pa.bool_()).fill_null(False), pa.array([True])])
    else:
        is_end = pa.concat_arrays([*_chunks(pc.invert(same)), pa.array([True])])
    ends = pc.indices_nonzero(is_end)
    diff = table.column(DIFF)
    if len(ends) == n:
        return _each_row_a_run(table, cols, drop_zeros)
    if cannot_overflow(diff, n):
        sums = _run_sums(diff, ends)
    else:
        sums = _run_sums_checked(table, cols, diff, ends)
    if drop_zeros:
        nonzero = pc.not_equal(sums, 0)
        if not pc.all(nonzero).as_py():
            ends, sums = ends.filter(nonzero), sums.filter(nonzero)
    return table.select(cols).take(ends).append_column(DIFF, sums)


def _each_row_a_run(table: pa.Table, cols: list[str], drop_zeros: bool) -> pa.Table:
    out = table.select([*cols, DIFF])
    return nonzero(out) if drop_zeros else out


def nonzero(table: pa.Table) -> pa.Table:
    """The rows with a non-zero diff; the table itself when all are (a filter copies every column)."""
    keep = pc.not_equal(table.column(DIFF), 0)
    return table if pc.all(keep).as_py() else table.filter(keep)


def cannot_overflow(diff: pa.ChunkedArray | pa.Array, n: int) -> bool:
    """True when no prefix sum of ``n`` diffs can leave int64: n * max|diff| < 2^63. One
    min/max pass; real diffs (small counts) always pass, so the exact path is rare."""
    lo, hi = pc.min_max(diff).values()
    lo, hi = lo.as_py(), hi.as_py()
    if lo is None:
        return True
    return max(abs(lo), abs(hi)) * n < _TWO_63


def _run_sums(diff: pa.ChunkedArray | pa.Array, ends: pa.Array) -> pa.Array:
    """Sum of each run ending at ``ends``, by a cumulative sum taken at run ends."""
    end_sums = pc.cumulative_sum(diff).take(ends)
    prev = pa.concat_arrays([pa.array([0], pa.int64()), *_chunks(end_sums.slice(0, len(end_sums) - 1))])
    return pc.subtract(end_sums, prev)


def _run_sums_checked(table: pa.Table, cols: list[str], diff: pa.ChunkedArray | pa.Array,
                      ends: pa.Array) -> pa.Array:
    """Exact run sums of large diffs: each diff split as ``hi * 2^31 + lo`` (``lo`` in
    [0, 2^31)), both halves summed in int64 (no overflow below 2^31 rows), carried, and the
    recombined sum range-checked before it is formed."""
    mask = (1 << _SPLIT) - 1
    hi = _run_sums(pc.shift_right(diff, _SPLIT), ends)
    lo = _run_sums(pc.bit_wise_and(diff, mask), ends)
    hi = pc.add(hi, pc.shift_right(lo, _SPLIT))
    lo = pc.bit_wise_and(lo, mask)
    bad = pc.or_(pc.less(hi, -(1 << (63 - _SPLIT))), pc.greater_equal(hi, 1 << (63 - _SPLIT)))
    where = pc.indices_nonzero(bad)
    if len(where):
        i = where[0].as_py()
        row = table.select(cols).slice(ends[i].as_py(), 1).to_pylist()[0]
        total = hi[i].as_py() * (1 << _SPLIT) + lo[i].as_py()
        raise DiffOverflow(
            f"the diffs of row {row} sum to {total}, outside int64 [-2**63, 2**63); nothing was summed. "
            "Append a compensating diff for that row (or find the writer that produced such diffs)",
            row=repr(row))
    return pc.add(pc.multiply(hi, 1 << _SPLIT), lo)


def _order_vs_previous(col: pa.ChunkedArray | pa.Array) -> tuple[pa.Array, pa.Array]:
    """For rows 1..n-1: (previous < current, previous == current) in sort order: numbers,
    then NaN, then NULL."""
    n = len(col)
    cur, prev = col.slice(1), col.slice(0, n - 1)
    cur_null, prev_null = pc.is_null(cur), pc.is_null(prev)
    lt = pc.fill_null(pc.less(prev, cur), False)
    eq = _same_as_previous(col)
    if pa.types.is_floating(col.type):
        cur_nan = pc.fill_null(pc.is_nan(cur), False)
        prev_nan = pc.fill_null(pc.is_nan(prev), False)
        lt = pc.and_(pc.or_(lt, pc.and_(cur_nan, pc.invert(prev_nan))), pc.invert(prev_nan))
    lt = pc.or_(pc.and_(lt, pc.invert(pc.or_(cur_null, prev_null))), pc.and_(cur_null, pc.invert(prev_null)))
    return lt, eq


def first_unsorted(table: pa.Table, columns: Sequence[str], *, strict: bool = True) -> int | None:
    """Index of the first row not after its predecessor in ``columns`` order (NULLs last),
    or None when sorted. ``strict`` also rejects equal neighbours (a consolidated table
    never has two rows with the same (row, time))."""
    n = table.num_rows
    if n < 2 or not columns:
        return None if n < 2 or not strict else 1
    ok: pa.Array | pa.ChunkedArray | None = None
    prefix_eq: pa.Array | pa.ChunkedArray | None = None
    for c in columns:
        lt, eq = _order_vs_previous(table.column(c))
        step = lt if prefix_eq is None else pc.and_(prefix_eq, lt)
        ok = step if ok is None else pc.or_(ok, step)
        prefix_eq = eq if prefix_eq is None else pc.and_(prefix_eq, eq)
        if not pc.any(prefix_eq).as_py():
            break  # no neighbours tie on these columns: later ones (a 1 KiB payload) cannot change the order
    if not strict:
        ok = pc.or_(ok, prefix_eq)
    bad = pc.indices_nonzero(pc.invert(ok))
    return None if len(bad) == 0 else bad[0].as_py() + 1


def _chunks(a: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    return list(a.chunks) if isinstance(a, pa.ChunkedArray) else [a]


def consolidate(
    table: pa.Table, key_columns: Sequence[str], since: int | None = None, *, presorted: bool = False
) -> pa.Table:
    """Advance times to ``since``, sum diffs of equal (row, time), drop zeros, sort by (row, time).

    Output columns are ``key_columns + ["time", "diff"]`` (other columns are dropped).
    ``presorted=True`` promises the input is already sorted by (row, time) and skips
    the sort; the merge uses it on chunks it has just sorted.
    """
    _check_columns(table, key_columns)
    cols = [*key_columns, TIME]
    table = advance_times(table.select([*cols, DIFF]), since)
    if not presorted:
        table = sorted_table(table, sort_keys(key_columns))
    return sum_sorted(table, cols)


def snapshot(table: pa.Table, key_columns: Sequence[str], as_of: int) -> pa.Table:
    """The collection as of ``as_of``: rows whose diffs at times <= as_of sum to non-zero.

    Columns ``key_columns + ["diff"]``, sorted by the row columns. A row with a total
    diff of 3 is present three times (multiset semantics); the caller decides whether
    to expand it.
    """
    _check_columns(table, key_columns)
    table = table.filter(pc.less_equal(table.column(TIME), pa.scalar(as_of, pa.int64())))
    table = sorted_table(table.select([*key_columns, DIFF]), sort_keys(key_columns, with_time=False))
    return sum_sorted(table, key_columns)


def changes(table: pa.Table, key_columns: Sequence[str], from_t: int, as_of: int) -> pa.Table:
    """The consolidated updates at times in ``(from_t, as_of]``: what a subscriber that has
    seen the collection as of ``from_t`` needs to reach ``as_of``. Sorted by (row, time)."""
    _check_columns(table, key_columns)
    t = table.column(TIME)
    mask = pc.and_(
        pc.greater(t, pa.scalar(from_t, pa.int64())), pc.less_equal(t, pa.scalar(as_of, pa.int64()))
    )
    return consolidate(table.filter(mask), key_columns)
