"""The raw-device ring WAL (wal/device/log.py) on real preallocated files, real threads and
a real writer process killed with SIGKILL."""

from __future__ import annotations

import errno
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.wal_backends import owned

from sediment.engine.frontiers import fold
from sediment.errors import EngineClosed, WalCorruption, WalError, WalFull
from sediment.wal.device.log import RING_MAGIC, SHUTDOWN_CLEAN, DeviceLog, RingHeader
from sediment.wal.protocol import WriteAheadLog
from sediment.wal.record import HEADER_SIZE, Record, RecordKind, decode_frontiers, decode_header

BS = 4096
HDR = 2 * BS
CAP = 256 * 1024
DATA = CAP - HDR


def upd(i: int, n: int = 100, rel: int = 1) -> Record:
    return Record(RecordKind.UPDATES, relation_id=rel, t_lo=i, t_hi=i, count=1, body=body_of(i, n))


def body_of(i: int, n: int) -> bytes:
    return random.Random(i).randbytes(n)


def open_log(path: Path, capacity: int | None = CAP, **kw) -> DeviceLog:
    kw.setdefault("full_timeout", 2.0)
    return owned(DeviceLog.open(path, capacity, create=True, **kw))


def snapshot(path: Path) -> bytes:
    """The device as a crash would leave it (header says the log is running)."""
    return path.read_bytes()


def raw_record_at(image: bytes, lsn: int, data: int = DATA):
    return decode_header(image, HDR + lsn % data)


def test_round_trip_scan_read_and_protocol(tmp_path: Path) -> None:
    log = open_log(tmp_path / "ring")
    assert isinstance(log, WriteAheadLog)
    recs = [upd(i, 50 + i * 7) for i in range(30)]
    last = log.append(recs[:3])
    assert [r.lsn for r in recs[:3]] == [0, recs[0].frame_size, recs[0].frame_size + recs[1].frame_size]
    assert last == recs[2].lsn
    for r in recs[3:]:
        log.append([r])
    assert log.start_lsn == 0 and log.durable_lsn == recs[-1].lsn + recs[-1].frame_size
    got = list(log.scan())
    assert [(g.lsn, g.body, g.t_hi) for g in got] == [(r.lsn, r.body, r.t_hi) for r in recs]
    assert [g.lsn for g in log.scan(recs[10].lsn)] == [r.lsn for r in recs[10:]]
    assert log.read(recs[17].lsn).body == recs[17].body
    with pytest.raises(WalError, match="not the LSN of a record"):
        list(log.scan(recs[3].lsn + 8))
    with pytest.raises(WalError, match="no durable record"):
        log.read(log.durable_lsn + BS)
    with pytest.raises(WalError, match="no valid record"):
        log.read(recs[5].lsn + 1)
    log.close()
    with pytest.raises(EngineClosed):
        log.append([upd(99)])


