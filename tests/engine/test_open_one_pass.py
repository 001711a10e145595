"""Open in one pass: the log's own recovery verifies every frame once and hands the engine
the records it applies; nothing reads the log a second time, and damage is still refused."""

from __future__ import annotations

import os
import random

import pyarrow as pa
import pytest

import sediment
from sediment.clock import ManualClock
from sediment.errors import WalCorruption
from sediment.wal import record as rec
from sediment.wal import segment as sg
from sediment.wal.file_log import FileLog
from sediment.wal.record import Record, RecordKind


def seg_files(root: str) -> list[str]:
    d = os.path.join(root, "0")
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".seg"))


def mixed_records(rng: random.Random, n: int) -> list[list[Record]]:
    """Groups of records of every kind the engine applies, bodies of random sizes."""
    groups = []
    txn = 0
    for i in range(n):
        kind = rng.choice(["updates", "progress", "txn", "commit_many"])
        if kind == "updates":
            groups.append([Record(RecordKind.UPDATES, rng.randint(1, 3), 0, i, i + rng.randint(0, 3),
                                  rng.randint(1, 9), os.urandom(rng.choice([0, 1, 63, 64, 4000, 70000])))])
        elif kind == "progress":
            groups.append([Record(RecordKind.PROGRESS, rng.randint(1, 3), 0, i, i)])
        else:
            txn += 1
            body = rec.encode_txn_ids([txn + 1000, txn + 2000]) if kind == "commit_many" else b""
            groups.append([Record(RecordKind.BEGIN, txn_id=txn),
                           Record(RecordKind.UPDATES, 1, txn, i, i, 1, os.urandom(rng.randint(0, 300))),
                           Record(RecordKind.COMMIT, txn_id=txn, body=body)])
    return groups


@pytest.mark.parametrize("seed", range(4))
def test_recovered_records_equal_a_full_scan(tmp_path, seed):
    """What the open kept (headers, COMMIT bodies) says exactly what a full read of the log
    says, over several segments (small segment size) and every record kind."""
    rng = random.Random(seed)
    log = FileLog.open(str(tmp_path), create=True, segment_bytes=64 << 10)
    for group in mixed_records(rng, 120):
        log.append(group)
    log.close()
    assert len(seg_files(str(tmp_path))) > 2
    log = FileLog.open(str(tmp_path), segment_bytes=64 << 10, keep_recovered=True)
    try:
        got = list(log.recovered())
        assert log.recovered() is None  # handed out once, then released
        full = list(log.scan())
        assert [(r.lsn, r.kind, r.relation_id, r.txn_id, r.t_lo, r.t_hi, r.count, r.body_len) for r in got] == \
            [(r.lsn, r.kind, r.relation_id, r.txn_id, r.t_lo, r.t_hi, r.count, len(r.body)) for r in full]
        for g, f in zip(got, full, strict=True):
            if f.kind == RecordKind.COMMIT:
                assert g.body == f.body and rec.committed_txn_ids(g) == rec.committed_txn_ids(f)
            assert isinstance(g.kind, RecordKind)
    finally:
        log.close()


def frames_at(path: str, offsets) -> list[Record]:
    """The records whose frames start at ``offsets`` in the file, each checked on its own."""
    with open(path, "rb") as f:
        view = memoryview(f.read())
    out = []
    for off in offsets:
        u, why = rec.check_frame(view, off)
        assert u is not None, why
        out.append(rec.record_of(u, view[off + rec.HEADER_SIZE:off + rec.HEADER_SIZE + u[4]]))
    return out


def test_keep_heads_matches_records_of_the_same_scan(tmp_path):
    log = FileLog.open(str(tmp_path), create=True)
    for group in mixed_records(random.Random(9), 60):
        log.append(group)
    log.close()
    path = seg_files(str(tmp_path))[0]
    scan = sg.scan_segment(path, 0, keep_heads=True, buf=sg.ReadBuffer())
    records = frames_at(path, scan.offsets)
    heads = list(rec.head_records(scan.heads, scan.bodies))
    assert [h.lsn for h in heads] == [r.lsn for r in records] == list(range(len(scan.offsets)))
    assert [h.body_len for h in heads] == [len(r.body) for r in records]
    assert scan.bodies == {r.lsn: r.body for r in records if r.kind == RecordKind.COMMIT and r.body}


def test_a_reused_buffer_never_leaks_one_segment_into_the_next(tmp_path):
    """A big segment read first, then a shorter one into the same buffer: the shorter one's
    scan must end at its own end, not walk on into stale bytes of the first."""
    log = FileLog.open(str(tmp_path), create=True, segment_bytes=64 << 10)
    for i in range(40):
        log.append([Record(RecordKind.UPDATES, 1, 0, i, i, 1, os.urandom(5000))])
    log.close()
    files = seg_files(str(tmp_path))
    firsts = [int(os.path.basename(p)[:-4]) for p in files]
    buf = sg.ReadBuffer()
    shared = [sg.scan_segment(p, f, buf=buf) for p, f in zip(files, firsts, strict=True)]
    alone = [sg.scan_segment(p, f) for p, f in zip(files, firsts, strict=True)]
    assert [(s.end, list(s.offsets), s.clean) for s in shared] == [(s.end, list(s.offsets), s.clean) for s in alone]
    assert all(s.clean for s in shared)


