"""What an engine open writes to disk: only what changed.

Every open used to rewrite the log manifest (temporary file, fsync, rename, directory
fsync), record a new session in the control file, fsync the active segment, and fold the
metadata journal into a new snapshot and a new journal before appending the open's epoch:
nine syncs and three renames for a reopen of an engine nothing had touched. Now a reopen
after a clean close syncs once (the epoch, one journal record: transaction ids stay unique
across opens), and an open after a crash still makes what it read back durable before it
records it (the manifest's end slot, in place).

The syncs and renames are counted by wrapping ``os`` in this process (each call still
runs); the engine itself is real, and the crash is a real process killed with SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

import sediment
from sediment.clock import ManualClock
from sediment.wal import manifest as mf

SCHEMA = pa.schema([("id", pa.int64())])


def rows(first: int, n: int, t: int) -> pa.Table:
    return pa.table({"id": pa.array(range(first, first + n), pa.int64()), "time": pa.array([t] * n, pa.int64()),
                     "diff": pa.array([1] * n, pa.int64())})


class Calls:
    """Each fsync/fdatasync (with the path of its descriptor) and rename/replace in this process."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.syncs: list[str] = []
        self.renames: list[str] = []
        real = {name: getattr(os, name) for name in ("fsync", "fdatasync", "rename", "replace")}

        def sync(name):
            def call(fd):
                n = fd if isinstance(fd, int) else fd.fileno()
                self.syncs.append(os.readlink(f"/proc/self/fd/{n}"))
                return real[name](fd)
            return call

        def rename(name):
            def call(src, dst, *args, **kwargs):
                self.renames.append(os.fsdecode(dst))
                return real[name](src, dst, *args, **kwargs)
            return call

        for name in ("fsync", "fdatasync"):
            monkeypatch.setattr(os, name, sync(name))
        for name in ("rename", "replace"):
            monkeypatch.setattr(os, name, rename(name))

    def take(self) -> tuple[list[str], list[str]]:
        got = (self.syncs, self.renames)
        self.syncs, self.renames = [], []
        return got


def _files(root) -> dict[str, tuple[int, int, bytes]]:
    """Every file under ``root`` but the lock files: inode, mtime and bytes."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name not in ("LOCK", "lock"):
            st = p.stat()
            out[str(p.relative_to(root))] = (st.st_ino, st.st_mtime_ns, p.read_bytes())
    return out


def _engine_with_data(d) -> None:
    """An engine with a relation, a batch and updates still in the log, opened and closed
    cleanly a few times (the metadata journal's one fold, see metadata/journal.py, is behind)."""
    with sediment.open(d, clock=ManualClock()) as engine:
        engine.add_relation("r", SCHEMA)
        engine.append("r", rows(0, 100, 1))
        engine.seal("r", 1)
        engine.compact()
        engine.append("r", rows(100, 10, 2))
        engine.seal("r", 2)
    for _ in range(2):
        sediment.open(d, clock=ManualClock()).close()


def _ids(engine, as_of: int) -> list[int]:
    return sorted(engine.snapshot("r", as_of)["id"].to_pylist())


def test_a_reopen_after_a_clean_close_syncs_only_the_epoch(tmp_path, monkeypatch):
    d = tmp_path / "data"
    _engine_with_data(d)
    before = _files(d)
    calls = Calls(monkeypatch)
    engine = sediment.open(d, clock=ManualClock())
    opened = calls.take()
    try:
        assert _ids(engine, 2) == list(range(110))
    finally:
        engine.close()
    closed = calls.take()
    assert opened == ([str(d / "meta" / "journal")], []), opened  # the epoch's record, appended
    # the close records the journal's new end (journal.end written aside, synced, renamed, directory synced)
    assert closed == ([str(d / "meta" / "journal.end.new"), str(d / "meta")], [str(d / "meta" / "journal.end")])
    after = _files(d)
    changed = sorted(k for k in after if after[k] != before.get(k))
    assert changed == ["meta/journal", "meta/journal.end"], changed
    assert after["meta/journal"][0] == before["meta/journal"][0]  # appended in place, not replaced


def test_a_reopen_after_a_session_that_appended_writes_no_log_file_but_the_control_state(tmp_path, monkeypatch):
    d = tmp_path / "data"
    _engine_with_data(d)
    with sediment.open(d, clock=ManualClock()) as engine:
        engine.append("r", rows(110, 5, 3))
        engine.seal("r", 3)
    manifest = (d / "wal" / mf.manifest_name(0)).read_bytes()
    calls = Calls(monkeypatch)
    engine = sediment.open(d, clock=ManualClock())
    syncs, renames = calls.take()
    try:
        assert _ids(engine, 3) == list(range(115))
    finally:
        engine.close()
    # the control file's new session (its marks moved with the log) and the epoch: no rename, no manifest
    assert (syncs, renames) == ([str(d / "wal" / "sediment-wal.ctl"), str(d / "meta" / "journal")], [])
    assert (d / "wal" / mf.manifest_name(0)).read_bytes() == manifest


CRASH = textwrap.dedent("""
    import os, signal, sys
    import pyarrow as pa
    import sediment
    from sediment.clock import ManualClock
    engine = sediment.open(sys.argv[1], clock=ManualClock())
    for t in range(3, 6):
        engine.append("r", pa.table({"id": pa.array([1000 + t], pa.int64()), "time": pa.array([t], pa.int64()),
                                     "diff": pa.array([1], pa.int64())}))
        engine.seal("r", t)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_an_open_after_a_crash_makes_what_it_read_back_durable_before_recording_it(tmp_path, monkeypatch):
    """The crashed session's appends lie past the manifest's recorded durable end: the open
    syncs the active segment, then records the new end in the manifest's end slot in place
    (one sync, no rename); the next reopen writes no log file at all."""
    d = tmp_path / "data"
    _engine_with_data(d)
    proc = subprocess.run([sys.executable, "-c", CRASH, str(d)], timeout=120)
    assert proc.returncode == -signal.SIGKILL
    recorded = mf.read(str(d / "wal"), 0)
    calls = Calls(monkeypatch)
    engine = sediment.open(d, clock=ManualClock())
    syncs, renames = calls.take()
    try:
        assert _ids(engine, 5) == [*range(110), 1003, 1004, 1005]
        end = engine.storage.log.end_lsn
    finally:
        engine.close()
    wal = [p for p in syncs if p.startswith(str(d / "wal"))]
    active = [p for p in wal if p.endswith(".seg")]
    assert str(d / "wal" / mf.manifest_name(0)) in wal, wal
    assert len(active) == 1 and wal.index(active[0]) < wal.index(str(d / "wal" / mf.manifest_name(0))), wal
    assert not [r for r in renames if r.startswith(str(d / "wal"))], renames
    got = mf.read(str(d / "wal"), 0)
    assert got.durable_end == end > recorded.durable_end
    assert (got.generation, got.end_sequence) == (recorded.generation, recorded.end_sequence + 1)
    calls.take()
    sediment.open(d, clock=ManualClock()).close()
    syncs, renames = calls.take()
    assert not [p for p in syncs + renames if p.startswith(str(d / "wal"))], (syncs, renames)