def raw_walk(image: bytes, start: int, end: int) -> list:
    """Every frame header from ``start`` to ``end`` as stored, padding included."""
    out, pos = [], start
    while pos < end:
        h = raw_record_at(image, pos) if DATA - pos % DATA >= HEADER_SIZE else None
        if h is None or h.lsn != pos:
            pos = (pos // BS + 1) * BS
            continue
        out.append(h)
        pos += h.frame_size
    return out


def test_a_lone_record_and_several_are_framed_as_encode_frames_them(tmp_path: Path) -> None:
    """A one-record append packs its header into the block itself (``place_one``), a
    several-record one through ``encode_header``: on the device both are ``encode``'s bytes."""
    from sediment.wal.record import encode

    log = open_log(tmp_path / "ring")
    lone = Record(RecordKind.UPDATES, relation_id=7, txn_id=3, t_lo=-5, t_hi=9, count=2, body=b"x" * 300,
                  schema_version=4)
    pair = [upd(1, 40), Record(RecordKind.COMMIT, txn_id=3)]
    log.append([lone])
    log.append(pair)
    log.append([Record(RecordKind.PROGRESS, relation_id=2, t_hi=11)])
    image = snapshot(tmp_path / "ring")
    for r in [lone, *pair]:
        frame = encode(r, r.lsn)
        assert image[HDR + r.lsn:HDR + r.lsn + len(frame)] == frame
    log.close()


def test_bodies_either_side_of_the_checksum_lock_threshold_verify(tmp_path: Path) -> None:
    """Bodies up to 256 KiB are checksummed keeping the interpreter lock, bigger ones letting
    it go: both give the CRC32C that reads and recovery check, and ``body_crc`` is that CRC."""
    import crc32c

    from sediment.wal.device.format import HOLD_GIL_CRC_BYTES, body_crc

    sizes = [1, 32 * 1024 - 1, 64 * 1024, HOLD_GIL_CRC_BYTES, HOLD_GIL_CRC_BYTES + 1, 300 * 1024]
    records = [upd(i, n) for i, n in enumerate(sizes)]
    assert [body_crc(r.body) for r in records] == [crc32c.crc32c(r.body) for r in records]
    log = open_log(tmp_path / "ring", 4 << 20)
    for r in records:
        log.append([r])
    log.close()
    log = owned(DeviceLog.open(tmp_path / "ring"))
    assert log.report.records == len(sizes) and not log.report.torn_tails
    assert [(r.lsn, r.body) for r in log.scan()] == [(r.lsn, r.body) for r in records]
    log.close()


def test_wrap_around_writes_padding_and_keeps_order(tmp_path: Path) -> None:
    path = tmp_path / "ring"
    log = open_log(path, max_block_bytes=16 * 1024, segment_bytes=1 << 40)
    appended: list[Record] = []
    pads = []
    i = 0
    for lap in (1, 2, 3):
        while log.end_lsn < lap * DATA:
            r = upd(i, 5000 + (i * 977) % 9000)
            log.append([r])
            appended.append(r)
            i += 1
            if i % 10 == 0:
                log.finish_segment()
                log.trim(log.finished_lsn)
        frames = raw_walk(snapshot(path), log.start_lsn, log.durable_lsn)
        pads += [h for h in frames if h.kind == RecordKind.PADDING]
        assert [h.lsn for h in frames if h.kind == RecordKind.UPDATES] == [
            r.lsn for r in appended if r.lsn >= log.start_lsn
        ]
    assert pads and all((p.lsn + p.frame_size) % DATA == 0 for p in pads)
    assert all(r.lsn % DATA + r.frame_size <= DATA for r in appended)
    assert log.start_lsn > DATA
    kept = [r for r in appended if r.lsn >= log.start_lsn]
    scanned = [g for g in log.scan() if g.kind == RecordKind.UPDATES]
    assert [(g.lsn, g.body) for g in scanned] == [(r.lsn, r.body) for r in kept]
    log.close()
    log = DeviceLog.open(path)
    assert [(g.lsn, g.body) for g in log.scan() if g.kind == RecordKind.UPDATES] == [(r.lsn, r.body) for r in kept]
    log.close()


def test_reopen_recovers_everything_and_frontiers(tmp_path: Path) -> None:
    path = tmp_path / "ring"
    finished: list[int] = []
    log = open_log(path, capacity=1 << 20)
    log.set_finish_listener(finished.append)
    log.append([upd(1), Record(RecordKind.PROGRESS, relation_id=7, t_lo=5, t_hi=5)])
    log.append([Record(RecordKind.PROGRESS, relation_id=8, t_lo=3, t_hi=3)])
    log.finish_segment()
    assert finished == [log.finished_lsn]
    f = [g for g in log.scan() if g.kind == RecordKind.FRONTIERS]
    assert len(f) == 1 and decode_frontiers(f[0].body) == {7: 5, 8: 3}
    log.trim(log.finished_lsn)
    assert log.start_lsn == f[0].lsn
    log.append([Record(RecordKind.PROGRESS, relation_id=7, t_lo=9, t_hi=9), upd(2)])
    before = [(g.lsn, g.kind, g.body) for g in log.scan()]
    log.close()

    log = owned(DeviceLog.open(path))
    assert [(g.lsn, g.kind, g.body) for g in log.scan()] == before
    assert log.report.records == len(before) and not log.report.torn_tails
    assert log.start_lsn == f[0].lsn and log.finished_lsn == f[0].lsn + f[0].frame_size
    log.append([Record(RecordKind.PROGRESS, relation_id=9, t_lo=1, t_hi=1)])
    log.finish_segment()
    f2 = [g for g in log.scan() if g.kind == RecordKind.FRONTIERS][-1]
    assert decode_frontiers(f2.body) == {7: 9, 8: 3, 9: 1}
    log.close()


def test_segments_finish_by_size_with_listener(tmp_path: Path) -> None:
    seen: list[int] = []
    log = open_log(tmp_path / "ring", capacity=1 << 20, segment_bytes=32 * 1024)
    log.set_finish_listener(seen.append)
    for i in range(40):
        log.append([upd(i, 2000), Record(RecordKind.PROGRESS, relation_id=1, t_lo=i, t_hi=i)])
    fr = [g for g in log.scan() if g.kind == RecordKind.FRONTIERS]
    assert len(fr) >= 2 and seen == [g.lsn + g.frame_size for g in fr]
    assert log.finished_lsn == seen[-1]
    for g in fr:
        assert decode_frontiers(g.body)[1] == max(r.t_hi for r in log.scan() if r.kind == RecordKind.PROGRESS and r.lsn < g.lsn)
    log.close()


def test_corrupt_newer_header_copy_older_wins(tmp_path: Path) -> None:
    path = tmp_path / "ring"
    log = open_log(path)
    log.append([upd(0)])
    log.close()
    image = bytearray(path.read_bytes())
    hdrs = [RingHeader.unpack(image[i * BS : (i + 1) * BS]) for i in range(2)]
    newest = max(range(2), key=lambda i: hdrs[i].seq)
    assert hdrs[newest].shutdown == SHUTDOWN_CLEAN
    image[newest * BS + 30] ^= 0xFF
    path.write_bytes(image)
    log = DeviceLog.open(path)
    assert [g.body for g in log.scan()] == [body_of(0, 100)]
    log.close()
    fixed = [RingHeader.unpack(path.read_bytes()[i * BS : (i + 1) * BS]) for i in range(2)]
    assert all(h is not None for h in fixed) and max(h.seq for h in fixed) > hdrs[1 - newest].seq


def test_both_header_copies_bad_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ring"
    log = open_log(path)
    log.append([upd(0)])
    log.close()
    image = bytearray(path.read_bytes())
    image[10] ^= 1
    image[BS + 10] ^= 1
    path.write_bytes(image)
    for create in (False, True):
        with pytest.raises(WalError, match="both ring header copies") as e:
            DeviceLog.open(path, CAP, create=create)
        assert str(path) in str(e.value)
    blank = tmp_path / "blank"
    with open(blank, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, CAP)
    with pytest.raises(WalError, match="create=True"):
        DeviceLog.open(blank, CAP)


def test_torn_tail_block_is_cut_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "ring"
    log = open_log(path)
    recs = [upd(i, 700) for i in range(8)]
    for r in recs:
        log.append([r])
    image = bytearray(snapshot(path))
    log.close()
    torn = recs[-1].lsn
    image[HDR + torn + 100 : HDR + torn + 600] = os.urandom(500)
    path.write_bytes(image)
    log = DeviceLog.open(path)
    assert [g.body for g in log.scan()] == [r.body for r in recs[:-1]]
    ((where, off, cut, why),) = log.report.torn_tails
    assert where == str(path) and off == torn and cut >= recs[-1].frame_size and "torn tail" in why
    assert "body checksum" in why
    r = upd(100)
    log.append([r])
    assert r.lsn == torn + BS - torn % BS or r.lsn == torn
    log.close()
    log = DeviceLog.open(path)
    assert [g.body for g in log.scan()][-1] == r.body
    log.close()


def _crashed_image_with(path: Path, n: int, size: int, **kw) -> tuple[bytes, list[Record]]:
    log = open_log(path, **kw)
    recs = [upd(i, size) for i in range(n)]
    for r in recs:
        log.append([r])
    image = snapshot(path)
    log.close()
    return image, recs


def test_gap_mid_window_after_crash_keeps_prefix_and_discards_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "ring"
    image, recs = _crashed_image_with(path, 10, 500)
    bad = recs[4].lsn
    image = bytearray(image)
    image[HDR + bad + 8] ^= 0x55
    path.write_bytes(image)
    log = DeviceLog.open(path)
    assert [g.body for g in log.scan()] == [r.body for r in recs[:4]]
    ((_, off, cut, why),) = log.report.torn_tails
    assert off == bad and "discarded 5 unacknowledged records" in why
    assert cut >= recs[-1].lsn + recs[-1].frame_size - bad
    new = upd(50)
    log.append([new])
    log.close()
    # the discarded records were zeroed: a later crash-open cannot resurrect them
    image = bytearray(path.read_bytes())
    assert raw_record_at(bytes(image), recs[6].lsn) is None
    log = DeviceLog.open(path)
    assert [g.body for g in log.scan()] == [r.body for r in recs[:4]] + [new.body]
    log.close()


def test_damage_is_refused_after_clean_shutdown_or_beyond_window(tmp_path: Path) -> None:
    path = tmp_path / "ring"
    log = open_log(path)
    recs = [upd(i, 500) for i in range(10)]
    for r in recs:
        log.append([r])
    log.close()
    image = bytearray(path.read_bytes())
    image[HDR + recs[3].lsn + HEADER_SIZE + 5] ^= 1
    path.write_bytes(image)
    with pytest.raises(WalCorruption, match="shut down cleanly") as e:
        DeviceLog.open(path)
    assert e.value.offset == recs[3].lsn and e.value.path == str(path) and "repair" in str(e.value)
    log = DeviceLog.open(path, repair=True)  # issue 12: the records after the damage verify, so they are kept
    assert [g.body for g in log.scan() if g.kind != RecordKind.PADDING] == [r.body for r in recs[:3] + recs[4:]]
    assert "hole" in log.report.torn_tails[0][3]
    log.close()

    path2 = tmp_path / "ring2"
    image, recs = _crashed_image_with(path2, 12, 500, window_bytes=2 * BS, max_block_bytes=BS)
    image = bytearray(image)
    image[HDR + recs[2].lsn + 9] ^= 1
    path2.write_bytes(image)
    with pytest.raises(WalCorruption, match="beyond the 8192-byte in-flight window"):
        DeviceLog.open(path2)


def test_stale_records_from_previous_cycle_are_not_resurrected(tmp_path: Path) -> None:
    path = tmp_path / "ring"
    log = open_log(path, segment_bytes=1 << 40)
    first = []
    while log.end_lsn + 2 * BS < DATA:
        r = upd(len(first), 3000)
        log.append([r])
        first.append(r)
    log.finish_segment()
    log.trim(log.finished_lsn)
    new = []
    while log.end_lsn < DATA + 5 * BS:
        r = upd(1000 + len(new), 3000)
        log.append([r])
        new.append(r)
    assert new[-1].lsn >= DATA
    image = snapshot(path)
    log.close()
    path.write_bytes(image)
    log = DeviceLog.open(path)
    bodies = [g.body for g in log.scan() if g.kind == RecordKind.UPDATES]
    assert bodies == [r.body for r in new]
    assert log.report.torn_tails == [] and log.report.records == len(new) + 1
    after = (new[-1].lsn + new[-1].frame_size + BS - 1) // BS * BS
    stale = raw_record_at(image, after)
    assert stale is not None and stale.lsn == after - DATA
    log.close()


def test_wrong_size_and_capacity(tmp_path: Path) -> None:
    path = tmp_path / "ring"
    log = open_log(path)
    log.close()
    st = os.stat(path)
    assert st.st_size == CAP and st.st_blocks * 512 >= CAP
    with pytest.raises(WalError, match="capacity is fixed at 262144"):
        DeviceLog.open(path, 2 * CAP)
    os.truncate(path, CAP - BS)
    with pytest.raises(WalError, match="device is 258048 bytes but the ring header says 262144"):
        DeviceLog.open(path)
    big = tmp_path / "big"
    with open(big, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, 4 * CAP)
    log = DeviceLog.open(big, CAP, create=True)
    assert log.capacity == CAP
    log.append([upd(0)])
    log.close()
    assert os.stat(big).st_size == 4 * CAP
    log = DeviceLog.open(big)
    assert log.capacity == CAP and len(list(log.scan())) == 1
    log.close()
    with pytest.raises(WalError, match="multiple of 4096"):
        DeviceLog.open(tmp_path / "odd", CAP + 1, create=True)


def test_a_new_ring_file_has_its_data_area_written(tmp_path: Path, monkeypatch, capsys) -> None:
    """A created ring file holds no unwritten extent: its first pass writes over written
    blocks, as every later pass (and a device) does, and the writing is reported as progress
    when asked for. File systems that report a fallocated, never written range as a hole
    (ext4, xfs) show it with SEEK_HOLE; elsewhere the check has nothing to see."""
    control = tmp_path / "control"
    with open(control, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, 4 * CAP)
        if os.lseek(f.fileno(), 0, os.SEEK_HOLE) >= 4 * CAP:
            pytest.skip("this file system reports fallocated ranges as data")
    path = tmp_path / "ring"
    monkeypatch.setenv("SEDIMENT_PROGRESS", "1")
    log = open_log(path, 4 * CAP)
    log.close()
    assert f"{path}: zeros over the new ring's data area: done" in capsys.readouterr().err
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.lseek(fd, 0, os.SEEK_HOLE) == 4 * CAP  # the first hole is the end of the file
    finally:
        os.close(fd)
    log = DeviceLog.open(path)  # zeros over the data area: a blank ring, as before
    assert list(log.scan()) == [] and log.durable_lsn == 0
    log.append([upd(0)])
    log.close()


def test_oversized_record_refused_at_once(tmp_path: Path) -> None:
    log = open_log(tmp_path / "ring", full_timeout=30)
    t = time.monotonic()
    with pytest.raises(WalError, match="cannot fit a ring"):
        log.append([upd(0, DATA)])
    assert time.monotonic() - t < 5
    log.append([upd(1, DATA - HEADER_SIZE)])
    assert log.read(0).body == body_of(1, DATA - HEADER_SIZE)
    log.close()


def test_trim_clamps_to_finished_frontiers_and_refuses_past_durable(tmp_path: Path) -> None:
    log = open_log(tmp_path / "ring")
    a = upd(0)
    log.append([a])
    log.trim(a.lsn + a.frame_size)
    assert log.start_lsn == 0
    with pytest.raises(WalError, match="only records below"):
        log.trim(log.durable_lsn + 1)
    log.finish_segment()
    fin = log.finished_lsn
    b = upd(1)
    log.append([b])
    log.trim(b.lsn)
    assert log.start_lsn == fin - HEADER_SIZE
    assert [g.kind for g in log.scan()] == [RecordKind.FRONTIERS, RecordKind.UPDATES]
    with pytest.raises(WalError, match="no durable record"):
        log.read(a.lsn)
    log.close()


class Recorder:
    """A pwrite that records every (offset, length) and can fail or block on demand."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int]] = []
        self.fail_first_einval = False
        self.lock = threading.Lock()

    def __call__(self, fd: int, data, offset: int) -> int:
        with self.lock:
            if self.fail_first_einval:
                self.fail_first_einval = False
                raise OSError(errno.EINVAL, "Invalid argument (injected)")
            self.calls.append((fd, offset, len(data)))
        return os.pwrite(fd, data, offset)


def test_backpressure_blocks_until_trim_then_walfull(tmp_path: Path) -> None:
    rec = Recorder()
    log = open_log(tmp_path / "ring", segment_bytes=1 << 40, pwrite=rec, full_timeout=30)
    recs = []
    while log.end_lsn + 2 * BS <= DATA:
        r = upd(len(recs), 3000)
        log.append([r])
        recs.append(r)
    log.finish_segment()
    blocked = upd(999, 3000)
    errors: list[BaseException] = []

    def appender() -> None:
        try:
            log.append([blocked])
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=appender)
    writes = len(rec.calls)
    t.start()
    assert log.wait_for_full_waiters(1, timeout=10)
    assert log.full_waiters == 1 and t.is_alive() and len(rec.calls) == writes
    log.trim(log.finished_lsn)
    t.join(10)
    assert not t.is_alive() and not errors
    assert blocked.lsn >= DATA and log.read(blocked.lsn).body == blocked.body

    log.full_timeout = 0.3
    writes = len(rec.calls)
    before = [(g.lsn, g.body) for g in log.scan()]
    t0 = time.monotonic()
    with pytest.raises(WalFull, match="capacity or let the compacter"):
        while True:
            log.append([upd(5000, 3000)])
            writes = len(rec.calls)
            before = [(g.lsn, g.body) for g in log.scan()]
            t0 = time.monotonic()
    assert time.monotonic() - t0 >= 0.3
    assert len(rec.calls) == writes
    assert [(g.lsn, g.body) for g in log.scan()] == before
    log.close()


def test_every_write_is_block_aligned(tmp_path: Path) -> None:
    rec = Recorder()
    path = tmp_path / "ring"
    log = open_log(path, capacity=1 << 20, pwrite=rec, max_block_bytes=8 * 1024)
    threads = [
        threading.Thread(target=lambda k=k: [log.append([upd(k * 100 + i, 37 + 501 * i % 7000)]) for i in range(25)])
        for k in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.finish_segment()
    log.trim(log.finished_lsn)
    for i in range(60):
        log.append([upd(i, 3333)])
        if i % 8 == 0:
            log.finish_segment()
            log.trim(log.finished_lsn)
    image = snapshot(path)
    log.close()
    path.write_bytes(image)
    log = DeviceLog.open(path, pwrite=rec)
    log.append([upd(1, 10)])
    log.close()
    assert len(rec.calls) > 100
    bad = [(o, n) for _, o, n in rec.calls if o % BS or n % BS]
    assert not bad


def test_odirect_fallback_writes_identical_bytes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def run(path: Path, direct: bool, fail: bool) -> DeviceLog:
        rec = Recorder()
        log = open_log(path, direct=direct, pwrite=rec)
        rec.fail_first_einval = fail
        for i in range(20):
            log.append([upd(i, 100 * i), Record(RecordKind.PROGRESS, relation_id=2, t_lo=i, t_hi=i)])
        log.finish_segment()
        log.append([upd(77, 5000)])
        log.close()
        return log

    caplog.set_level(logging.WARNING, logger="sediment.wal.device.log")
    a = run(tmp_path / "direct", True, True)
    b = run(tmp_path / "buffered", False, False)
    assert not a.direct_io and not b.direct_io
    warnings = [r for r in caplog.records if "falling back to buffered" in r.getMessage()]
    assert len(warnings) == 1 and "Direct I/O write refused" in warnings[0].getMessage()
    assert (tmp_path / "direct").read_bytes() == (tmp_path / "buffered").read_bytes()


def test_short_writes_go_on_where_they_stopped(tmp_path: Path) -> None:
    """A write call that takes fewer bytes than asked (one block at a time here) is
    followed by writes of the rest: the ring reads back every record."""
    calls: list[int] = []

    def one_block(fd: int, data, offset: int) -> int:
        calls.append(len(data))
        return os.pwrite(fd, data[:BS], offset)

    path = tmp_path / "ring"
    log = open_log(path, direct=False, pwrite=one_block)
    recs = [upd(i, 5000 * i + 10) for i in range(6)]
    for r in recs:
        log.append([r])
    log.close()
    assert any(n > BS for n in calls)
    log = owned(DeviceLog.open(path, direct=False))
    assert [(g.lsn, g.body) for g in log.scan()] == [(r.lsn, r.body) for r in recs]
    log.close()


def test_concurrent_appenders(tmp_path: Path) -> None:
    log = open_log(tmp_path / "ring", capacity=16 << 20, segment_bytes=1 << 20)
    per_thread, threads_n = 150, 8
    acked: dict[int, list[tuple[int, int]]] = {k: [] for k in range(threads_n)}

    def work(k: int) -> None:
        rng = random.Random(k)
        for i in range(per_thread):
            batch = [upd(k * 10_000 + i * 3 + j, rng.randrange(10, 3000), rel=k + 1) for j in range(rng.randrange(1, 4))]
            last = log.append(batch)
            assert last == batch[-1].lsn
            acked[k].append((batch[0].lsn, len(batch)))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = [g for g in log.scan() if g.kind == RecordKind.UPDATES]
    assert len(got) == sum(n for v in acked.values() for _, n in v)
    assert [g.lsn for g in got] == sorted({g.lsn for g in got})
    index = {g.lsn: i for i, g in enumerate(got)}
    for k, calls in acked.items():
        assert [lsn for lsn, _ in calls] == sorted(lsn for lsn, _ in calls)
        for lsn, n in calls:
            run = got[index[lsn] : index[lsn] + n]
            assert {g.relation_id for g in run} == {k + 1} and len(run) == n
            assert all(g.body == body_of(g.t_lo, len(g.body)) for g in run)
    log.close()


CRASH_WRITER = r"""
import sys
from sediment.wal.device.log import DeviceLog
from sediment.wal.record import Record, RecordKind
import random
log = DeviceLog.open(sys.argv[1], int(sys.argv[2]), create=True, segment_bytes=256 * 1024)
i = 0
while True:
    n = random.Random(i).randrange(1, 9000)
    batch = [Record(RecordKind.UPDATES, relation_id=1, t_lo=i, t_hi=i, body=random.Random(i).randbytes(n)),
             Record(RecordKind.PROGRESS, relation_id=1, t_lo=i, t_hi=i)]
    log.append(batch)
    print(i, batch[0].lsn, n, flush=True)
    i += 1
    if i % 40 == 0:
        log.trim(log.finished_lsn)
"""


def test_sigkill_mid_stream_keeps_every_acknowledged_record(tmp_path: Path) -> None:
    path = tmp_path / "ring"
    cap = 2 << 20
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASH_WRITER, str(path), str(cap)], stdout=subprocess.PIPE, text=True
    )
    acked: list[tuple[int, int, int]] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        i, lsn, n = map(int, line.split())
        acked.append((i, lsn, n))
        if len(acked) == 1500:
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait()
    acked.extend(tuple(map(int, line.split())) for line in proc.stdout if line.count(" ") == 2)
    assert proc.returncode == -signal.SIGKILL
    hdrs = [RingHeader.unpack(path.read_bytes()[i * BS : (i + 1) * BS]) for i in range(2)]
    assert max((h for h in hdrs if h is not None), key=lambda h: h.seq).shutdown != SHUTDOWN_CLEAN
    log = DeviceLog.open(path)
    got = {g.lsn: g for g in log.scan()}
    kept = [a for a in acked if a[1] >= log.start_lsn]
    assert len(acked) >= 1500 and len(kept) >= 10
    for i, lsn, n in kept:
        g = got[lsn]
        assert g.t_lo == i and g.body == random.Random(i).randbytes(n)
    assert max(got) >= acked[-1][1]
    log.append([upd(1)])
    log.close()
    assert RING_MAGIC in path.read_bytes()[:HDR]


def test_submit_runs_on_durable_in_log_order_before_waiters(tmp_path: Path) -> None:
    log = open_log(tmp_path / "ring", capacity=4 << 20)
    order: list[int] = []
    tickets = []
    woke: list[bool] = []

    def cb(records) -> None:
        assert log.durable_lsn >= records[-1].lsn + records[-1].frame_size
        order.append(records[0].lsn)

    for i in range(200):
        t = log.submit([upd(i, 1 + i * 37 % 5000), Record(RecordKind.PROGRESS, relation_id=3, t_lo=i, t_hi=i)], cb)
        tickets.append(t)
    for t in tickets:
        last = t.wait()
        woke.append(t.records[0].lsn in order)
        assert last == t.records[-1].lsn
    assert order == sorted(order) and len(order) == 200 and all(woke)
    log.close()
    log = DeviceLog.open(tmp_path / "ring")
    sealed: dict[int, int] = {}
    fold(sealed, log.scan())
    assert sealed == {3: 199}
    log.close()


def test_write_error_fails_the_log_and_reopen_keeps_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "ring"
    calls = {"n": 0, "fail_after": None}

    def flaky(fd: int, data, offset: int) -> int:
        calls["n"] += 1
        if calls["fail_after"] is not None and calls["n"] > calls["fail_after"]:
            raise OSError(errno.EIO, "Input/output error (injected)")
        return os.pwrite(fd, data, offset)

    log = open_log(path, pwrite=flaky)
    ok = [upd(i) for i in range(5)]
    for r in ok:
        log.append([r])
    calls["fail_after"] = calls["n"]
    with pytest.raises(WalError, match="failed before the append was durable"):
        log.append([upd(99)])
    with pytest.raises(WalError, match="failed earlier"):
        log.append([upd(100)])
    log.close()
    log = DeviceLog.open(path)
    assert [g.body for g in log.scan()] == [r.body for r in ok]
    log.close()


def test_torn_block_tail_is_blanked_so_later_records_chain(tmp_path: Path) -> None:
    path = tmp_path / "ring"
    log = open_log(path)
    call = [upd(i, 300) for i in range(3)]
    log.append(call)
    image = bytearray(snapshot(path))
    log.close()
    assert call[2].lsn % BS != 0
    image[HDR + call[2].lsn + HEADER_SIZE + 10] ^= 0xFF
    path.write_bytes(image)
    log = DeviceLog.open(path)
    assert [g.body for g in log.scan()] == [r.body for r in call[:2]]
    new = upd(7, 200)
    log.append([new])
    assert new.lsn == BS
    crashed_again = snapshot(path)
    log.close()
    assert crashed_again[HDR + call[2].lsn : HDR + BS] == bytes(BS - call[2].lsn)
    path.write_bytes(crashed_again)
    log = DeviceLog.open(path)
    assert [g.body for g in log.scan()] == [r.body for r in call[:2]] + [new.body]
    assert not log.report.torn_tails
    log.close()


def test_sediment_verify_checks_a_device_ring(tmp_path, capsys):
    import pyarrow as pa

    import sediment
    from sediment.cli import main

    data, ring = tmp_path / "d", tmp_path / "ring.dev"
    with sediment.open(data, wal=f"device:{ring}", wal_capacity=4 << 20, compact=False) as eng:
        eng.add_relation("r", pa.schema([("k", pa.int64())]))
        for t in range(1, 30):
            eng.append("r", pa.table({"k": [t], "time": [t], "diff": [1]}))
    assert main(["--data-dir", str(data), "verify"]) == 0
    raw = bytearray(ring.read_bytes())
    pos = raw.find(b"DS", 8192 + 64 * 5)  # a record header in the middle of the chain
    raw[pos + 20] ^= 0xFF
    ring.write_bytes(bytes(raw))
    capsys.readouterr()
    assert main(["--data-dir", str(data), "verify"]) == 1
    assert str(ring) in capsys.readouterr().out


def test_the_engine_opens_its_device_ring_on_its_own_clock(tmp_path):
    """Block ages and the wait for space in the ring are timed by the clock the engine was given."""
    import pyarrow as pa

    import sediment
    from sediment.clock import ManualClock

    clock = ManualClock()
    with sediment.open(tmp_path / "d", wal=f"device:{tmp_path / 'ring.dev'}", wal_capacity=4 << 20,
                       compact=False, clock=clock) as eng:
        eng.add_relation("r", pa.schema([("k", pa.int64())]))
        eng.append("r", pa.table({"k": [1], "time": [1], "diff": [1]}))
        assert isinstance(eng.wal, DeviceLog) and eng.wal.clock is clock
