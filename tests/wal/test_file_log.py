"""The file-segment log: framing, group commit, rollover, recovery from torn tails and damage."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from sediment.engine.frontiers import SealedFrontiers, fold
from sediment.errors import EngineClosed, WalCorruption, WalMissing
from sediment.wal import record as rec
from sediment.wal import segment as sg
from sediment.wal.control import CONTROL_NAME, ControlFile, PartitionState
from sediment.wal.file_log import FileLog
from sediment.wal.record import Record, RecordKind


def updates(rel: int, t: int, body: bytes) -> Record:
    return Record(RecordKind.UPDATES, relation_id=rel, t_lo=t, t_hi=t, count=1, body=body)


def seg_files(root: str) -> list[str]:
    d = os.path.join(root, "0")
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".seg"))


def bodies(log: FileLog) -> list[bytes]:
    return [r.body for r in log.scan()]


def update_bodies(log: FileLog) -> list[bytes]:
    return [r.body for r in log.scan() if r.kind == RecordKind.UPDATES]


def test_append_read_scan_roundtrip(tmp_path):
    log = FileLog.open(str(tmp_path), create=True)
    payloads = [os.urandom(n) for n in (0, 1, 100, 70000)]
    last = log.append([updates(1, i, p) for i, p in enumerate(payloads)])
    assert last == 3
    assert [log.read(i).body for i in range(4)] == payloads
    assert bodies(log) == payloads
    assert [r.lsn for r in log.scan(2)] == [2, 3]
    log.close()
    with pytest.raises(EngineClosed):
        log.append([updates(1, 0, b"x")])


@pytest.mark.parametrize("where", ["header", "body"])
def test_read_many_names_the_damaged_record_by_lsn_and_offset(tmp_path, where):
    log = FileLog.open(str(tmp_path), create=True)
    log.append([updates(1, i, b"row %d " % i * 20) for i in range(8)])
    [seg] = [s for s in log._segments if len(s.offsets) == 8]
    offset = seg.offsets[5] + (3 if where == "header" else rec.HEADER_SIZE + 7)
    with open(seg.path, "r+b") as f:
        f.seek(offset)
        f.write(b"\xff")
    assert [r.body for r in log.read_many([0, 1, 2])] == [b"row %d " % i * 20 for i in range(3)]
    with pytest.raises(WalCorruption, match=f"offset {seg.offsets[5]} \\(LSN 5\\)"):
        log.read_many(list(range(8)))
    log.close()


def test_concurrent_appends_share_syncs_and_keep_each_callers_order(tmp_path):
    log = FileLog.open(str(tmp_path), create=True)
    syncs = []
    real = os.fdatasync

    def counting(fd):
        syncs.append(fd)
        real(fd)

    os.fdatasync = counting
    try:
        def writer(w):
            for i in range(100):
                log.append([updates(w, i, f"{w}:{i}".encode())])

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        os.fdatasync = real
    seen = [r.body.decode() for r in log.scan()]
    assert len(seen) == 1600 and len(set(seen)) == 1600
    for w in range(16):
        mine = [int(s.split(":")[1]) for s in seen if s.startswith(f"{w}:")]
        assert mine == list(range(100))
    assert len(syncs) < 1600, "group commit should share fdatasyncs between concurrent appends"
    log.close()


def test_rollover_frames_each_segment_with_frontiers_and_trim_drops_whole_segments(tmp_path):
    log = FileLog.open(str(tmp_path), create=True, segment_bytes=8192)
    log.set_preamble(SealedFrontiers())
    finished = []
    log.set_finish_listener(finished.append)
    for t in range(60):
        log.append([updates(7, t, os.urandom(300))])
        if t % 10 == 9:
            log.append([Record(RecordKind.PROGRESS, relation_id=7, t_lo=t, t_hi=t)])
    assert len(seg_files(str(tmp_path))) >= 3 and finished
    records = list(log.scan())
    starts = [s.first_lsn for s in log._segments]
    for first in starts[1:]:
        assert log.read(first).kind == RecordKind.FRONTIERS
        assert log.read(first - 1).kind == RecordKind.FRONTIERS
        assert log.read(first).body == log.read(first - 1).body
    assert log.finished_lsn == starts[-1] == finished[-1]
    log.trim(starts[2])
    assert log.start_lsn == starts[2]
    assert [r.lsn for r in log.scan()] == [r.lsn for r in records if r.lsn >= starts[2]]
    log.close()
    reopened = FileLog.open(str(tmp_path), create=True, segment_bytes=8192)
    frontiers: dict[int, int] = {}
    fold(frontiers, reopened.scan())
    assert frontiers == {7: 59}
    assert reopened.read(starts[2]).kind == RecordKind.FRONTIERS
    assert reopened.start_lsn == starts[2]
    reopened.close()


SMALL = 1 << 14  # small preallocation keeps the copy-per-case tests fast


def _small_log(root: str, n: int = 5) -> list[bytes]:
    """A log as a crash leaves it: copied while open, so its manifest records only the durable
    end written at open (a torn tail past it is a crash's, not a loss)."""
    live = root + "-live"
    log = FileLog.open(live, segment_bytes=SMALL, create=True)
    payloads = [f"record-{i}-".encode() * (i + 3) for i in range(n)]
    for p in payloads:
        log.append([updates(1, 1, p)])
    shutil.copytree(live, root, dirs_exist_ok=True)
    log.close()
    shutil.rmtree(live)
    return payloads


def _data_end(path: str) -> int:
    return sg.scan_segment(path, 0).end


def test_torn_tail_at_every_byte_of_last_record_is_cut(tmp_path):
    base = str(tmp_path / "base")
    payloads = _small_log(base)
    path = seg_files(base)[0]
    scan = sg.scan_segment(path, 0)
    last_start, end = scan.offsets[-1], scan.end
    for cut in range(last_start, end):
        root = str(tmp_path / f"c{cut}")
        shutil.copytree(base, root)
        seg = seg_files(root)[0]
        with open(seg, "r+b") as f:
            f.truncate(cut)
        log = FileLog.open(root, segment_bytes=SMALL, create=True)
        assert bodies(log) == payloads[:-1], cut
        assert log.end_lsn == len(payloads) - 1
        if cut > last_start:
            assert log.report.torn_tails and log.report.torn_tails[0][1] == last_start
        log.append([updates(1, 2, b"after")])  # the log continues cleanly after the cut
        log.close()
        again = FileLog.open(root, segment_bytes=SMALL, create=True)
        assert bodies(again) == payloads[:-1] + [b"after"]
        again.close()
        shutil.rmtree(root)


def test_garbage_instead_of_last_record_is_a_torn_tail(tmp_path):
    root = str(tmp_path)
    payloads = _small_log(root)
    path = seg_files(root)[0]
    last = sg.scan_segment(path, 0).offsets[-1]
    with open(path, "r+b") as f:
        f.seek(last + 10)
        f.write(b"\xff\x00\xee" * 7)
    log = FileLog.open(root, segment_bytes=SMALL, create=True)
    assert bodies(log) == payloads[:-1]
    (where, offset, _n, reason), = log.report.torn_tails
    assert where == path and offset == last and "torn tail" in reason
    log.close()


def test_bit_flip_anywhere_is_detected_never_returned(tmp_path):
    base = str(tmp_path / "base")
    payloads = _small_log(base, 4)
    path = seg_files(base)[0]
    scan = sg.scan_segment(path, 0)
    last_start = scan.offsets[-1]
    for pos in range(0, scan.end, 3):
        root = str(tmp_path / f"f{pos}")
        shutil.copytree(base, root)
        seg = seg_files(root)[0]
        with open(seg, "r+b") as f:
            f.seek(pos)
            byte = f.read(1)
            f.seek(pos)
            f.write(bytes([byte[0] ^ 0x10]))
        try:
            log = FileLog.open(root, segment_bytes=SMALL, create=True)
        except WalCorruption as exc:
            assert exc.path == seg and exc.offset >= 0
            assert pos < last_start or pos < sg.HEADER_SIZE
        else:
            # only damage inside the last record may be taken for a torn tail
            assert pos >= last_start, pos
            assert bodies(log) == payloads[:-1]
            log.close()
        shutil.rmtree(root)


def test_damage_with_valid_records_after_refuses_then_repair_keeps_the_rest(tmp_path):
    root = str(tmp_path)
    payloads = _small_log(root)
    path = seg_files(root)[0]
    second = sg.scan_segment(path, 0).offsets[1]
    with open(path, "r+b") as f:
        f.seek(second + rec.HEADER_SIZE + 2)
        f.write(b"X")
    with pytest.raises(WalCorruption) as err:
        FileLog.open(root, segment_bytes=SMALL, create=True)
    assert err.value.offset == second and path in str(err.value)
    log = FileLog.open(root, segment_bytes=SMALL, repair=True, create=True)
    assert bodies(log) == payloads[:1] + payloads[2:]  # only the damaged record is lost (issue 12)
    assert log.report.torn_tails[0][1] == second
    log.close()


def test_missing_or_stale_index_is_rebuilt(tmp_path):
    root = str(tmp_path)
    log = FileLog.open(root, index_interval=3, create=True)
    for i in range(10):
        log.append([updates(1, i, bytes([i]) * 50)])
    log.close()
    idx = seg_files(root)[0][:-4] + ".idx"
    os.unlink(idx)
    log = FileLog.open(root, segment_bytes=SMALL, create=True)
    assert log.report.rebuilt_index_entries == 10
    assert [log.read(i).body for i in range(10)] == [bytes([i]) * 50 for i in range(10)]
    log.close()
    with open(idx, "r+b") as f:  # a wrong checkpointed entry
        f.seek(sg.HEADER_SIZE + 8 * 2)
        f.write((12345).to_bytes(8, "little"))
    log = FileLog.open(root, segment_bytes=SMALL, create=True)
    assert log.report.rebuilt_index_entries == 10
    assert log.read(2).body == bytes([2]) * 50
    log.close()


def test_control_file_torn_struct_falls_back_to_the_other_copy(tmp_path):
    root = str(tmp_path)
    log = FileLog.open(root, create=True)
    log.append([updates(1, 1, b"x")])
    log.close()
    FileLog.open(root, create=True).close()  # the log changed since the last session: a new one
    ctl = ControlFile.open(root)
    state = ctl.read_state(0)
    assert (state.session_id, state.low_water_mark, state.sequence) == (2, 0, 2)
    newer = ctl.write_state(0, PartitionState(3, 10, 10))
    off = 128 + 4 + (newer.sequence % 2) * 36
    with open(os.path.join(root, CONTROL_NAME), "r+b") as f:
        f.seek(off + 5)
        f.write(b"\x99")
    assert ControlFile.open(root).read_state(0) == state
    with open(os.path.join(root, CONTROL_NAME), "r+b") as f:
        f.seek(128 + 4 + ((newer.sequence + 1) % 2) * 36 + 5)
        f.write(b"\x99")
    with pytest.raises(WalCorruption):
        ControlFile.open(root).read_state(0)


def _wal_files(root: str) -> dict[str, tuple[int, int, bytes]]:
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            st = os.stat(p)
            with open(p, "rb") as f:
                out[p] = (st.st_ino, st.st_mtime_ns, f.read())
    return out


def test_a_reopen_after_a_clean_close_writes_nothing(tmp_path, monkeypatch):
    """Manifest, control file, segments and indexes stay as they were (bytes, inode, mtime),
    and no file is synced: the manifest already records the active segment and the durable
    end, and the control file a session whose marks are the log's last LSN."""
    root = str(tmp_path)
    log = FileLog.open(root, segment_bytes=SMALL, create=True)
    for i in range(40):  # some finished segments, and records in the active one
        log.append([updates(1, i, bytes([i]) * 700)])
    log.close()
    FileLog.open(root, segment_bytes=SMALL).close()  # the session after the appends is recorded
    before = _wal_files(root)
    synced = []
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda fd, real=real: (synced.append(fd), real(fd))[1])
    log = FileLog.open(root, segment_bytes=SMALL)
    assert [r.body for r in log.scan() if r.kind == RecordKind.UPDATES] == [bytes([i]) * 700 for i in range(40)]
    log.close()
    assert synced == []
    assert _wal_files(root) == before


