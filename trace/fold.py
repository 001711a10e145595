"""Consolidation for the compacter: the same answer as :func:`consolidate`, by a cheaper route
when the rows allow one.

A compaction pass consolidates everything it takes out of the WAL. The general route sorts
the whole table (copying every column, however wide) and then compares each column with
its neighbour. Two common shapes need much less:

- the same rows appended again and again (a counter, a re-sent batch): a hash aggregation
  over (row, time) sums them without sorting or copying the wide columns, and only the few
  distinct rows are sorted afterwards (chosen when the first key column repeats and a spread
  sample of rows has few distinct (row, time) values);
- rows that are all distinct (fresh ids): once sorted, no two neighbours share the first
  key column, so there is nothing to sum and no run detection to do.

Anything else (float or nested key columns, diffs that could overflow in a hash sum) takes
the general route, so the result, its order (nulls last) and its errors
(:class:`sediment.errors.DiffOverflow`) are :func:`consolidate`'s.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from sediment.trace.consolidate import (
    DIFF,
    TIME,
    advance_times,
    cannot_overflow,
    consolidate,
    nonzero,
    sort_keys,
    sorted_table,
)

REPEAT_SHARE = 0.5  # hash route when the first key column has fewer distinct values than this share of rows


def _plain(t: pa.DataType) -> bool:
    """Key types a hash aggregation groups exactly as the sort route does (NULL with NULL)."""
    return (pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_string(t) or
            pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t) or
            pa.types.is_fixed_size_binary(t) or pa.types.is_temporal(t) or pa.types.is_decimal(t))


def _ordered_type(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_temporal(t) or pa.types.is_string(t) or pa.types.is_binary(t)


def _increasing(col: pa.ChunkedArray) -> bool:
    """Whether every value is greater than the one before (no nulls): one pass of neighbour
    comparisons, where counting distinct values hashes every row (34 ms per pass of 100k-1M
    fresh ids, most of the fold)."""
    n = len(col)
    return not pc.any(pc.less_equal(col.slice(1), col.slice(0, n - 1))).as_py()


SAMPLE_ROWS = 1 << 14


def _few_groups(table: pa.Table, keys: list[str], n: int) -> bool:
    """Whether (row, time) likely takes fewer than ``HASH_GROUPS_SHARE * n`` distinct values,
    the shape where hashing beats sorting. The first key column repeating is necessary but not
    enough: a low-cardinality first column (a tenant, a region; or the same ids at many
    times) with distinct rows gave ~n groups, and the hash took 5.9 s where the sort takes
    1.4 s (10M rows). So the groups of a spread sample of rows decide, once the first column
    has passed, compared with what a sample of a table with that many groups would show.

    Past ``4 * SAMPLE_ROWS`` rows the first column is judged on the same sample: counting its
    distinct values over the whole table hashed every row, 68 ms per 1M fresh ids from four
    interleaved writers (where ``_increasing`` fails), a third of a compaction pass's CPU. A
    misjudged sample costs speed only: both routes give the same answer."""
    if n <= 4 * SAMPLE_ROWS:
        return pc.count_distinct(table.column(keys[0]), mode="all").as_py() < REPEAT_SHARE * n
    sample = _spread_sample(table.select([*keys, TIME]), SAMPLE_ROWS)
    m = sample.num_rows
    if pc.count_distinct(sample.column(keys[0]), mode="all").as_py() >= _expected_distinct(REPEAT_SHARE * n, m, n):
        return False
    seen = sample.group_by([*keys, TIME], use_threads=False).aggregate([]).num_rows
    return seen < _expected_distinct(HASH_GROUPS_SHARE * n, m, n)


SAMPLE_CHUNKS = 64
_STEP = 2654435761  # prime: j * step mod m visits distinct rows spread over a chunk of m rows


def _spread_sample(table: pa.Table, rows: int) -> pa.Table:
    """About ``rows`` rows spread over the table, taken chunk by chunk: a take across the
    chunks of a binary column first concatenates them all (0.05-0.5 s for 600 MB of 1 KiB
    rows in 60 chunks, against 7 ms for the hash that follows). Of more than
    ``SAMPLE_CHUNKS`` chunks, those holding ``SAMPLE_CHUNKS`` evenly spaced rows are taken
    from: a take costs about 10 us however few rows it takes, and a pass of 1,000-row
    records has a thousand chunks per million rows."""
    batches = table.to_batches()
    if len(batches) > SAMPLE_CHUNKS:
        ends = list(itertools.accumulate(b.num_rows for b in batches))
        n = ends[-1]
        picked = sorted({bisect.bisect_right(ends, (2 * i + 1) * n // (2 * SAMPLE_CHUNKS))
                         for i in range(SAMPLE_CHUNKS)})
        batches = [batches[i] for i in picked]
    n = sum(b.num_rows for b in batches)
    parts = []
    for batch in batches:
        m = batch.num_rows
        k = min(m, max(1, round(rows * m / n)))
        parts.append(batch.take(pa.array([(j * _STEP) % m for j in range(k)], pa.int64())))
    return pa.Table.from_batches(parts, schema=table.schema)


HASH_GROUPS_SHARE = 0.25  # hash when (row, time) takes fewer distinct values than this share of rows


def _expected_distinct(groups: float, sample: int, n: int) -> float:
    """Distinct values expected in ``sample`` of ``n`` rows holding ``groups`` equal-sized
    groups (increasing in ``groups``): fewer seen than for ``groups`` means fewer groups. A
    plain share of the sample misjudged a counter: 10k distinct rows in 70k are 8.4k of a
    16k sample, which looked like half distinct."""
    return groups * (1.0 - (1.0 - sample / n) ** (n / groups))


def fold(table: pa.Table, key_columns: Sequence[str], since: int | None = None) -> pa.Table:
    """``consolidate(table, key_columns, since)``: times advanced to ``since``, diffs of equal
    (row, time) summed, zeros dropped, sorted by (row, time); columns keys + time + diff."""
    keys = list(key_columns)
    n = table.num_rows
    if not keys or n < 2 or not all(_plain(table.schema.field(k).type) for k in keys):
        return consolidate(table, keys, since)
    table = advance_times(table.select([*keys, TIME, DIFF]), since)
    first = table.column(keys[0])
    if first.null_count == 0 and _ordered_type(first.type) and _increasing(first):
        return nonzero(table)  # fresh ids in order: sorted and distinct as it is, no hash and no sort
    if cannot_overflow(table.column(DIFF), n) and _few_groups(table, keys, n):
        grouped = table.group_by([*keys, TIME], use_threads=False).aggregate([(DIFF, "sum")])
        out = grouped.select([*keys, TIME]).append_column(DIFF, grouped.column(f"{DIFF}_sum"))
        return nonzero(sorted_table(out, sort_keys(keys)))
    table = sorted_table(table, sort_keys(keys))
    if first.null_count == 0:
        first = table.column(keys[0])
        if not pc.any(pc.equal(first.slice(1), first.slice(0, n - 1))).as_py():
            return nonzero(table)
    return consolidate(table, keys, None, presorted=True)
