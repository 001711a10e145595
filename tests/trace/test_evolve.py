"""trace/evolve.py's Layout on its own: projection by field id of batches of any length,
reusing its column plan and default arrays across batches without mixing them up."""

from __future__ import annotations

import pyarrow as pa

from sediment.trace.evolve import KEEP_DEFAULT_ROWS, Layout, with_id

TAIL = [pa.field("time", pa.int64()), pa.field("diff", pa.int64())]
V0 = pa.schema([with_id(pa.field("k", pa.int32()), 1), with_id(pa.field("v", pa.string()), 2), *TAIL])
V1 = pa.schema([with_id(pa.field("k", pa.int64()), 1), with_id(pa.field("w", pa.string()), 2),
                with_id(pa.field("c", pa.int64()), 3), with_id(pa.field("n", pa.int32()), 4), *TAIL])


def _old(rows: int) -> pa.Table:
    return pa.Table.from_arrays([pa.array(range(rows), pa.int32()), pa.array(["x"] * rows),
                                 pa.array([1] * rows, pa.int64()), pa.array([1] * rows, pa.int64())], schema=V0)


def test_batches_of_growing_and_shrinking_length_read_their_defaults_and_casts():
    layout = Layout({0: V0, 1: V1}, 1, {3: pa.scalar(7, pa.int64())})
    for rows in (3, 70_000, 5, KEEP_DEFAULT_ROWS + 3, 2, 0):
        got = layout.project(_old(rows))
        assert got.schema.names == ["k", "w", "c", "n", "time", "diff"] and got.num_rows == rows
        assert got.column("k").type == pa.int64() and got.column("k").to_pylist() == list(range(rows))
        assert got.column("w").to_pylist() == ["x"] * rows
        assert got.column("c").to_pylist() == [7] * rows  # the default, as long as the batch
        assert got.column("n").null_count == rows
    assert layout.optional() == ["c", "n"]  # what an append may leave out: the added columns


def test_a_batch_already_in_the_current_version_and_an_older_target():
    layout = Layout({0: V0, 1: V1}, 1, {})
    current = layout.project(_old(4))
    again = layout.project(current.cast(V1))
    assert again.equals(current)
    back = layout.project(_old(2), to_version=0)
    assert back.schema.names == ["k", "v", "time", "diff"] and back.column("k").type == pa.int32()
