"""A group's joinable small appends written as one record (wal/group_records.py): one frame
whose group body holds their bodies in queue order, one ``on_durable`` call, the joined LSN on
every ticket; runs break at anything else; the record torn at any byte or damaged at any byte
is cut whole or refused with a typed error, never read in part."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pyarrow as pa
import pytest
from support.joined_runs import UPDATES, Calls
from support.joined_runs import ids_of as _ids

from sediment.arrow_codec import GROUP_HEADER, GROUP_MAGIC, encode_updates, join_updates
from sediment.errors import WalCorruption
from sediment.wal import segment as sg
from sediment.wal.file_log import FileLog
from sediment.wal.record import Record, RecordKind

SMALL = 1 << 14


def _record(k: int, rel: int = 1, version: int = 0, t: int | None = None) -> Record:
    t = k if t is None else t
    batch = pa.record_batch([pa.array([k], pa.int64()), pa.array([t], pa.int64()), pa.array([1], pa.int64())],
                            schema=UPDATES)
    return Record(RecordKind.UPDATES, rel, 0, t, t, 1, encode_updates(batch).to_pybytes(), schema_version=version)


def test_queued_joinable_appends_become_one_record_in_queue_order(tmp_path):
    log = FileLog.open(str(tmp_path), create=True)
    calls = Calls()
    tickets = [log.submit_joinable(_record(k, t=10 - k), calls) for k in range(5)]
    assert tickets[-1].wait() == 0  # its waiter leads and takes the whole queue: one group
    assert [t.wait() for t in tickets] == [0] * 5
    (one,), = calls.got  # one call, one record
    assert one.kind == RecordKind.UPDATES and one.count == 5 and one.appends == 5 and one.txn_id == 0
    assert (one.t_lo, one.t_hi) == (6, 10)
    assert bytes(one.body[:4]) == GROUP_MAGIC
    assert _ids(one.body) == [0, 1, 2, 3, 4]
    assert log.end_lsn == 1
    log.close()
    again = FileLog.open(str(tmp_path))
    (stored,) = list(again.scan())
    assert stored.count == 5 and _ids(stored.body) == [0, 1, 2, 3, 4] and stored.body == one.body
    again.close()


def test_a_joined_record_stays_within_the_body_size_it_is_given(tmp_path):
    log = FileLog.open(str(tmp_path), create=True)
    calls = Calls()
    size = len(_record(0).body)
    cap = GROUP_HEADER.size + 3 * size  # three bodies fit, a fourth does not
    tickets = [log.submit_joinable(_record(k), calls, cap) for k in range(8)]
    tickets[-1].wait()
    (records,) = calls.got
    assert [r.appends for r in records] == [3, 3, 2]
    assert all(len(r.body) <= cap for r in records)
    assert [i for r in records for i in _ids(r.body)] == list(range(8))
    log.close()


def test_runs_break_at_other_relations_versions_and_plain_appends(tmp_path):
    log = FileLog.open(str(tmp_path), create=True)
    calls = Calls()
    tickets = [log.submit_joinable(_record(0), calls), log.submit_joinable(_record(1), calls),
               log.submit_joinable(_record(2, rel=2), calls),  # another relation
               log.submit([_record(3)], calls),  # not joinable: its own record, and it ends the run
               log.submit_joinable(_record(4), calls), log.submit_joinable(_record(5), calls),
               log.submit_joinable(_record(6, version=1), calls),  # another schema version
               log.submit_joinable(_record(7), calls)]  # alone after it
    tickets[-1].wait()
    assert [t.wait() for t in tickets] == [0, 0, 1, 2, 3, 3, 4, 5]
    (written,) = calls.got
    assert [(r.relation_id, r.schema_version, r.count, r.appends) for r in written] == [
        (1, 0, 2, 2), (2, 0, 1, 1), (1, 0, 1, 1), (1, 0, 2, 2), (1, 1, 1, 1), (1, 0, 1, 1)]
    assert [_ids(r.body) for r in written] == [[0, 1], [2], [3], [4, 5], [6], [7]]
    assert [bytes(r.body[:4]) == GROUP_MAGIC for r in written] == [True, False, False, True, False, False]
    assert [r.lsn for r in written] == list(range(6))
    log.close()


def test_a_transaction_record_or_a_group_body_is_never_joined(tmp_path):
    log = FileLog.open(str(tmp_path), create=True)
    r = _record(1)
    r.txn_id = 9
    group = Record(RecordKind.UPDATES, 1, 0, 3, 4, 2, join_updates([_record(3).body, _record(4).body]))
    tickets = [log.submit_joinable(_record(0)), log.submit_joinable(r), log.submit_joinable(_record(2)),
               log.submit_joinable(group), log.submit_joinable(_record(5))]
    tickets[-1].wait()
    assert [(x.txn_id, x.count) for x in log.scan()] == [(0, 1), (9, 1), (0, 1), (0, 2), (0, 1)]
    assert [_ids(x.body) for x in log.scan()] == [[0], [1], [2], [3, 4], [5]]
    log.close()


def _log_with_group_last(root: str) -> tuple[list[bytes], bytes]:
    """Two plain records, then one joined record of three appends, as a crash leaves it."""
    live = root + "-live"
    log = FileLog.open(live, segment_bytes=SMALL, create=True)
    log.append([_record(100)])
    log.append([_record(101)])
    tickets = [log.submit_joinable(_record(k)) for k in range(3)]
    tickets[-1].wait()
    shutil.copytree(live, root, dirs_exist_ok=True)
    log.close()
    shutil.rmtree(live)
    shutil.copytree(root, root + "-look")  # an open records a new durable end: look at a copy
    reopened = FileLog.open(root + "-look", segment_bytes=SMALL)
    bodies = [bytes(r.body) for r in reopened.scan()]
    reopened.close()
    shutil.rmtree(root + "-look")
    assert len(bodies) == 3 and bodies[2][:4] == GROUP_MAGIC
    return bodies[:2], bodies[2]


def _seg(root: str) -> str:
    d = os.path.join(root, "0")
    return next(os.path.join(d, n) for n in sorted(os.listdir(d)) if n.endswith(".seg"))


def _each_byte_of_the_group(tmp_path) -> Iterator[tuple[int, str, list[bytes]]]:
    """(offset, a fresh copy of the log's directory, the bodies before the group record) for
    every byte offset of the group record, the log's last; each copy is removed after use."""
    base = str(tmp_path / "base")
    before, _group = _log_with_group_last(base)
    scan = sg.scan_segment(_seg(base), 0)
    for pos in range(scan.offsets[-1], scan.end):
        root = str(tmp_path / f"at{pos}")
        shutil.copytree(base, root)
        yield pos, root, before
        shutil.rmtree(root)


def test_a_group_record_torn_at_every_byte_is_cut_whole(tmp_path):
    for cut, root, before in _each_byte_of_the_group(tmp_path):
        with open(_seg(root), "r+b") as f:
            f.truncate(cut)
        log = FileLog.open(root, segment_bytes=SMALL)
        assert [bytes(r.body) for r in log.scan()] == before, cut
        log.close()


def test_a_group_record_damaged_at_any_byte_is_cut_or_refused(tmp_path):
    for pos, root, before in _each_byte_of_the_group(tmp_path):
        with open(_seg(root), "r+b") as f:
            f.seek(pos)
            byte = f.read(1)
            f.seek(pos)
            f.write(bytes([byte[0] ^ 0x41]))
        try:
            log = FileLog.open(root, segment_bytes=SMALL)
        except WalCorruption:
            continue
        assert [bytes(r.body) for r in log.scan()] == before, pos  # the last record: a torn tail, cut whole
        log.close()


def test_a_damaged_group_record_with_records_after_it_is_refused(tmp_path):
    root = str(tmp_path)
    log = FileLog.open(root, segment_bytes=SMALL, create=True)
    tickets = [log.submit_joinable(_record(k)) for k in range(3)]
    tickets[-1].wait()
    log.append([_record(9)])
    log.close()
    scan = sg.scan_segment(_seg(root), 0)
    with open(_seg(root), "r+b") as f:
        f.seek(scan.offsets[0] + 64 + GROUP_HEADER.size + 3)  # inside the second body of the group
        f.write(b"\x00\x00")
    with pytest.raises(WalCorruption) as err:
        FileLog.open(root, segment_bytes=SMALL)
    assert err.value.offset == scan.offsets[0]