def _fill_engine(d: str) -> None:
    """A WAL to open whose updates are still uncompacted: the compacter runs, on a manual
    clock that never reaches its interval, and no segment fills up."""
    with sediment.open(d, segment_bytes=1 << 20, clock=ManualClock()) as engine:
        engine.add_relation("r", pa.schema([("id", pa.int64())]))
        for t in range(1, 40):
            engine.append("r", pa.table({"id": list(range(500)), "time": [t] * 500, "diff": [1] * 500}))
            engine.seal("r", t)


def test_engine_open_reads_the_log_once_and_gives_the_same_answers(tmp_path, monkeypatch):
    d = str(tmp_path / "data")
    _fill_engine(d)
    scans = []
    real_scan = FileLog.scan

    def counting_scan(self, start=None):
        scans.append(start)
        return real_scan(self, start)

    monkeypatch.setattr(FileLog, "scan", counting_scan)
    with sediment.open(d, segment_bytes=1 << 20) as engine:
        assert scans == []  # the engine applied what the log's open verified
        assert engine.wal.recovered() is None
        snap = engine.snapshot("r", as_of=39)
        assert engine.sealed("r") == 39
    assert snap.num_rows == 500 and sorted(snap.column("diff").to_pylist()) == [39] * 500


def test_damage_in_an_update_body_is_still_refused_at_open(tmp_path):
    """Bodies the engine does not keep at open are still checksummed by it."""
    d = str(tmp_path / "data")
    _fill_engine(d)
    files = seg_files(os.path.join(d, "wal"))
    victim = files[len(files) // 2]
    scan = sg.scan_segment(victim, int(os.path.basename(victim)[:-4]))
    ends = [*scan.offsets[1:], scan.end]
    start, _end = max(zip(scan.offsets, ends, strict=True), key=lambda se: se[1] - se[0])  # an UPDATES frame
    at = start + rec.HEADER_SIZE + 10
    with open(victim, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x40]))
    with pytest.raises(WalCorruption) as err:
        sediment.open(d, segment_bytes=1 << 20)
    assert victim in str(err.value)


def _model_scan(path: str, first_lsn: int) -> tuple[list[int], int, int]:
    """The plain reading of a segment: the whole written file in one buffer, frame by frame
    with decode_header/body_ok. (offsets, end, bad offset or -1)."""
    with open(path, "rb") as f:
        data = f.read()
    view = memoryview(data)
    pos, lsn, offsets = sg.HEADER_SIZE, first_lsn, []
    while pos < len(data):
        head = rec.decode_header(view, pos)
        if head is None or head.lsn != lsn or pos + head.frame_size > len(data) or \
                not rec.body_ok(head, view[pos + rec.HEADER_SIZE:pos + head.frame_size]):
            return offsets, pos, (-1 if data.count(0, pos) == len(data) - pos else pos)
        offsets.append(pos)
        pos += head.frame_size
        lsn += 1
    return offsets, pos, -1


@pytest.mark.parametrize("seed", range(3))
def test_windowed_scan_agrees_with_reading_the_whole_file(tmp_path, seed):
    """Frames of every size across the read window's edges (and one bigger than the window),
    then damage placed past the first window: the windowed walk finds the same records,
    end, damage offset and resume point as a whole-file read."""
    rng = random.Random(seed)
    log = FileLog.open(str(tmp_path), create=True, segment_bytes=64 << 20)
    sizes = [rng.choice([0, 1, 100, 9000, 70000, 300000]) for _ in range(120)] + [9 << 20] + [5000] * 200
    rng.shuffle(sizes)
    for n in sizes:
        log.append([Record(RecordKind.UPDATES, 1, 0, 1, 1, 1, os.urandom(n))])
    log.close()
    path = seg_files(str(tmp_path))[0]
    buf = sg.ReadBuffer()
    scan = sg.scan_segment(path, 0, buf=buf)
    offsets, end, bad = _model_scan(path, 0)
    assert scan.end > 2 * (8 << 20) and list(scan.offsets) == offsets and scan.end == end and bad == -1 and scan.clean
    k = next(i for i, o in enumerate(offsets[:-1]) if o > (8 << 20) + 1000 and offsets[i + 1] - o > rec.HEADER_SIZE + 1)
    victim, after = offsets[k], offsets[k + 1]  # a record with a body, past the first window
    with open(path, "r+b") as f:
        f.seek(victim + rec.HEADER_SIZE + 1)
        b = f.read(1)
        f.seek(victim + rec.HEADER_SIZE + 1)
        f.write(bytes([b[0] ^ 1]))
    damaged = sg.scan_segment(path, 0, buf=buf)
    model_offsets, _end, bad = _model_scan(path, 0)
    assert list(damaged.offsets) == model_offsets == offsets[:k]
    assert damaged.bad_offset == bad == victim and damaged.reason == "record body fails its checksum"
    assert damaged.valid_after_bad and damaged.resume == (after, k + 1)
