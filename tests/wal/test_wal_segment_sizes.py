"""Issue 23: a killed file log reopens without repair whatever ``segment_bytes`` the next open
uses. A finished segment's recorded length, its file's real length and the recycle pool
agree at every crash point a roll leaves, and over opens that change the segment size."""

from __future__ import annotations

import os

import pytest

from sediment.engine.verify import VerifyReport, verify_wal
from sediment.wal import manifest as mf
from sediment.wal import segment as sg
from sediment.wal.file_log import DEFAULT_SEGMENT_BYTES, FileLog
from sediment.wal.record import Record, RecordKind

SMALL = 4224


def updates(t: int, body: bytes) -> Record:
    return Record(RecordKind.UPDATES, relation_id=3, t_lo=t, t_hi=t, count=1, body=body)


def verify_ok(root: str) -> bool:
    report = VerifyReport()
    verify_wal(root, report)
    return report.ok


def live_bodies(log: FileLog) -> dict[int, bytes]:
    return {r.lsn: r.body for r in log.scan() if r.kind == RecordKind.UPDATES}


def assert_lengths_agree(root: str) -> None:
    """Every finished segment the manifest records is a file of exactly its recorded length,
    and the active segment is not among them."""
    m = mf.read(root, 0)
    for f in m.finished:
        if f.last_lsn >= m.start_lsn:
            path = os.path.join(root, "0", sg.segment_name(f.first_lsn))
            assert os.path.getsize(path) == f.length, (path, f)
    assert m.active_first not in {f.first_lsn for f in m.finished}


def killed_inside_a_roll(root: str, unwritten_bytes: int) -> tuple[dict[int, bytes], int]:
    """The state a SIGKILL inside a roll leaves: the active segment cut to its records, the
    manifest still naming it active, and the next segment's file created (empty, or
    preallocated) but killed before its header was written. Returns the records and the
    next segment's first LSN."""
    log = FileLog.open(root, create=True, segment_bytes=SMALL)
    for t in range(6):
        log.append([updates(t, os.urandom(300))])
    written = live_bodies(log)
    seg = log._segments[-1]
    assert len(log._segments) == 1 and seg.end < SMALL  # no roll yet: the crash is inside the first
    path, end, nxt = seg.path, seg.end, seg.next_lsn
    log.close()
    os.truncate(path, end)  # _finish_active cuts the old file before it creates the next
    with open(os.path.join(root, "0", sg.segment_name(nxt)), "wb") as f:
        f.truncate(unwritten_bytes)
    return written, nxt


@pytest.mark.parametrize("unwritten_bytes", [0, SMALL])
@pytest.mark.parametrize("next_bytes", [SMALL, 16384, DEFAULT_SEGMENT_BYTES])
def test_a_kill_inside_a_roll_reopens_with_any_segment_size(tmp_path, unwritten_bytes, next_bytes):
    """Fails before the fix: the open deleted the unwritten file but recorded the segment before
    it both as finished and as active, then preallocated it, and the open after that refused
    (``file is 67108864 bytes, recorded ...: bytes after the last record``)."""
    root = str(tmp_path)
    written, nxt = killed_inside_a_roll(root, unwritten_bytes)
    log = FileLog.open(root, segment_bytes=next_bytes)
    assert [p.kind for p in log.problems] == ["unwritten"]
    assert not os.path.exists(os.path.join(root, "0", sg.segment_name(nxt)))
    assert_lengths_agree(root)
    lsn = log.append([updates(99, b"after the kill")])
    log.close()
    assert_lengths_agree(root)
    assert verify_ok(root)
    again = FileLog.open(root)
    assert again.problems == []
    assert live_bodies(again) == {**written, lsn: b"after the kill"}
    again.close()


def test_changing_the_segment_size_between_opens_keeps_lengths_and_pool_in_agreement(tmp_path):
    """Opens with 4,224, 8,192, 16,384 and the default size in turn, each rolling, trimming
    (so pool files of one size are reused by an open with another) and closing: every open
    is clean, verify agrees, and every finished segment has exactly its recorded length."""
    root = str(tmp_path)
    written: dict[int, bytes] = {}
    t = 0
    for round_, size in enumerate([SMALL, 8192, DEFAULT_SEGMENT_BYTES, 16384, SMALL, DEFAULT_SEGMENT_BYTES, 8192]):
        log = FileLog.open(root, create=round_ == 0, segment_bytes=size)
        assert log.problems == [], (size, [p.describe() for p in log.problems])
        assert live_bodies(log) == written
        for _ in range(3):
            for _ in range(5):
                body = os.urandom(900)
                written[log.append([updates(t, body)])] = body
                t += 1
            log.finish_segment()
        log.trim(log._segments[-2].first_lsn)
        written = {lsn: b for lsn, b in written.items() if lsn >= log.start_lsn}
        log.close()
        assert_lengths_agree(root)
        assert verify_ok(root)


def allocated(path: str) -> int:
    return sum(os.stat(os.path.join(d, n)).st_blocks * 512 for d, _, names in os.walk(path) for n in names)


def test_a_new_log_preallocates_a_small_first_segment_and_grows_it_in_doublings(tmp_path):
    """Issue 24: an empty log no longer holds a 64 MiB preallocated segment. The first segment
    is preallocated to FIRST_SEGMENT_BYTES and its preallocation doubles as records fill it;
    it still rolls at ``segment_bytes``, the next segment is preallocated whole, a reopen
    does not grow the small active segment, and every record survives."""
    from sediment.wal.file_log import FIRST_SEGMENT_BYTES

    root, size = str(tmp_path), 8 * FIRST_SEGMENT_BYTES
    FileLog.open(root, create=True, segment_bytes=size).close()
    assert allocated(root) < 2 * FIRST_SEGMENT_BYTES
    log = FileLog.open(root, segment_bytes=size)
    assert allocated(root) < 2 * FIRST_SEGMENT_BYTES
    body = os.urandom(100_000)
    for t in range(30):  # about 3 MiB: the preallocation doubles from 1 to 4 MiB
        log.append([updates(t, body)])
    assert len(log._segments) == 1
    assert os.path.getsize(log._segments[0].path) == 4 * FIRST_SEGMENT_BYTES
    for t in range(30, 120):  # past segment_bytes: a roll, the next segment whole
        log.append([updates(t, body)])
    assert len(log._segments) == 2 and os.path.getsize(log._segments[1].path) == size
    written = live_bodies(log)
    log.close()
    assert_lengths_agree(root)
    assert verify_ok(root)
    again = FileLog.open(root, segment_bytes=size)
    assert again.problems == [] and live_bodies(again) == written and len(written) == 120
    again.close()


def test_a_new_engine_directory_is_small(tmp_path):
    """An empty engine data directory with the default options takes about one small segment."""
    import sediment
    from sediment.wal.file_log import FIRST_SEGMENT_BYTES

    sediment.open(str(tmp_path)).close()
    assert allocated(str(tmp_path)) < 2 * FIRST_SEGMENT_BYTES
