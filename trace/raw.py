"""Raw runs: a bulk load's Parquet file kept as its writer wrote it (batch format version 2).

Why: rewriting a load's rows costs more than writing them (any projection over a cached frame
cost Spark's writer 0.75x of ``df.write.parquet``; a sort far more). A raw run is the
writer's file with a sediment footer: the relation's columns in any order and nullability,
rows in any order, (row, time) may repeat, and a load's one ``time`` and ``diff`` in the
footer's description (and the trace state's ref) instead of columns when the file has none.
Readers conform it with :func:`raw_updates` and consolidate it; background compaction rewrites
it as a sorted run (engine/compaction.py).
"""

from __future__ import annotations

import pyarrow as pa

from sediment.errors import TraceError
from sediment.trace.fold import fold

FORMAT_VERSION = 1  # a batch: sorted and consolidated, in the relation's update schema
RAW_VERSION = 2  # a raw run
RAW_FIELDS = ("time", "diff")  # a description's fields only a raw run's footer carries
_INT64 = 1 << 63


def check_constants(version: int, time: int | None, diff: int | None, lo: int, hi: int, where: str) -> None:
    """A description's version and constants: only a raw run has them; a constant time lies
    in the batch's ``[lo, hi]``, a constant diff is a non-zero int64."""
    if version not in (FORMAT_VERSION, RAW_VERSION):
        raise TraceError(f"{where}: format_version {version} is not {FORMAT_VERSION} or {RAW_VERSION}")
    if version == FORMAT_VERSION and (time is not None or diff is not None):
        raise TraceError(f"{where}: a version {FORMAT_VERSION} batch has no constant time or diff")
    if time is not None and (not isinstance(time, int) or not lo <= time <= hi):
        raise TraceError(f"{where}: constant time {time!r} must lie in [{lo}, {hi}]")
    if diff is not None and (not isinstance(diff, int) or isinstance(diff, bool) or not 0 < abs(diff) < _INT64):
        raise TraceError(f"{where}: constant diff {diff!r} must be a non-zero int64")


def raw_matches(stored: pa.Schema, expected: pa.Schema | tuple[pa.Schema, ...], time: int | None,
                diff: int | None) -> bool:
    """Whether a raw file's schema holds one expected schema's columns (by name and type, in
    any order and nullability), with ``time``/``diff`` columns (int64) exactly when no
    constant is given for them."""
    got = {f.name: f.type for f in stored}
    for name, constant in (("time", time), ("diff", diff)):
        if (name in got) == (constant is not None) or got.pop(name, pa.int64()) != pa.int64():
            return False
    if len(got) != len(stored.names) - (time is None) - (diff is None):
        return False  # a name repeats
    return any(got == {f.name: f.type for f in e if f.name not in ("time", "diff")}
               for e in (expected if isinstance(expected, tuple) else (expected,)))


def footer_matches(stored: pa.Schema, expected: pa.Schema | tuple[pa.Schema, ...], desc: object) -> bool:
    """Whether a footer's schema is the expected one (or one of them: a relation's schema
    versions), field ids and other metadata aside; for a raw run (``desc``, a
    BatchDescription, of version 2) by :func:`raw_matches`."""
    if getattr(desc, "format_version", FORMAT_VERSION) == RAW_VERSION:
        return raw_matches(stored, expected, desc.time, desc.diff)
    return any(stored.equals(e) for e in (expected if isinstance(expected, tuple) else (expected,)))


def raw_updates(table: pa.Table, desc: object, schema: pa.Schema | None = None) -> pa.Table:
    """A raw file's rows as updates: the constant ``time``/``diff`` of ``desc`` (a
    BatchDescription) as columns, every column nullable, in ``schema``'s order and types when
    given (else the file's order, then time and diff). Not consolidated: the caller sorts and
    sums (trace/fold.py)."""
    n = table.num_rows
    data = [f for f in table.schema if f.name not in ("time", "diff")]
    cols = {f.name: table.column(f.name) for f in data}
    for name in ("time", "diff"):
        constant = getattr(desc, name)
        cols[name] = table.column(name) if constant is None else pa.repeat(pa.scalar(constant, pa.int64()), n)
    if schema is None:
        schema = pa.schema([*(f.with_nullable(True).remove_metadata() for f in data),
                            pa.field("time", pa.int64()), pa.field("diff", pa.int64())])
    return pa.Table.from_arrays([cols[f.name].cast(f.type) for f in schema], schema=schema)


def raw_run(table: pa.Table, desc: object, schema: pa.Schema | None = None) -> pa.Table:
    """A raw file's rows (or a piece of them) as a sorted, consolidated run: :func:`raw_updates`
    then :func:`sediment.trace.fold.fold` by every column but time and diff. The one route for
    reads, merges and a bulk load's rewrite, so they cannot disagree on the order or the sums."""
    updates = raw_updates(table, desc, schema)
    return fold(updates, [n for n in updates.column_names if n not in RAW_FIELDS])
