"""Joinable appends that leave their body to the group's leader (``submit_joinable`` with a
table, wal/group_records.py): a run of them is one record with one plain body of all their
rows in queue order, an append alone gets its own body, runs break where body-carrying runs
do, a run whose encoded body would pass its cap is written one by one, and a malformed
submission is refused with nothing queued."""

from __future__ import annotations

import pyarrow as pa
import pytest
from support.joined_runs import UPDATES, Calls
from support.joined_runs import ids_of as _ids

from sediment.arrow_codec import encode_updates, is_group_body
from sediment.errors import InvalidArgument
from sediment.wal.file_log import FileLog
from sediment.wal.record import Record, RecordKind


def _table(*ids: int, t: int = 1) -> pa.Table:
    return pa.table([pa.array(ids, pa.int64()), pa.array([t] * len(ids), pa.int64()),
                     pa.array([1] * len(ids), pa.int64())], schema=UPDATES)


def _submit(log: FileLog, calls, *ids: int, rel: int = 1, version: int = 0, cap: int = 1 << 20,
            size: int = 1024, t: int = 1):
    record = Record(RecordKind.UPDATES, rel, 0, t, t, len(ids), b"", schema_version=version)
    return log.submit_joinable(record, calls, cap, _table(*ids, t=t), size)


def test_a_run_of_tables_is_one_plain_body_of_their_rows_in_queue_order(tmp_path):
    log = FileLog.open(str(tmp_path), create=True)
    calls = Calls()
    tickets = [_submit(log, calls, 0), _submit(log, calls, 1, 2), _submit(log, calls, 3, t=5), _submit(log, calls, 4)]
    assert tickets[-1].wait() == 0  # its waiter leads and takes the whole queue: one group
    assert [t.wait() for t in tickets] == [0] * 4
    (one,), = calls.got
    assert (one.count, one.appends, one.txn_id, one.t_lo, one.t_hi) == (5, 4, 0, 1, 5)
    assert not is_group_body(one.body) and _ids(one.body) == [0, 1, 2, 3, 4]
    log.close()
    again = FileLog.open(str(tmp_path))
    (stored,) = list(again.scan())  # the frame's CRC is the encoded body's
    assert stored.count == 5 and bytes(stored.body) == bytes(one.body)
    again.close()


def test_a_table_append_alone_is_written_as_its_own_body(tmp_path):
    log = FileLog.open(str(tmp_path), create=True)
    calls = Calls()
    assert _submit(log, calls, 7, 8).wait() == 0
    (one,), = calls.got
    assert one.appends == 1 and one.count == 2 and _ids(one.body) == [7, 8]
    assert bytes(one.body) == encode_updates(_table(7, 8).to_batches()[0]).to_pybytes()
    log.close()
    again = FileLog.open(str(tmp_path))
    assert [_ids(r.body) for r in again.scan()] == [[7, 8]]
    again.close()


def test_runs_of_tables_break_at_relations_versions_and_other_appends(tmp_path):
    log = FileLog.open(str(tmp_path), create=True)
    calls = Calls()
    body = Record(RecordKind.UPDATES, 1, 0, 1, 1, 1, encode_updates(_table(4).to_batches()[0]).to_pybytes())
    tickets = [_submit(log, calls, 0), _submit(log, calls, 1),
               _submit(log, calls, 2, rel=2),  # another relation: alone
               _submit(log, calls, 3), log.submit_joinable(body, calls),  # a body-carrying append ends the run
               _submit(log, calls, 5, version=1), _submit(log, calls, 6)]  # another schema version, then alone
    tickets[-1].wait()
    assert [t.wait() for t in tickets] == [0, 0, 1, 2, 3, 4, 5]
    (written,) = calls.got
    assert [(r.relation_id, r.schema_version, r.count, r.appends) for r in written] == [
        (1, 0, 2, 2), (2, 0, 1, 1), (1, 0, 1, 1), (1, 0, 1, 1), (1, 1, 1, 1), (1, 0, 1, 1)]
    assert [_ids(r.body) for r in written] == [[0, 1], [2], [3], [4], [5], [6]]
    assert not any(is_group_body(r.body) for r in written)
    log.close()


def test_a_run_whose_body_would_pass_its_cap_is_written_one_by_one(tmp_path):
    log = FileLog.open(str(tmp_path), create=True)
    calls = Calls()
    alone = len(encode_updates(_table(0).to_batches()[0]))
    cap = alone + 8  # each body fits; the run's joined body does not, though its bounds said it would
    tickets = [_submit(log, calls, k, cap=cap, size=1) for k in range(3)]
    tickets[-1].wait()
    (written,) = calls.got
    assert [(r.count, r.appends, _ids(r.body)) for r in written] == [(1, 1, [0]), (1, 1, [1]), (1, 1, [2])]
    assert [t.wait() for t in tickets] == [0, 1, 2]
    log.close()


@pytest.mark.parametrize("change", ["body", "txn", "kind", "size"])
def test_a_table_with_a_body_a_transaction_or_no_size_bound_is_refused(tmp_path, change):
    log = FileLog.open(str(tmp_path), create=True)
    record = Record(RecordKind.UPDATES, 1, 0, 1, 1, 1, b"")
    size = 1024
    if change == "body":
        record.body = encode_updates(_table(0).to_batches()[0]).to_pybytes()
    elif change == "txn":
        record.txn_id = 3
    elif change == "kind":
        record.kind = RecordKind.PROGRESS
    else:
        size = 0
    with pytest.raises(InvalidArgument, match="nothing was appended"):
        log.submit_joinable(record, None, 1 << 20, _table(0), size)
    assert _submit(log, None, 9).wait() == 0  # nothing was queued before it
    assert [_ids(r.body) for r in log.scan()] == [[9]]
    log.close()
