"""A raw run read in bounded memory: an external sort of its pieces.

Why: a raw run (trace/raw.py) is a bulk load's file in its writer's order. Consolidating it
whole held about 11x the file's size (2M shuffled rows: 382 MB for 33 MB), past the merge's
``memory_bound``, in every read until the merge task rewrote it, and in that merge too. So a
raw run larger than the reader's budget is read ``budget`` rows at a time; each piece is
consolidated into a sorted run (:func:`sediment.trace.raw.raw_run`) and spilled to a local
file, and the spilled runs are merged by the merge of sorted runs (trace/merge.py), each
holding about ``budget / pieces`` rows at a time. A file whose first key column increases
throughout (a frame written in key order) needs no spill: a pass over that column alone says
so, and its pieces then stream out in order as they are consolidated.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sediment.errors import BatchCorruption
from sediment.trace.batch import BatchDescription
from sediment.trace.merge import merge_sorted
from sediment.trace.parquet_layout import write_batch_rows
from sediment.trace.raw import RAW_FIELDS, raw_run

MIN_ROWS = 1024
FAN_IN = 8  # spilled runs merged at once
WORK_FACTOR = 8  # a piece's decoded bytes to the peak of consolidating it (copies, sort indices, sums)
_DECODE_ERRORS = (OSError, pa.ArrowException, ValueError)


def budget_rows(pf: pq.ParquetFile, memory: int, where: str) -> int:
    """Rows of a raw file consolidated at once within ``memory`` bytes (plus the constant time
    and diff a reader adds), by the larger of two sizes per row: the footer's uncompressed
    sizes, and the decoded size of the first rows (a dictionary-encoded column's pages are
    its codes, several times smaller than the values it decodes to)."""
    meta = pf.metadata
    size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    per_row = 16 + size // max(1, meta.num_rows)
    if meta.num_rows > MIN_ROWS:
        sample = next(_pieces(pf, MIN_ROWS, where), None)
        if sample is not None and sample.num_rows:
            per_row = max(per_row, 16 + sample.nbytes // sample.num_rows)
    return max(MIN_ROWS, memory // (WORK_FACTOR * per_row))


def sorted_raw(pf: pq.ParquetFile, desc: BatchDescription, schema: pa.Schema, *, memory: int,
               spill: Callable[[], str], where: str) -> Iterator[pa.Table]:
    """The raw run ``pf`` (opened and checked, described by ``desc``) as consolidated tables in
    ``schema``'s columns, strictly increasing in (row, time) across tables, holding about
    ``memory`` bytes; ``spill()`` names a fresh local file for a sorted piece (deleted here)."""
    budget = budget_rows(pf, memory, where)
    keys = [n for n in schema.names if n not in RAW_FIELDS]
    if pf.metadata.num_rows <= budget:
        try:
            whole = pf.read(use_threads=True)
        except _DECODE_ERRORS as e:
            raise BatchCorruption(f"{where}: fails to decode or its page checksum ({e}); the object is damaged") from e
        run = _checked(raw_run(whole, desc, schema), desc, where)
        yield from (run,) if run.num_rows else ()
        return
    if _increasing(pf, keys[0], budget, where):
        yield from (r for r in (_checked(raw_run(p, desc, schema), desc, where) for p in _pieces(pf, budget, where))
                    if r.num_rows)
        return
    made: list[str] = []  # every spill file, deleted at the end whatever happens

    def fresh() -> str:
        made.append(spill())
        return made[-1]

    try:
        runs = _spill_pieces(pf, desc, schema, budget, fresh, where)
        while len(runs) > FAN_IN:  # the merge of runs compares per run and round: merge a few at a time
            merged = (_merge_to_file(runs[i:i + FAN_IN], keys, budget, fresh) for i in range(0, len(runs), FAN_IN))
            runs = [r for r in merged if r is not None]
        chunk = max(MIN_ROWS, budget // max(1, len(runs)))
        yield from merge_sorted([_spilled(p, chunk) for p in runs], keys, None, chunk)
    finally:
        for path in made:
            if os.path.exists(path):
                os.unlink(path)


def _spill_pieces(pf: pq.ParquetFile, desc: BatchDescription, schema: pa.Schema, budget: int,
                  spill: Callable[[], str], where: str) -> list[str]:
    """Each piece of ``budget`` rows consolidated and written to a fresh spill file."""
    paths = []
    for piece in _pieces(pf, budget, where):
        run = _checked(raw_run(piece, desc, schema), desc, where)
        if run.num_rows:
            paths.append(spill())
            pq.write_table(run, paths[-1], row_group_size=max(MIN_ROWS, budget // FAN_IN), compression="none",
                           write_batch_size=write_batch_rows(run))
    return paths


def _merge_to_file(runs: list[str], keys: list[str], budget: int, spill: Callable[[], str]) -> str | None:
    """Spilled runs merged into one spill file (the inputs deleted), holding about ``budget``
    rows; None when they cancel out (every key's diffs summing to 0): no file."""
    if len(runs) == 1:
        return runs[0]
    chunk = max(MIN_ROWS, budget // len(runs))
    path, writer = spill(), None
    try:
        for table in merge_sorted([_spilled(p, chunk) for p in runs], keys, None, chunk):
            writer = writer or pq.ParquetWriter(path, table.schema, compression="none",
                                                write_batch_size=write_batch_rows(table))
            writer.write_table(table, row_group_size=chunk)
    finally:
        if writer is not None:
            writer.close()
    for p in runs:
        os.unlink(p)
    return path if writer is not None else None


def stored_pieces(pf: pq.ParquetFile, desc: BatchDescription, *, memory: int, where: str) -> Iterator[pa.Table]:
    """The raw run ``pf``'s rows as written (verify counts and checks them), a budget of rows
    at a time, page checksums and times checked."""
    for piece in _pieces(pf, budget_rows(pf, memory, where), where):
        yield _checked(piece, desc, where) if "time" in piece.column_names else piece


def _pieces(pf: pq.ParquetFile, rows: int, where: str, columns: list[str] | None = None) -> Iterator[pa.Table]:
    try:
        for batch in pf.iter_batches(batch_size=rows, columns=columns, use_threads=False):
            yield pa.Table.from_batches([batch])
    except _DECODE_ERRORS as e:
        raise BatchCorruption(f"{where}: fails to decode or its page checksum ({e}); the object is damaged") from e


def _increasing(pf: pq.ParquetFile, column: str, rows: int, where: str) -> bool:
    """Whether ``column`` has no null and increases strictly through the file (read alone)."""
    t = pf.schema_arrow.field(column).type
    if not (pa.types.is_integer(t) or pa.types.is_temporal(t) or pa.types.is_string(t) or pa.types.is_binary(t)):
        return False
    last = None
    for piece in _pieces(pf, rows, where, [column]):
        col = piece.column(0)
        if col.null_count or (last is not None and not pc.greater(col[0], last).as_py()):
            return False
        if len(col) > 1 and pc.any(pc.less_equal(col.slice(1), col.slice(0, len(col) - 1))).as_py():
            return False
        last = col[len(col) - 1]
    return True


def _checked(run: pa.Table, desc: BatchDescription, where: str) -> pa.Table:
    """``run`` once its times lie in the batch's interval (none null), as any row group's must."""
    if run.num_rows:
        lo, hi = (v.as_py() for v in pc.min_max(run.column("time")).values())
        if run.column("time").null_count or lo < desc.lower or hi >= desc.upper:
            raise BatchCorruption(f"{where}: times span [{lo}, {hi}] but must lie in [{desc.min_time}, "
                                  f"{desc.max_time}]; the object is damaged")
    return run


def _spilled(path: str, rows: int) -> Iterator[pa.Table]:
    pf = pq.ParquetFile(pa.memory_map(path))  # mapped: Parquet reads a column chunk whole
    for batch in pf.iter_batches(batch_size=rows, use_threads=False):
        yield pa.Table.from_batches([batch])
