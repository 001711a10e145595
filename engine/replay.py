"""Time-ordered replay of stored updates in bounded memory.

Records (and batches) each cover a time range ``[t_lo, t_hi]``, but arrive in log
order. A sweep over time loads a record only when the sweep reaches its ``t_lo``
and emits rows strictly below the next unloaded record's ``t_lo``, so memory holds
just the records whose ranges overlap the current time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc


class Ranged(Protocol):
    t_lo: int
    t_hi: int


def time_ordered(
    items: Sequence[Ranged],
    load: Callable[[Ranged], pa.Table],
    schema: pa.Schema,
    batch_rows: int = 65536,
) -> Iterator[pa.RecordBatch]:
    """Yield every row of every item, ordered by ``time``, in batches of <= ``batch_rows``."""
    pending = sorted(items, key=lambda e: e.t_lo)
    active: list[pa.Table] = []
    i = 0
    while i < len(pending) or active:
        if not active:
            boundary_lo = pending[i].t_lo
            while i < len(pending) and pending[i].t_lo == boundary_lo:
                active.append(load(pending[i]))
                i += 1
        boundary = pending[i].t_lo if i < len(pending) else None
        take, keep = [], []
        for table in active:
            if boundary is None:
                take.append(table)
                continue
            below = pc.less(table.column("time"), boundary)
            take.append(table.filter(below))
            rest = table.filter(pc.invert(below))
            if rest.num_rows:
                keep.append(rest)
        out = pa.concat_tables(take) if take else None
        if out is not None and out.num_rows > 1:
            lo, hi = pc.min_max(out.column("time")).values()
            if lo != hi:  # one time only (say, all advanced to since): already in order
                out = out.sort_by([("time", "ascending")])
        if out is not None and out.num_rows:
            yield from out.cast(schema).to_batches(max_chunksize=batch_rows)
        active = keep
        if boundary is not None:
            while i < len(pending) and pending[i].t_lo == boundary:
                active.append(load(pending[i]))
                i += 1
