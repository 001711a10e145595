"""``sediment verify`` finds a batch whose rows are out of the trace's order.

Such a batch has valid checksums (it was written so), reads back whole, and only a merge
of it fails; an earlier build wrote them when pyarrow sorted decimal32/64 key columns by
their bytes. The check compares each piece of a batch, and the row before it, with the
trace's own sort."""

from __future__ import annotations

import pyarrow as pa
import pytest

import sediment
from sediment.engine.verify import verify_data_dir
from sediment.trace import fold
from sediment.trace.consolidate import first_out_of_order


def table(ids: list[int], times: list[int] | None = None) -> pa.Table:
    times = times or [1] * len(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "time": pa.array(times, pa.int64()),
                     "diff": pa.array([1] * len(ids), pa.int64())})


def test_first_out_of_order_finds_the_first_row_that_sorts_before_the_one_ahead():
    assert first_out_of_order(table([1, 2, 3])) is None
    assert first_out_of_order(table([1, 1, 2], [1, 2, 1])) is None  # by row, then time
    assert first_out_of_order(table([1, 3, 2, 4])) == 2
    assert first_out_of_order(table([1, 1], [2, 1])) == 1  # the time decides within a row
    assert first_out_of_order(table([5, 6]), before=table([4])) is None
    assert first_out_of_order(table([5, 6]), before=table([7])) == 0  # across the pieces' boundary
    assert first_out_of_order(table([])) is None and first_out_of_order(table([9]), before=table([])) is None


def test_verify_reports_a_batch_written_out_of_order(tmp_path, monkeypatch):
    data = tmp_path / "d"
    with sediment.open(data, compact_interval=None) as eng:
        eng.add_relation("r", pa.schema([("id", pa.int64())]))
        eng.append("r", table([3, 1, 2]))
        eng.seal("r", 1)
        with monkeypatch.context() as m:  # the sort a faulty build had: rows kept as they came
            m.setattr(fold, "sorted_table", lambda t, _order: t)
            eng.compact()
    report = verify_data_dir(str(data))
    assert any("out of the trace's order" in p and "row 1 " in p for p in report.problems), report.problems


@pytest.mark.parametrize("ids", [[3, 1, 2], [1, 2, 3]])
def test_verify_says_nothing_of_batches_in_order(tmp_path, ids):
    data = tmp_path / "d"
    with sediment.open(data, compact_interval=None) as eng:
        eng.add_relation("r", pa.schema([("id", pa.int64())]))
        eng.append("r", table(ids))
        eng.seal("r", 1)
        eng.compact()
    assert verify_data_dir(str(data)).problems == []
