"""Segment recycling (wal/recycle.py): trimmed data files are reused for new segments, and the
stale frames they still hold past the new records are never read, never taken for damage,
and never hide damage."""

from __future__ import annotations

import os

import pytest

from sediment.errors import WalCorruption
from sediment.wal import record as rec
from sediment.wal import segment as sg
from sediment.wal.file_log import FileLog
from sediment.wal.record import Record, RecordKind

SEGMENT = 16384


def updates(t: int, body: bytes) -> Record:
    return Record(RecordKind.UPDATES, relation_id=5, t_lo=t, t_hi=t, count=1, body=body)


def pdir(root) -> str:
    return os.path.join(str(root), "0")


def pool_files(root) -> list[str]:
    return sorted(n for n in os.listdir(pdir(root)) if n.endswith(sg.RECYCLED_SUFFIX))


def flags(path: str) -> int:
    with open(path, "rb") as f:
        return sg.parse_header(f.read(sg.HEADER_SIZE)).flags


def fill_and_recycle(root, rounds: int = 3) -> tuple[FileLog, dict[int, bytes]]:
    """A log whose active segment is a reused file: append until segments roll, trim below
    the active one, and repeat; returns the log and every live record's body by LSN."""
    log = FileLog.open(str(root), create=True, segment_bytes=SEGMENT)
    written: dict[int, bytes] = {}
    t = 0
    for _ in range(rounds):
        first_active = log._segments[-1].first_lsn
        while log._segments[-1].first_lsn == first_active or len(log._segments) < 3:
            body = os.urandom(700 + (t * 37) % 500)
            written[log.append([updates(t, body)])] = body
            t += 1
        log.trim(log._segments[-1].first_lsn)
    for _ in range(4):  # a few records into the active segment, far less than the file holds
        body = os.urandom(300)
        written[log.append([updates(t, body)])] = body
        t += 1
    start = log.start_lsn
    return log, {lsn: b for lsn, b in written.items() if lsn >= start}


def live_bodies(log: FileLog) -> dict[int, bytes]:
    return {r.lsn: r.body for r in log.scan() if r.kind == RecordKind.UPDATES}


def append_survives_reopen(log: FileLog, tmp_path, written: dict[int, bytes], row_id: int, body: bytes) -> int:
    """Append ``body`` to a reopened log, close it, and check that the next open finds no
    problem and every record, the new one included; the new record's LSN."""
    lsn = log.append([updates(row_id, body)])
    log.close()
    again = FileLog.open(str(tmp_path), segment_bytes=SEGMENT)
    assert again.problems == []
    assert live_bodies(again) == {**written, lsn: body}
    again.close()
    return lsn


def test_trimmed_files_are_reused_and_a_clean_reopen_reports_nothing(tmp_path):
    log, written = fill_and_recycle(tmp_path)
    active = log._segments[-1].path
    assert flags(active) & sg.FLAG_RECYCLED, "the active segment should be a reused file"
    assert os.path.getsize(active) >= SEGMENT // 2
    assert len(pool_files(tmp_path)) <= 2
    assert live_bodies(log) == written
    end = log._segments[-1].end
    log.close()
    with open(active, "rb") as f:  # stale frames of the file's earlier life lie past the end mark
        f.seek(end)
        past = f.read(SEGMENT)
    assert past[:rec.HEADER_SIZE] == sg.END_MARK
    assert past[rec.HEADER_SIZE:].strip(b"\0"), "expected stale bytes after the end mark"

    reopened = FileLog.open(str(tmp_path), segment_bytes=SEGMENT)
    assert reopened.report.torn_tails == [] and reopened.problems == []
    assert live_bodies(reopened) == written
    assert append_survives_reopen(reopened, tmp_path, written, 10_000, os.urandom(900)) == max(written) + 1


def test_pool_stays_bounded_and_an_open_keeps_at_most_two(tmp_path):
    log, _ = fill_and_recycle(tmp_path, rounds=6)
    assert 1 <= len(pool_files(tmp_path)) <= 2
    log.close()
    first = pool_files(tmp_path)[0]
    for i in range(3):  # extra pool files (say, from another build) are deleted at open
        src = os.path.join(pdir(tmp_path), first)
        extra = os.path.join(pdir(tmp_path), sg.recycled_name(10**9 + i))
        with open(src, "rb") as f, open(extra, "wb") as g:
            g.write(f.read())
    FileLog.open(str(tmp_path), segment_bytes=SEGMENT).close()
    assert len(pool_files(tmp_path)) == 2