def test_segment_created_but_never_written_is_dropped(tmp_path):
    root = str(tmp_path)
    payloads = _small_log(root)
    path = os.path.join(root, "0", sg.segment_name(len(payloads)))
    with open(path, "wb") as f:
        f.write(bytes(4096))
    log = FileLog.open(root, segment_bytes=SMALL, create=True)
    assert bodies(log) == payloads
    assert not os.path.exists(path) or sg.parse_header(open(path, "rb").read(128)) is not None
    log.close()


WRITER = textwrap.dedent("""
    import sys
    from sediment.wal.file_log import FileLog
    from sediment.wal.record import Record, RecordKind
    log = FileLog.open(sys.argv[1], segment_bytes=1 << 16, create=True)
    i = 0
    while True:
        body = (b"%08d" % i) * (1 + i % 50)
        lsn = log.append([Record(RecordKind.UPDATES, relation_id=1, t_lo=i, t_hi=i, body=body)])
        print(lsn, i, flush=True)
        i += 1
""")


def test_sigkill_mid_stream_keeps_every_acknowledged_append(tmp_path):
    root = str(tmp_path / "wal")
    proc = subprocess.Popen([sys.executable, "-c", WRITER, root], stdout=subprocess.PIPE, text=True)
    acked = []
    try:
        for line in proc.stdout:
            acked.append(tuple(map(int, line.split())))
            if len(acked) >= 1500:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert len(acked) == 1500, f"the writer stopped after {len(acked)} acknowledged appends"
    log = FileLog.open(root, segment_bytes=1 << 16, create=True)
    by_lsn = {r.lsn: r for r in log.scan() if r.kind == RecordKind.UPDATES}
    for lsn, i in acked:
        assert by_lsn[lsn].body == (b"%08d" % i) * (1 + i % 50)
    log.close()


