"""Issue 12, findings 1, 2, 4 and 9 for the file log: every loss is detected.

Each test reproduces one finding: a hole left by overlapping trims and a crash, deleted or
shortened segments, a missing control file, and ``verify`` disagreeing with open.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from sediment.engine.verify import VerifyReport, verify_wal
from sediment.errors import WalCorruption, WalError, WalMissing
from sediment.wal import manifest as mf
from sediment.wal import segment as sg
from sediment.wal.control import CONTROL_NAME
from sediment.wal.file_log import FileLog
from sediment.wal.record import Record, RecordKind

SMALL = 8192


def updates(rel: int, t: int, body: bytes) -> Record:
    return Record(RecordKind.UPDATES, relation_id=rel, t_lo=t, t_hi=t, count=1, body=body)


def seg_files(root: str) -> list[str]:
    d = os.path.join(root, "0")
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".seg"))


def build(root: str, n: int = 60, *, close: bool = True) -> dict[int, bytes]:
    """A log over several segments: relation 7 gets update t and, every 10, ``close t``.
    Returns every acknowledged update body by LSN."""
    log = FileLog.open(root, create=True, segment_bytes=SMALL)
    acked = {}
    for t in range(n):
        body = (b"%06d" % t) * 150
        acked[log.append([updates(7, t, body)])] = body
        if t % 10 == 9:
            log.append([Record(RecordKind.PROGRESS, relation_id=7, t_lo=t, t_hi=t)])
    acked[-1] = log.end_lsn  # type: ignore[assignment]  # the end, popped by the callers that need it
    if close:
        log.close()
    acked.pop(-1)
    return acked


def contents(log: FileLog) -> dict[int, bytes]:
    return {r.lsn: bytes(r.body) for r in log.scan() if r.kind == RecordKind.UPDATES}


def verify_ok(root: str) -> tuple[bool, VerifyReport]:
    report = VerifyReport()
    verify_wal(root, report)
    return report.ok, report


def opens(root: str) -> bool:
    try:
        FileLog.open(root, segment_bytes=SMALL).close()
    except WalError:
        return False
    return True


# --- finding 1: overlapping trims and a crash leave a hole --------------------------------------


def test_crash_after_a_later_range_was_deleted_before_an_earlier_one_opens_cleanly(tmp_path):
    """The crash state of finding 1: the second trim's files are gone, the first's not yet.
    Both trims recorded their start in the manifest before deleting anything, so what is
    left below the start is garbage, deleted quietly; nothing acknowledged is lost."""
    root = str(tmp_path / "wal")
    acked = build(root)
    before = seg_files(root)
    assert len(before) >= 6
    log = FileLog.open(root, segment_bytes=SMALL)
    starts = [s.first_lsn for s in log._segments]
    image = str(tmp_path / "image")
    shutil.copytree(root, image)  # the files as they were before the trims
    log.trim(starts[2])
    log.trim(starts[4])
    kept = contents(log)
    log.close()
    shutil.copy(os.path.join(root, mf.manifest_name(0)), os.path.join(image, mf.manifest_name(0)))
    os.unlink(before[3].replace(root, image))  # the later range deleted first; 0..2 still there
    reopened = FileLog.open(image, segment_bytes=SMALL)
    assert reopened.start_lsn == starts[4]
    assert contents(reopened) == kept == {k: v for k, v in acked.items() if k >= starts[4]}
    assert [os.path.basename(p) for p in seg_files(image)] == [os.path.basename(p) for p in seg_files(root)]
    assert {p.kind for p in reopened.problems} == {"garbage"}
    reopened.close()
    assert verify_ok(image)[0]


TRIMMER = textwrap.dedent("""
    import sys, threading
    from sediment.wal.file_log import FileLog
    from sediment.wal.record import Record, RecordKind
    log = FileLog.open(sys.argv[1], segment_bytes=8192, create=True)
    for t in range(400):
        log.append([Record(RecordKind.UPDATES, relation_id=7, t_lo=t, t_hi=t, body=(b"%06d" % t) * 50)])
    print("ready", log.start_lsn, log.end_lsn, flush=True)
    def trims(step):
        for lsn in range(step, log.end_lsn, 3):
            log.trim(lsn)
            print("trimmed", lsn, flush=True)
    threads = [threading.Thread(target=trims, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("done", flush=True)
""")


@pytest.mark.parametrize("kill_after", [1, 7, 30, 90])
def test_sigkill_during_overlapping_trims_from_threads_loses_nothing(tmp_path, kill_after):
    """Two threads trim at once (as the engine's Collector can) and the process is SIGKILLed:
    the log opens, holds one contiguous run of LSNs up to the end, and every record at or
    above the recorded start is the one that was written."""
    root = str(tmp_path / "wal")
    proc = subprocess.Popen([sys.executable, "-c", TRIMMER, root], stdout=subprocess.PIPE, text=True)
    end = None
    try:
        seen = 0
        for line in proc.stdout:
            if line.startswith("ready"):
                end = int(line.split()[2])
            elif line.startswith("trimmed"):
                seen += 1
                if seen >= kill_after:
                    break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert end is not None
    log = FileLog.open(root, segment_bytes=SMALL)
    records = list(log.scan())
    assert log.end_lsn == end and not [p for p in log.problems if p.fatal]
    assert [r.lsn for r in records] == list(range(log.start_lsn, end))
    ts = [r.t_lo for r in records if r.kind == RecordKind.UPDATES]
    assert ts == list(range(ts[0], 400))
    assert all(bytes(r.body) == (b"%06d" % r.t_lo) * 50 for r in records if r.kind == RecordKind.UPDATES)
    log.close()
    assert verify_ok(root)[0]


def test_trims_from_many_threads_are_serialized_and_leave_no_hole(tmp_path):
    root = str(tmp_path / "wal")
    acked = build(root, 200)
    log = FileLog.open(root, segment_bytes=SMALL)
    target = sorted(acked)[150]
    barrier = threading.Barrier(4)

    def trim(lsns):
        barrier.wait()
        for lsn in lsns:
            log.trim(lsn)

    threads = [threading.Thread(target=trim, args=(range(k, target, 4),)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    firsts = [int(os.path.basename(p)[:-4]) for p in seg_files(root)]
    assert firsts == [s.first_lsn for s in log._segments]
    assert mf.read(root, 0).start_lsn == firsts[0]
    log.close()
    again = FileLog.open(root, segment_bytes=SMALL)
    assert contents(again) == {k: v for k, v in acked.items() if k >= firsts[0]}
    again.close()


# --- finding 2: missing or shortened files ---------------------------------------------------------


def test_deleted_oldest_segment_is_a_typed_error_naming_its_lsns(tmp_path):
    root = str(tmp_path / "wal")
    build(root)
    oldest = seg_files(root)[0]
    last = sg.scan_segment(oldest, 0).next_lsn - 1
    os.unlink(oldest)
    with pytest.raises(WalMissing) as err:
        FileLog.open(root, segment_bytes=SMALL)
    assert err.value.path == oldest and (err.value.first_lsn, err.value.last_lsn) == (0, last)
    assert f"LSNs [0, {last}]" in str(err.value)
    ok, report = verify_ok(root)
    assert not ok and any(oldest in p and "missing" in p for p in report.problems)


def test_deleted_active_segment_is_a_typed_error(tmp_path):
    root = str(tmp_path / "wal")
    acked = build(root)
    active = seg_files(root)[-1]
    os.unlink(active)
    with pytest.raises(WalMissing) as err:
        FileLog.open(root, segment_bytes=SMALL)
    assert err.value.path == active and err.value.last_lsn >= max(acked)
    assert not opens(root) and not verify_ok(root)[0]
    assert not os.path.exists(active)  # never re-created as a fresh segment


def test_active_segment_cut_at_a_record_boundary_is_detected(tmp_path):
    root = str(tmp_path / "wal")
    build(root)
    end = mf.read(root, 0).durable_end
    active = seg_files(root)[-1]
    first = int(os.path.basename(active)[:-4])
    scan = sg.scan_segment(active, first)
    with open(active, "r+b") as f:  # exactly at a record boundary: every frame left is valid
        f.truncate(scan.offsets[len(scan.offsets) // 2])
    with pytest.raises(WalMissing, match="before the durable end") as err:
        FileLog.open(root, segment_bytes=SMALL)
    assert err.value.path == active and err.value.last_lsn == end - 1
    assert not verify_ok(root)[0]


def test_shortened_finished_segment_is_detected(tmp_path):
    root = str(tmp_path / "wal")
    build(root)
    victim = seg_files(root)[1]
    first = int(os.path.basename(victim)[:-4])
    scan = sg.scan_segment(victim, first)
    with open(victim, "r+b") as f:
        f.truncate(scan.offsets[-1])
    with pytest.raises(WalMissing) as err:
        FileLog.open(root, segment_bytes=SMALL)
    assert err.value.path == victim and err.value.first_lsn == err.value.last_lsn == scan.next_lsn - 1
    assert not verify_ok(root)[0]


def test_creating_a_log_is_explicit(tmp_path):
    root = str(tmp_path / "wal")
    with pytest.raises(WalMissing):
        FileLog.open(root)
    assert not os.path.exists(root)
    build(root)
    log = FileLog.open(root, create=True)  # create on an existing log opens it, never starts over
    assert log.end_lsn > 0 and not log.created
    log.close()


def test_engine_refuses_lost_metadata_and_a_lost_log(tmp_path):
    import sediment
    from sediment.errors import MetadataMissing

    d = tmp_path / "data"
    with sediment.open(d) as engine:
        import pyarrow as pa

        engine.add_relation("r", pa.schema([("k", pa.int64())]))
        engine.append("r", pa.table({"k": [1], "time": pa.array([1], pa.uint64()), "diff": [1]}))
    shutil.move(str(d / "meta"), str(tmp_path / "meta-aside"))
    with pytest.raises(MetadataMissing):
        sediment.open(d)
    assert not (d / "meta").exists()
    shutil.move(str(tmp_path / "meta-aside"), str(d / "meta"))
    shutil.rmtree(d / "wal")
    with pytest.raises(WalMissing):
        sediment.open(d)
    assert not (d / "wal").exists()


# --- finding 4: a missing control file --------------------------------------------------------------


def test_missing_control_file_is_refused_and_never_rewritten(tmp_path):
    root = str(tmp_path / "wal")
    acked = build(root)
    key = mf.read(root, 0).cluster_key
    os.unlink(os.path.join(root, CONTROL_NAME))
    for create in (False, True):
        with pytest.raises(WalMissing, match="control file"):
            FileLog.open(root, segment_bytes=SMALL, create=create)
        assert not os.path.exists(os.path.join(root, CONTROL_NAME))
    assert not verify_ok(root)[0]
    repaired = FileLog.open(root, segment_bytes=SMALL, repair=True)  # rebuilt with the log's own key
    assert repaired.cluster_key == key and contents(repaired) == acked
    assert not [p for p in repaired.problems if p.lost]
    repaired.close()
    assert verify_ok(root)[0]


# --- finding 9: verify agrees with open -------------------------------------------------------------


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def _damages(root: str) -> dict:
    segs = seg_files(root)
    second = sg.scan_segment(segs[1], int(os.path.basename(segs[1])[:-4]))
    active = segs[-1]
    a_first = int(os.path.basename(active)[:-4])
    a_scan = sg.scan_segment(active, a_first)
    return {
        "none": lambda: None,
        "flip in finished segment": lambda: _flip(segs[1], second.offsets[2] + 70),
        "flip in active header": lambda: _flip(active, 40),
        "flip in finished header": lambda: _flip(segs[0], 40),
        "delete oldest": lambda: os.unlink(segs[0]),
        "delete middle": lambda: os.unlink(segs[2]),
        "delete active": lambda: os.unlink(active),
        "cut active at record": lambda: os.truncate(active, a_scan.offsets[-1]),
        "cut active mid record": lambda: os.truncate(active, a_scan.offsets[-1] + 30),
        "delete control": lambda: os.unlink(os.path.join(root, CONTROL_NAME)),
        "delete manifest": lambda: os.unlink(os.path.join(root, mf.manifest_name(0))),
        "flip manifest": lambda: _flip(os.path.join(root, mf.manifest_name(0)), 130),
        "delete an index": lambda: os.unlink(segs[1][:-4] + ".idx"),
        "garbage after active": lambda: open(active, "r+b").write(b"") or _append_garbage(active, a_scan.end),
        "extra bytes on finished": lambda: _append_garbage(segs[1], os.path.getsize(segs[1])),
    }


def _append_garbage(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(b"\x13\x37" * 20)


def test_verify_exit_agrees_with_open_over_damages(tmp_path):
    base = str(tmp_path / "base")
    acked = build(base)
    names = list(_damages(base))
    outcomes = {}
    for i, name in enumerate(names):
        root = str(tmp_path / f"case{i}")
        shutil.copytree(base, root)
        _damages(root)[name]()
        ok, report = verify_ok(root)
        try:
            log = FileLog.open(root, segment_bytes=SMALL)
        except WalError as exc:
            assert isinstance(exc, (WalCorruption, WalMissing)), name
            opened = False
        else:
            opened = True
            got = contents(log)
            log.close()
            assert got == acked, name  # an open that succeeds lost nothing acknowledged
        assert ok == opened, (name, report.problems, report.notes)
        outcomes[name] = opened
    assert outcomes["none"] and outcomes["delete an index"]
    assert not any(outcomes[n] for n in ("delete oldest", "delete active", "cut active at record",
                                         "delete control", "delete manifest", "flip in active header"))


def test_repair_keeps_what_verifies_after_a_hole(tmp_path):
    """Finding 1's repair: a hole in the middle loses only the hole; every later segment is
    kept, appends resume past the highest LSN ever acknowledged, and the loss is recorded so
    the next open and verify are clean."""
    root = str(tmp_path / "wal")
    acked = build(root)
    segs = seg_files(root)
    hole_first = int(os.path.basename(segs[2])[:-4])
    hole_last = int(os.path.basename(segs[3])[:-4]) - 1
    os.unlink(segs[2])
    log = FileLog.open(root, segment_bytes=SMALL, repair=True)
    (lost,) = [p for p in log.problems if p.lost]
    assert (lost.first_lsn, lost.last_lsn) == (hole_first, hole_last)
    assert 7 in lost.relations  # the sealed frontier of relation 7 moved across the hole
    assert contents(log) == {k: v for k, v in acked.items() if not hole_first <= k <= hole_last}
    end = log.end_lsn
    lsn = log.append([updates(7, 99, b"after")])
    assert lsn == end
    log.close()
    assert opens(root) and verify_ok(root)[0]


def test_manifest_every_byte_flip_is_caught_or_harmless():
    """Pure decode, exhaustively: a flipped bit anywhere either fails the checks with
    WalCorruption or only hits one end slot, whose loss leaves the other (an older, valid
    lower bound) in force."""
    import uuid

    m = mf.Manifest(uuid.uuid4(), 0, start_lsn=6, active_first=40, generation=3,
                    finished=[mf.FinishedSegment(6, 16, 9000), mf.FinishedSegment(17, 39, 8800)],
                    durable_end=50, end_sequence=4)
    data = mf.pack(m)
    assert mf.unpack(data, "m") == m
    for i in range(len(data)):
        for bit in range(8):
            bad = bytearray(data)
            bad[i] ^= 1 << bit
            try:
                got = mf.unpack(bytes(bad), "m")
            except WalCorruption as exc:
                assert exc.path == "m"
                continue
            assert mf.SLOTS_AT <= i < mf.TABLE_AT, i
            assert got.durable_end == m.durable_end and got.finished == m.finished
    for n in range(len(data)):
        with pytest.raises(WalCorruption):
            mf.unpack(data[:n], "m")


def test_a_torn_end_slot_falls_back_to_the_older_one(tmp_path):
    root = str(tmp_path / "wal")
    build(root)
    m = mf.read(root, 0)
    older = m.durable_end
    mf.write_end(root, m, older + 5)
    path = os.path.join(root, mf.manifest_name(0))
    slot = mf.SLOTS_AT + (m.end_sequence % 2) * mf.SLOT_SIZE
    _flip(path, slot + 9)  # the newer slot torn by a crash
    assert mf.read(root, 0).durable_end == older


def _engine_dir(d, rounds: int = 40):
    """An engine data directory whose log spans several segments; returns the expected sum of
    k (weighted by diff) as of the last sealed time."""
    import pyarrow as pa

    import sediment

    total = 0
    with sediment.open(d, segment_bytes=SMALL) as engine:
        engine.add_relation("r", pa.schema([("k", pa.int64())]))
        for t in range(1, rounds + 1):
            ks = list(range(t * 10, t * 10 + 20))
            engine.append("r", pa.table({"k": ks, "time": pa.array([t] * len(ks), pa.uint64()),
                                         "diff": [1] * len(ks)}))
            engine.seal("r", t)
            total += sum(ks)
    return total, rounds


def _engine_opens(d, total: int, sealed: int) -> bool:
    import pyarrow.compute as pc

    import sediment
    from sediment.errors import SedimentError

    try:
        engine = sediment.open(d, segment_bytes=SMALL)
    except SedimentError:
        return False
    with engine:
        snap = engine.snapshot("r", sealed)
        assert pc.sum(pc.multiply(snap["k"], snap["diff"])).as_py() == total  # never a wrong answer
    return True


def test_engine_verify_agrees_with_open(tmp_path):
    """Finding 9 on whole data directories: `verify`'s verdict is exactly whether the engine
    opens, and an engine that opens answers correctly."""
    from sediment.engine.verify import verify_data_dir

    base = tmp_path / "base"
    total, sealed = _engine_dir(base)
    wal = base / "wal"
    segs = seg_files(str(wal))  # background compaction may have trimmed all but the active one
    cases = {
        "none": lambda d: None,
        "delete active": lambda d: os.unlink(d / "wal" / "0" / os.path.basename(segs[-1])),
        "cut active at record": lambda d: os.truncate(
            d / "wal" / "0" / os.path.basename(segs[-1]),
            sg.scan_segment(segs[-1], int(os.path.basename(segs[-1])[:-4])).offsets[-1]),
        "delete control": lambda d: os.unlink(d / "wal" / CONTROL_NAME),
        "delete manifest": lambda d: os.unlink(d / "wal" / mf.manifest_name(0)),
        "delete meta": lambda d: shutil.rmtree(d / "meta"),
        "delete wal": lambda d: shutil.rmtree(d / "wal"),
        "delete an index": lambda d: os.unlink(d / "wal" / "0" / (os.path.basename(segs[-1])[:-4] + ".idx")),
    }
    verdicts = {}
    for i, (name, damage) in enumerate(cases.items()):
        d = tmp_path / f"case{i}"
        shutil.copytree(base, d)
        damage(d)
        ok = verify_data_dir(str(d)).ok
        opened = _engine_opens(d, total, sealed)
        assert ok == opened, name
        verdicts[name] = opened
    assert verdicts["none"] and verdicts["delete an index"]
    assert not any(v for k, v in verdicts.items() if k not in ("none", "delete an index"))


def test_cli_repair_of_a_missing_control_file_keeps_every_record(tmp_path, capsys):
    """Finding 4 end to end: verify fails, open fails and writes nothing, verify --repair
    rebuilds the control file with the log's own cluster key and loses nothing."""
    from sediment.cli import main

    d = tmp_path / "data"
    total, sealed = _engine_dir(d, 10)
    key = mf.read(str(d / "wal"), 0).cluster_key
    os.unlink(d / "wal" / CONTROL_NAME)
    assert main(["--data-dir", str(d), "verify"]) == 1
    assert "control file missing" in capsys.readouterr().out
    assert not _engine_opens(d, total, sealed)
    assert not (d / "wal" / CONTROL_NAME).exists()
    assert main(["--data-dir", str(d), "verify", "--repair"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "ok: no problems"
    from sediment.wal.control import ControlFile

    assert ControlFile.open(str(d / "wal")).header.cluster_key == key
    assert _engine_opens(d, total, sealed)


def test_cli_repair_across_a_hole_keeps_the_later_records_and_reports_the_loss(tmp_path, capsys):
    """Finding 1's repair on an engine: with a segment missing from the middle of the log,
    --repair refuses without --force (acknowledged records), then keeps everything after
    the hole -- the greatest sealed time does not fall -- and the JSON report names the
    hole's LSNs and the relation whose times it held."""
    import json

    import pyarrow as pa

    import sediment
    from sediment.cli import main

    d = tmp_path / "data"
    with sediment.open(d, segment_bytes=SMALL) as engine:
        engine.add_relation("r", pa.schema([("k", pa.int64())]))
        for t in range(1, 61):
            engine.append("r", pa.table({"k": list(range(20)), "time": pa.array([t] * 20, pa.uint64()),
                                         "diff": [1] * 20}))
            engine.seal("r", t)
            if t == 1:  # a reader's lease: nothing is trimmed while it holds, so the log keeps its segments
                engine.plan_read("r", 1)
    root = str(d / "wal")
    segs = seg_files(root)
    assert len(segs) >= 4
    hole = (int(os.path.basename(segs[1])[:-4]), int(os.path.basename(segs[2])[:-4]) - 1)
    os.unlink(segs[1])
    with pytest.raises(WalMissing, match=rf"LSNs \[{hole[0]}, {hole[1]}\].*relation 'r'") as err:
        sediment.open(d)  # the open names the lost range and the relation whose times it held
    assert err.value.path == segs[1]
    assert main(["--data-dir", str(d), "verify"]) == 1
    capsys.readouterr()
    assert main(["--data-dir", str(d), "verify", "--repair"]) == 1
    err = capsys.readouterr().err
    assert "--force" in err and f"LSNs [{hole[0]}, {hole[1]}]" in err and "relation 'r'" in err
    assert main(["--data-dir", str(d), "verify"]) == 1  # refused: nothing changed
    capsys.readouterr()
    assert main(["--data-dir", str(d), "verify", "--repair", "--force"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "ok: no problems"
    (report,) = [line.split(": ", 1)[1] for line in out.splitlines()
                 if line.startswith("repair report:") and line.endswith(".json")]
    (lost,) = json.loads(open(report).read())["lost"]
    assert (lost["first_lsn"], lost["last_lsn"]) == hole and "r" in lost["relations"]
    with sediment.open(d) as engine:
        assert engine.sealed("r") == 60


def test_missing_manifest_is_refused_then_rebuilt_by_repair_with_every_record(tmp_path):
    root = str(tmp_path / "wal")
    acked = build(root)
    os.unlink(os.path.join(root, mf.manifest_name(0)))
    with pytest.raises(WalMissing, match="manifest"):
        FileLog.open(root, segment_bytes=SMALL)
    report = VerifyReport()
    verify_wal(root, report, repair=True)
    assert not [p for p in report.wal_findings if p.lost]  # nothing to lose: no --force needed
    log = FileLog.open(root, segment_bytes=SMALL, repair=True)
    assert contents(log) == acked
    log.close()
    assert opens(root) and verify_ok(root)[0]


def test_a_stale_copy_of_the_log_is_refused_by_open_and_verify(tmp_path):
    """The traces prove how far the log reached: a log restored from an older copy (whole
    and self-consistent) ends before a trace's wal_through, so open and verify refuse it."""
    import pyarrow as pa

    import sediment
    from sediment.engine.verify import verify_data_dir

    d = tmp_path / "data"
    with sediment.open(d, segment_bytes=SMALL) as engine:
        engine.add_relation("r", pa.schema([("k", pa.int64())]))
        engine.append("r", pa.table({"k": [1], "time": pa.array([1], pa.uint64()), "diff": [1]}))
    shutil.copytree(d / "wal", tmp_path / "old-wal")
    with sediment.open(d, segment_bytes=SMALL) as engine:
        for t in range(2, 30):
            engine.append("r", pa.table({"k": [t] * 30, "time": pa.array([t] * 30, pa.uint64()), "diff": [1] * 30}))
            engine.seal("r", t)
        engine.compact()
    assert verify_data_dir(str(d)).ok
    shutil.rmtree(d / "wal")
    shutil.copytree(tmp_path / "old-wal", d / "wal")
    report = verify_data_dir(str(d))
    assert not report.ok and any("wal_through" in p or "ends at LSN" in p for p in report.problems)
    with pytest.raises(WalMissing, match="relation 'r'"):
        sediment.open(d, segment_bytes=SMALL)


def test_repair_of_damage_keeps_the_original_bytes(tmp_path):
    root = str(tmp_path / "wal")
    acked = build(root)
    victim = seg_files(root)[1]
    first = int(os.path.basename(victim)[:-4])
    scan = sg.scan_segment(victim, first)
    _flip(victim, scan.offsets[3] + 80)
    original = open(victim, "rb").read()
    log = FileLog.open(root, segment_bytes=SMALL, repair=True)
    (lost,) = [p for p in log.problems if p.lost]
    # only the damaged record is lost: the records after it verify and are kept (their own segment)
    assert (lost.path, lost.offset, lost.first_lsn, lost.last_lsn) == (victim, scan.offsets[3], first + 3, first + 3)
    assert log.preserved == [f"{victim}.pre-repair-{scan.offsets[3]}"]
    assert open(log.preserved[0], "rb").read() == original
    assert contents(log) == {k: v for k, v in acked.items() if k != first + 3}
    assert os.path.exists(os.path.join(root, "0", sg.segment_name(first + 4)))
    log.close()
    assert opens(root) and verify_ok(root)[0]


def test_verify_json_lists_each_loss_with_file_offset_and_lsns(tmp_path, capsys):
    import json

    from sediment.cli import main

    d = tmp_path / "data"
    total, sealed = _engine_dir(d, 5)
    active = seg_files(str(d / "wal"))[-1]
    first = int(os.path.basename(active)[:-4])
    scan = sg.scan_segment(active, first)
    os.truncate(active, scan.offsets[-1])
    assert main(["--data-dir", str(d), "verify", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    (loss,) = [w for w in doc["wal"] if w["lost"]]
    assert (loss["path"], loss["kind"], loss["first_lsn"]) == (active, "shortened", scan.next_lsn - 1)
    assert not doc["ok"] and doc["problems"]
    assert not _engine_opens(d, total, sealed)


@pytest.mark.parametrize("seed", range(3))
def test_verify_agrees_with_open_on_random_damage(tmp_path, seed):
    """Seeded random damage to every file kind of the log (bit flips, truncation anywhere,
    zeroed 4 KiB pages, appended garbage, deletion): verify's verdict equals open's, an open
    that succeeds returns every acknowledged record unchanged, and a refusal is typed."""
    import random

    rng = random.Random(seed)
    base = str(tmp_path / "base")
    acked = build(base)
    files = sorted(os.path.join(dp, n) for dp, _, ns in os.walk(base) for n in ns)
    for trial in range(40):
        root = str(tmp_path / f"t{trial}")
        shutil.copytree(base, root)
        victim = rng.choice(files).replace(base, root)
        size = os.path.getsize(victim)
        kind = rng.choice(["flip", "truncate", "zero page", "garbage", "delete"])
        if kind == "flip" and size:
            _flip(victim, rng.randrange(size))
        elif kind == "truncate":
            os.truncate(victim, rng.randrange(size + 1))
        elif kind == "zero page" and size:
            with open(victim, "r+b") as f:
                at = rng.randrange(0, size, 4096) if size > 4096 else 0
                f.seek(at)
                f.write(bytes(min(4096, size - at)))
        elif kind == "garbage":
            with open(victim, "ab") as f:
                f.write(rng.randbytes(rng.randrange(1, 200)))
        elif kind == "delete":
            os.unlink(victim)
        ok, report = verify_ok(root)
        try:
            log = FileLog.open(root, segment_bytes=SMALL)
        except WalError as exc:
            assert isinstance(exc, (WalCorruption, WalMissing)), (kind, victim, exc)
            opened = False
        else:
            opened = True
            got = contents(log)
            log.close()
            assert got == acked, (kind, victim)
        assert ok == opened, (kind, victim, report.problems, report.notes)
        shutil.rmtree(root)
