"""The active data file's room (wal/preallocation.py): small appends write zeros a stretch
ahead into blocks never written, so the fdatasyncs after them seldom convert a preallocated
extent; large writes and recycled files get none, and the records read back the same."""

from __future__ import annotations

import os
import uuid

import pytest

from sediment.wal import record as rec
from sediment.wal import segment as sg
from sediment.wal.file_log import FileLog
from sediment.wal.preallocation import SMALL_WRITE, ZERO_AHEAD, FileRoom
from sediment.wal.record import Record, RecordKind
from sediment.wal.replication.node.partition_store import open_directory

BLOCK = 4096


def updates(t: int, size: int) -> Record:
    return Record(RecordKind.UPDATES, relation_id=3, t_lo=t, t_hi=t, count=1, body=os.urandom(size))


def reports_unwritten_as_holes(d) -> bool:
    """Whether this file system shows a preallocated, never written extent as a hole (ext4 and
    XFS do): how the tests below see which blocks were written."""
    path = os.path.join(str(d), "probe")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, 1 << 20)
        return os.lseek(fd, 0, os.SEEK_HOLE) == 0
    except OSError:
        return False
    finally:
        os.close(fd)
        os.unlink(path)


@pytest.fixture
def holes(tmp_path):
    if not reports_unwritten_as_holes(tmp_path):
        pytest.skip("this file system does not report preallocated, never written extents as holes")
    return tmp_path


def written_through(path: str, start: int) -> int:
    """Where the first block never written at or after ``start`` begins."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.lseek(fd, start, os.SEEK_HOLE)
    finally:
        os.close(fd)


def active(log: FileLog):
    return log._segments[-1]


def test_a_lone_small_append_writes_zeros_ahead(holes):
    log = FileLog.open(str(holes / "log"), create=True)
    try:
        log.append([updates(1, 300)])
        seg = active(log)
        assert written_through(seg.path, seg.end) >= seg.end + ZERO_AHEAD - BLOCK
        before = written_through(seg.path, seg.end)
        for t in range(2, 40):  # within the stretch: no further zeros, nothing converted
            log.append([updates(t, 300)])
        assert written_through(seg.path, active(log).end) == before
    finally:
        log.close()


def test_a_group_of_small_records_writes_zeros_ahead(holes):
    log = FileLog.open(str(holes / "log"), create=True)
    try:
        log.append([updates(t, 200) for t in range(5)])
        seg = active(log)
        assert written_through(seg.path, seg.end) >= seg.end + ZERO_AHEAD - BLOCK
    finally:
        log.close()


def test_a_large_record_gets_no_zeros(holes):
    log = FileLog.open(str(holes / "log"), create=True)
    try:
        log.append([updates(1, 2 * SMALL_WRITE)])
        seg = active(log)
        assert written_through(seg.path, seg.end) < seg.end + BLOCK
    finally:
        log.close()


def test_zeros_stop_at_the_preallocated_end(tmp_path):
    path = str(tmp_path / "f")
    with open(path, "wb") as f:
        f.write(b"\0" * sg.HEADER_SIZE)
    fd = os.open(path, os.O_RDWR)
    try:
        room = FileRoom(fd, sg.HEADER_SIZE, ceiling=1 << 20, least=64 << 10)
        assert room.allocated == 64 << 10 and os.fstat(fd).st_size == 64 << 10
        zeros = room.pad(sg.HEADER_SIZE, sg.HEADER_SIZE + 500)
        assert zeros is not None and len(zeros) == (64 << 10) - sg.HEADER_SIZE - 500
        assert room.pad(sg.HEADER_SIZE + 500, sg.HEADER_SIZE + 900) is None  # within what was zeroed
        room.reserve(70 << 10)
        assert room.allocated == 128 << 10  # doubled
        assert len(room.pad(64 << 10, (64 << 10) + 100)) == (64 << 10) - 100
        assert room.pad(128 << 10, (128 << 10) + SMALL_WRITE) is None and room.written == (128 << 10) + SMALL_WRITE
    finally:
        os.close(fd)


def test_a_recycled_file_is_not_zeroed(tmp_path):
    """A reused file's stale frames past the new records stay (the scan tells them from
    damage); zeroing them would only cost writes."""
    log = FileLog.open(str(tmp_path / "log"), create=True, segment_bytes=16384)
    try:
        for _ in range(3):
            first = active(log).first_lsn
            t = 0
            while active(log).first_lsn == first or len(log._segments) < 3:
                log.append([updates(t, 700)])
                t += 1
            log.trim(active(log).first_lsn)
        seg = active(log)
        with open(seg.path, "rb") as f:
            assert sg.parse_header(f.read(sg.HEADER_SIZE)).recycled
        log.append([updates(0, 100)])
        end = active(log).end
        with open(seg.path, "rb") as f:
            f.seek(end + len(sg.END_MARK))
            assert any(f.read(4096))  # the stale bytes are still there
    finally:
        log.close()


def test_records_read_back_across_reopens_within_a_stretch(tmp_path):
    """A reopen mid-stretch starts from the records' end (the zeros past it read as the clean
    end), and appends after it read back with the ones before."""
    root = str(tmp_path / "log")
    bodies: dict[int, bytes] = {}
    for round_ in range(3):
        log = FileLog.open(root, create=round_ == 0)
        try:
            assert not log.report.torn_tails
            for t in range(20):
                r = updates(t, 150 + 40 * t)
                bodies[log.append([r])] = r.body
            assert {r.lsn: r.body for r in log.scan() if r.kind == RecordKind.UPDATES} == bodies
        finally:
            log.close()


def test_a_replica_writes_zeros_ahead_and_reads_back_after_a_cut(holes):
    """A storage node's partition store takes small writes the same way; after a cut (the
    recovery vote's truncation) the zeros start again from the cut, and what it holds reads
    back whole after a reopen."""
    key = uuid.uuid4()
    root = str(holes / "node")
    frames = [rec.encode(updates(t, 300), t) for t in range(12)]
    store = open_directory(root, key)(0)
    try:
        store.write(b"".join(frames[:10]), 0, [len(f) for f in frames[:10]])
        seg = store._segs[-1]
        assert written_through(seg.path, seg.end) >= seg.end + ZERO_AHEAD - BLOCK
        store.truncate(6)
        store.write(b"".join(frames[6:12]), 6, [len(f) for f in frames[6:12]])
        assert written_through(seg.path, store._segs[-1].end) >= store._segs[-1].end + ZERO_AHEAD - BLOCK
    finally:
        store.close()
    store = open_directory(root, key)(0)
    try:
        assert not [p for p in store.problems if p.fatal] and store.next_lsn == 12
        assert store.read(0, 1 << 20) == b"".join(frames)
    finally:
        store.close()
