"""Consolidation of ``(row, time, diff)`` updates, with pyarrow compute kernels only.

Every trace operation reduces to one idea from differential dataflow: updates to the
same row at the same (possibly advanced) time can be summed, and a zero sum is no
update at all. Storage stays proportional to the distinct rows once ``since`` moves.

Tables here have the relation's row columns plus ``time`` (int64) and ``diff`` (int64).
``key_columns`` names the row columns (all of them: a row's identity is its whole
value). NULLs in a key column group together as one value and sort last, as
pyarrow's ``sort_by`` places them; :mod:`sediment.trace.merge` relies on the same
order, so every sorted table in a trace is sorted by these functions' rules.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

TIME = "time"
DIFF = "diff"


def sort_keys(key_columns: Sequence[str], *, with_time: bool = True) -> list[tuple[str, str]]:
    """The sort order of every trace table: row columns ascending, then time, nulls last."""
    cols = list(key_columns) + ([TIME] if with_time else [])
    return [(c, "ascending") for c in cols]


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


def _sum_sorted(table: pa.Table, group_cols: list[str]) -> pa.Table:
    """Group a table already sorted by ``group_cols``, sum ``diff``, drop zero sums.

    Single-threaded ``group_by`` emits groups in order of first appearance, so the
    output keeps the input's order without another sort (and is ~2x faster).
    """
    grouped = table.select([*group_cols, DIFF]).group_by(group_cols, use_threads=False).aggregate(
        [(DIFF, "sum")]
    )
    grouped = grouped.rename_columns([*group_cols, DIFF])
    return grouped.filter(pc.not_equal(grouped.column(DIFF), 0))


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
        table = table.sort_by(sort_keys(key_columns))
    return _sum_sorted(table, cols)


def snapshot(table: pa.Table, key_columns: Sequence[str], as_of: int) -> pa.Table:
    """The collection as of ``as_of``: rows whose diffs at times <= as_of sum to non-zero.

    Columns ``key_columns + ["diff"]``, sorted by the row columns. A row with a total
    diff of 3 is present three times (multiset semantics); the caller decides whether
    to expand it.
    """
    _check_columns(table, key_columns)
    table = table.filter(pc.less_equal(table.column(TIME), pa.scalar(as_of, pa.int64())))
    table = table.select([*key_columns, DIFF]).sort_by(sort_keys(key_columns, with_time=False))
    return _sum_sorted(table, list(key_columns))


def changes(table: pa.Table, key_columns: Sequence[str], from_t: int, as_of: int) -> pa.Table:
    """The consolidated updates at times in ``(from_t, as_of]``: what a subscriber that has
    seen the collection as of ``from_t`` needs to reach ``as_of``. Sorted by (row, time)."""
    _check_columns(table, key_columns)
    t = table.column(TIME)
    mask = pc.and_(
        pc.greater(t, pa.scalar(from_t, pa.int64())), pc.less_equal(t, pa.scalar(as_of, pa.int64()))
    )
    return consolidate(table.filter(mask), key_columns)