@pytest.mark.parametrize("threshold", [None, 1])
def test_direct_io_group_commits_write_the_same_log(tmp_path, threshold):
    """Group commits written with O_DIRECT (threshold 1: every one) read back exactly as
    buffered ones, across partial blocks, rollovers, torn tails and reopen."""
    root = str(tmp_path)
    log = FileLog.open(root, segment_bytes=1 << 15, direct_threshold=threshold, create=True)
    payloads = [os.urandom(n) for n in (10, 4000, 5000, 1, 70000, 300, 8192, 0, 123)] * 3
    for i, p in enumerate(payloads):
        log.append([updates(1, i, p)])
    assert update_bodies(log) == payloads
    log.close()
    log = FileLog.open(root, segment_bytes=1 << 15, direct_threshold=threshold, create=True)
    assert update_bodies(log) == payloads and not log.report.torn_tails
    log.append([updates(1, 99, b"tail")])
    crashed = str(tmp_path / "crashed")  # the image a SIGKILL leaves: no durable end written at close
    shutil.copytree(root, crashed)
    log.close()
    for where in (crashed, root):
        path = seg_files(where)[-1]
        end = sg.scan_segment(path, int(os.path.basename(path)[:-4])).end
        with open(path, "r+b") as f:
            f.truncate(end - 2)
    log = FileLog.open(crashed, segment_bytes=1 << 15, direct_threshold=threshold)
    assert update_bodies(log) == payloads
    log.close()
    with pytest.raises(WalMissing, match="before the durable end"):  # closed cleanly: the tail was acknowledged
        FileLog.open(root, segment_bytes=1 << 15, direct_threshold=threshold)
