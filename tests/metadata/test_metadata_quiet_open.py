"""An open of the journal store writes nothing unless recovery must: a read-only session (or
an open the engine then refuses, tests/engine/test_open_leaves_nothing.py) leaves every file
as it was, bytes, inode and mtime. A crash's journal, a torn tail or a missing snapshot
still make the open checkpoint."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from sediment.metadata.journal import (
    END_NAME,
    JOURNAL_NAME,
    LOCK_NAME,
    SNAPSHOT_NAME,
    JournalMetadataStore,
    journal_header,
    verify,
)
from sediment.metadata.journal_format import JOURNAL_HEADER_SIZE
from sediment.metadata.protocol import Versioned


def files(d: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file's bytes, inode and mtime, but the lock's (taking it records the holder's pid)."""
    out = {}
    for p in sorted(d.iterdir()):
        if p.name != LOCK_NAME:
            st = p.stat()
            out[p.name] = (p.read_bytes(), st.st_ino, st.st_mtime_ns)
    return out


def test_a_read_only_session_leaves_every_file_as_it_was(tmp_path: Path) -> None:
    d = tmp_path / "meta"
    with JournalMetadataStore(d) as s:
        s.compare_and_set("a", b"1", None)
        s.compare_and_set("a", b"2", 0)
    before = files(d)
    assert set(before) == {SNAPSHOT_NAME, JOURNAL_NAME, END_NAME}
    assert len(before[JOURNAL_NAME][0]) > JOURNAL_HEADER_SIZE  # the session's changes are in the journal
    for _ in range(2):
        with JournalMetadataStore(d) as s:
            assert s.get("a") == Versioned(b"2", 1) and s.list("") == ["a"]
            report = s.report
        assert files(d) == before
        assert report.checkpointed is None
    assert verify(d) == []


def test_a_failed_change_after_a_quiet_open_is_refused_without_writing(tmp_path: Path) -> None:
    """A refused compare-and-set (a version conflict) is not a change: nothing is folded."""
    from sediment.errors import MetadataConflict

    d = tmp_path / "meta"
    with JournalMetadataStore(d) as s:
        s.compare_and_set("a", b"1", None)
    before = files(d)
    with JournalMetadataStore(d) as s:
        try:
            s.compare_and_set("a", b"x", 7)
        except MetadataConflict:
            pass
        else:
            raise AssertionError("a stale expected version was accepted")
    assert files(d) == before


WRITER = """
import os, signal, sys
from sediment.metadata.journal import JournalMetadataStore
s = JournalMetadataStore(sys.argv[1])
for i in range(int(sys.argv[2])):
    s.compare_and_set(f"k/{i}", b"v%d" % i, None)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_open_after_a_crash_makes_the_crashed_sessions_changes_durable(tmp_path: Path) -> None:
    d = tmp_path / "meta"
    with JournalMetadataStore(d) as s:
        s.compare_and_set("first", b"x", None)
    proc = subprocess.run([sys.executable, "-c", WRITER, str(d), "3"], timeout=60)
    assert proc.returncode == -signal.SIGKILL
    with JournalMetadataStore(d) as s:
        assert s.report.checkpointed is not None and "not closed cleanly" in s.report.checkpointed
        assert (d / JOURNAL_NAME).read_bytes() == journal_header(4)
        assert s.list("") == ["first", "k/0", "k/1", "k/2"]
    quiet = files(d)
    with JournalMetadataStore(d) as s:
        assert s.report.checkpointed is None
    assert files(d) == quiet


def test_a_session_after_the_first_fold_appends_its_changes_without_rewriting(tmp_path: Path) -> None:
    """Only a journal that still follows the first, empty snapshot (base 0) is folded before a
    session's first change (so a deleted snapshot is detected from the second writing session
    on); later sessions append to the journal they found: a change costs one record, and the
    snapshot and the journal's inode stay as they were."""
    d = tmp_path / "meta"
    with JournalMetadataStore(d) as s:
        s.compare_and_set("a", b"1", None)
    with JournalMetadataStore(d) as s:
        s.compare_and_set("b", b"1", None)  # the one fold: base 0 -> 1
    assert (d / JOURNAL_NAME).read_bytes()[:JOURNAL_HEADER_SIZE] == journal_header(1)
    for i in range(3):
        before = files(d)
        with JournalMetadataStore(d) as s:
            assert s.report.checkpointed is None
            s.compare_and_set(f"c/{i}", b"x", None)
        after = files(d)
        assert after[SNAPSHOT_NAME] == before[SNAPSHOT_NAME]
        journal, ino, _ = after[JOURNAL_NAME]
        assert ino == before[JOURNAL_NAME][1] and journal.startswith(before[JOURNAL_NAME][0])
        assert journal[:JOURNAL_HEADER_SIZE] == journal_header(1)
    with JournalMetadataStore(d) as s:
        assert s.list("") == ["a", "b", "c/0", "c/1", "c/2"]
        assert s.report.journal_entries == 4
    assert verify(d) == []
    (d / SNAPSHOT_NAME).unlink()  # the journal names a snapshot: its loss is still detected
    assert any("snapshot missing" in p for p in verify(d))