def test_a_torn_write_into_a_reused_file_is_a_torn_tail_and_keeps_every_record_before_it(tmp_path):
    log, written = fill_and_recycle(tmp_path)
    seg = log._segments[-1]
    path, end, next_lsn = seg.path, seg.end, seg.next_lsn
    log.close()
    frame = rec.encode_header(updates(1, b"y" * 2000), next_lsn, rec.crc32c(b"y" * 2000)) + b"y" * 700
    with open(path, "r+b") as f:  # a header and part of the body reached the disk, the rest did not
        f.seek(end)
        f.write(frame)
    reopened = FileLog.open(str(tmp_path), segment_bytes=SEGMENT)
    assert [p.kind for p in reopened.problems] == ["torn_tail"]
    assert live_bodies(reopened) == written
    reopened.close()


def test_damage_in_a_reused_file_with_records_after_it_is_refused_not_taken_for_the_end(tmp_path):
    log, written = fill_and_recycle(tmp_path)
    seg = log._segments[-1]
    path, victim = seg.path, seg.offsets[2]
    log.close()
    with open(path, "r+b") as f:  # zeroes a header, as the end mark looks: records follow it
        f.seek(victim)
        f.write(bytes(rec.HEADER_SIZE))
    with pytest.raises(WalCorruption):
        FileLog.open(str(tmp_path), segment_bytes=SEGMENT)


@pytest.mark.parametrize("renamed", [False, True])
def test_a_crash_while_a_pool_file_becomes_a_segment_loses_nothing(tmp_path, renamed):
    """The two states a crash can leave in reuse_segment_file: the pool file has its new
    header but kept its name, or it was renamed to the next segment before the log recorded
    the rollover. Either way the open keeps every record, reports no damage, and goes on."""
    log, written = fill_and_recycle(tmp_path)
    seg = log._segments[-1]
    nxt = seg.next_lsn
    log.close()
    pool = pool_files(tmp_path)
    assert pool
    src = os.path.join(pdir(tmp_path), pool[0])
    with open(src, "rb") as f:
        old = sg.parse_header(f.read(sg.HEADER_SIZE))
    header = sg.SegmentHeader(sg.SEG_MAGIC, sg.VERSION, 1, old.cluster_key, 0, nxt, 0, sg.FLAG_RECYCLED).pack()
    with open(src, "r+b") as f:
        f.write(header + sg.END_MARK)
    if renamed:
        os.rename(src, os.path.join(pdir(tmp_path), sg.segment_name(nxt)))
    reopened = FileLog.open(str(tmp_path), segment_bytes=SEGMENT)
    assert not [p for p in reopened.problems if p.fatal]
    assert live_bodies(reopened) == written
    append_survives_reopen(reopened, tmp_path, written, 20_000, os.urandom(500))


def test_an_engine_reuses_what_its_compacter_trims_and_verify_and_reopen_agree(tmp_path):
    """End to end: compaction trims segments, the log reuses them (stats show the kept
    files and count their bytes), and after a close both ``verify`` and a reopen see every
    update exactly once."""
    import pyarrow as pa

    import sediment
    from sediment.clock import ManualClock
    from sediment.engine.verify import verify_data_dir

    schema = pa.schema([("k", pa.int64()), ("v", pa.binary())])
    eng = sediment.open(str(tmp_path), segment_bytes=SEGMENT, clock=ManualClock())
    eng.add_relation("r", schema)
    expected: dict[int, int] = {}
    reused = 0
    for t in range(1, 40):
        rows = [(t * 10 + i) % 97 for i in range(8)]
        eng.append("r", pa.table({"k": pa.array(rows, pa.int64()), "v": pa.array([b"v" * 900] * 8),
                                  "time": pa.array([t] * 8, pa.int64()), "diff": pa.array([1] * 8, pa.int64())}))
        for k in rows:
            expected[k] = expected.get(k, 0) + 1
        eng.seal("r", t)
        if t % 5 == 0:
            eng.compact()
            reused = max(reused, eng.stats()["wal"]["recycled_files"])
            active = eng.wal._segments[-1].path
            reused_active = flags(active) & sg.FLAG_RECYCLED
    stats = eng.stats()["wal"]
    assert reused >= 1 and stats["recycled_files"] <= 2 and stats["bytes"] > 0
    assert reused_active, "some compaction pass should have left a reused file as the active segment"
    snap = eng.snapshot("r", 39)
    assert dict(zip(snap.column("k").to_pylist(), snap.column("diff").to_pylist(), strict=True)) == expected
    eng.close()
    report = verify_data_dir(str(tmp_path))
    assert report.ok, report.problems
    again = sediment.open(str(tmp_path), segment_bytes=SEGMENT, clock=ManualClock())
    snap = again.snapshot("r", 39)
    assert dict(zip(snap.column("k").to_pylist(), snap.column("diff").to_pylist(), strict=True)) == expected
    again.close()
