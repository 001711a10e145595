"""Issue 12: damage to the metadata journal and snapshot. Every bit flip, truncation, zeroed
4 KiB page, appended garbage, deleted or stale file ends in MetadataCorruption or in a
reported recovery of a torn tail -- never in a silently emptier or older catalog -- and
`verify` agrees with open in every trial."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from sediment.errors import MetadataCorruption
from sediment.metadata.journal import (
    END_NAME,
    JOURNAL_NAME,
    PARTIAL_NAME,
    SNAPSHOT_NAME,
    JournalMetadataStore,
    journal_header,
    verify,
)
from sediment.metadata.journal_format import JOURNAL_HEADER_SIZE, _scan_journal
from sediment.metadata.protocol import Versioned

BEFORE, AFTER = 6, 6  # writes covered by the snapshot, then writes only in the journal


def _value(i: int) -> bytes:
    return bytes([i % 251]) * 900 + f"#{i}".encode()


def _history() -> list[dict[str, Versioned]]:
    """The acknowledged state after each write: states[j] holds writes 0..j-1."""
    states: list[dict[str, Versioned]] = [{}]
    for i in range(BEFORE + AFTER):
        states.append({**states[-1], f"k/{i}": Versioned(_value(i), 0)})
    return states


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("meta-source") / "meta"
    with JournalMetadataStore(d) as s:
        for i in range(BEFORE):
            s.compare_and_set(f"k/{i}", _value(i), None)
        s.checkpoint()
        for i in range(BEFORE, BEFORE + AFTER):
            s.compare_and_set(f"k/{i}", _value(i), None)
    assert os.path.getsize(d / JOURNAL_NAME) > 4096 + JOURNAL_HEADER_SIZE
    return d


@pytest.fixture(scope="module")
def crashed(tmp_path_factory) -> Path:
    """The same writes, but the writer is SIGKILLed instead of closing: no durable end recorded."""
    import signal
    import subprocess
    import sys

    d = tmp_path_factory.mktemp("meta-crashed") / "meta"
    script = (
        "import os, signal, sys\n"
        "from sediment.metadata.journal import JournalMetadataStore\n"
        f"value = lambda i: bytes([i % 251]) * 900 + f'#{{i}}'.encode()\n"
        f"s = JournalMetadataStore({str(d)!r})\n"
        f"for i in range({BEFORE}):\n    s.compare_and_set(f'k/{{i}}', value(i), None)\n"
        "s.checkpoint()\n"
        f"for i in range({BEFORE}, {BEFORE + AFTER}):\n    s.compare_and_set(f'k/{{i}}', value(i), None)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (d / END_NAME).exists()
    return d


STATES = _history()


def _trial(source: Path, tmp_path: Path, name: str, damage, *, crash_like: bool = False) -> str:
    """Copy the store, damage it, then open it and verify it. Returns the outcome.
    ``crash_like``: the damage is indistinguishable from a crash before a write (a cut at an
    entry boundary), so an older state without a report is the crash's own outcome."""
    d = tmp_path / name
    shutil.copytree(source, d)
    damage(d)
    problems = verify(d)
    try:
        with JournalMetadataStore(d) as s:
            got = {k: s.get(k) for k in s.list("")}
            torn = s.report.torn_tail
    except MetadataCorruption as exc:
        assert str(d) in str(exc)  # names the file
        assert problems and not all("torn tail" in p for p in problems), (name, problems)
        return "typed error"
    finally:
        shutil.rmtree(d, ignore_errors=True)
    assert not any("torn tail" not in p for p in problems), (name, problems)  # verify agrees with open
    if got == STATES[-1]:
        return "same data"
    assert got in STATES[BEFORE:], f"{name}: a catalog that was never acknowledged"
    if crash_like and torn is None:
        return "crash state"
    assert torn is not None and problems, f"{name}: silently lost writes"
    return "reported loss"


def _rewrite(name: str, edit):
    def damage(d: Path) -> None:
        path = d / name
        path.write_bytes(edit(path.read_bytes()))
    return damage


def _flip(pos: int, bit: int):
    def edit(data: bytes) -> bytes:
        b = bytearray(data)
        b[pos] ^= 1 << bit
        return bytes(b)
    return edit


@pytest.mark.parametrize("name", [JOURNAL_NAME, SNAPSHOT_NAME])
def test_bit_flips(source, tmp_path, name):
    size = os.path.getsize(source / name)
    rng = random.Random(12)
    positions = sorted({*range(0, 64), *rng.sample(range(size), 150), size - 1})
    outcomes = {_trial(source, tmp_path, f"flip{p}", _rewrite(name, _flip(p, rng.randrange(8)))) for p in positions}
    if name == SNAPSHOT_NAME:
        assert outcomes == {"typed error"}
    else:
        assert outcomes <= {"typed error", "reported loss"} and "typed error" in outcomes


@pytest.mark.parametrize("name", [JOURNAL_NAME, SNAPSHOT_NAME])
@pytest.mark.parametrize("how", ["closed", "crashed"])
def test_truncation(source, crashed, tmp_path, name, how):
    """After a clean close the journal's durable end is recorded (``journal.end``), so every cut
    -- mid-entry or at an entry boundary -- loses acknowledged changes and is refused by open
    and by verify alike. After a crash nothing records the end: a cut mid-entry is a reported
    torn tail, and a cut at an entry boundary is what a crash before the next write leaves."""
    source = source if how == "closed" else crashed
    size = os.path.getsize(source / name)
    cuts = sorted({*range(0, 40), *range(0, size, 97), size - 1})
    data = (source / name).read_bytes()
    boundaries = {JOURNAL_HEADER_SIZE, *(e.end for e in _scan_journal(data, name).entries)} \
        if name == JOURNAL_NAME else set()
    cuts = sorted({*cuts, *(b for b in boundaries if b < size)})
    outcomes = {}
    for cut in cuts:
        outcomes[cut] = _trial(source, tmp_path, f"cut{cut}", _rewrite(name, lambda data, c=cut: data[:c]),
                               crash_like=cut in boundaries and how == "crashed")
    if name == SNAPSHOT_NAME or how == "closed":
        assert set(outcomes.values()) == {"typed error"}
    else:
        assert all(outcomes[c] == "typed error" for c in cuts if c < JOURNAL_HEADER_SIZE)
        assert all(outcomes[c] == "reported loss" for c in cuts if c >= JOURNAL_HEADER_SIZE and c not in boundaries)
        # Known limit: a cut exactly at an entry boundary after a crash is what a crash before
        # the next write leaves; nothing recorded the end, so nothing can tell them apart.
        assert all(outcomes[c] in ("crash state", "same data") for c in boundaries if c < size)


def test_journal_end_record_damage_is_refused_and_its_absence_tolerated(source, tmp_path):
    """A damaged end record is damage (typed, in open and verify alike); a missing one is the
    state a crash before the close leaves, so the store opens with every write."""
    size = os.path.getsize(source / END_NAME)
    for pos in range(size):
        assert _trial(source, tmp_path, f"endflip{pos}", _rewrite(END_NAME, _flip(pos, pos % 8))) == "typed error"
    assert _trial(source, tmp_path, "endcut", _rewrite(END_NAME, lambda d: d[:-1])) == "typed error"
    assert _trial(source, tmp_path, "endrm", lambda d: (d / END_NAME).unlink()) == "same data"


@pytest.mark.parametrize("name", [JOURNAL_NAME, SNAPSHOT_NAME])
def test_zeroed_pages(source, tmp_path, name):
    size = os.path.getsize(source / name)
    for page in range(0, size, 4096):
        outcome = _trial(source, tmp_path, f"zero{page}",
                         _rewrite(name, lambda data, p=page: data[:p] + bytes(len(data[p:p + 4096])) + data[p + 4096:]))
        assert outcome in (("typed error",) if name == SNAPSHOT_NAME or page == 0 else ("typed error", "reported loss"))


@pytest.mark.parametrize("garbage", [b"\x00" * 100, b"\xff" * 3, bytes(range(256)) * 20])
def test_appended_garbage(source, tmp_path, garbage):
    assert _trial(source, tmp_path, "jgarbage", _rewrite(JOURNAL_NAME, lambda d: d + garbage)) == "same data"
    assert _trial(source, tmp_path, "sgarbage", _rewrite(SNAPSHOT_NAME, lambda d: d + garbage)) == "typed error"


def test_deleted_files(source, tmp_path):
    for name in (JOURNAL_NAME, SNAPSHOT_NAME):
        assert _trial(source, tmp_path, f"rm-{name}", lambda d, n=name: (d / n).unlink()) == "typed error"
    # The snapshot renamed aside as an incomplete checkpoint, then that file damaged: still detected.
    def partial_only(d: Path) -> None:
        os.replace(d / SNAPSHOT_NAME, d / PARTIAL_NAME)
        (d / PARTIAL_NAME).write_bytes((d / PARTIAL_NAME).read_bytes()[:-1])
    assert _trial(source, tmp_path, "partial-only", partial_only) == "typed error"


def test_stale_snapshot_is_detected(source, tmp_path):
    """An older snapshot (a restore from backup) with a journal that follows a newer one."""
    old = tmp_path / "old"
    with JournalMetadataStore(old) as s:
        s.compare_and_set("k/0", _value(0), None)
    with JournalMetadataStore(old):
        pass
    stale = (old / SNAPSHOT_NAME).read_bytes()  # ends at transaction 1
    assert _trial(source, tmp_path, "stale", lambda d: (d / SNAPSHOT_NAME).write_bytes(stale)) == "typed error"


def test_header_only_journal_after_checkpoint_and_deleted_snapshot(tmp_path):
    """The case that silently emptied the catalog before: a journal just reset by a checkpoint
    (no entries) plus a deleted snapshot. Also the journal a session's first change starts
    (the previous session's journal folded into the snapshot, then that change)."""
    for first_change in (False, True):
        d = tmp_path / f"meta-{first_change}"
        with JournalMetadataStore(d) as s:
            s.compare_and_set("catalog/relations/r", b"x", None)
        assert os.path.getsize(d / JOURNAL_NAME) > JOURNAL_HEADER_SIZE
        with JournalMetadataStore(d) as s:
            if first_change:
                s.compare_and_set("catalog/relations/s", b"y", None)
            else:
                s.checkpoint()
        assert (d / JOURNAL_NAME).read_bytes()[:JOURNAL_HEADER_SIZE] == journal_header(1)
        assert (os.path.getsize(d / JOURNAL_NAME) > JOURNAL_HEADER_SIZE) == first_change
        (d / SNAPSHOT_NAME).unlink()
        with pytest.raises(MetadataCorruption, match="snapshot missing"):
            JournalMetadataStore(d)
        assert any("snapshot missing" in p for p in verify(d))


def test_crash_states_of_a_checkpoint_open_cleanly(tmp_path):
    """The legitimate states a crash inside a checkpoint leaves are not mistaken for damage."""
    d = tmp_path / "meta"
    with JournalMetadataStore(d) as s:
        s.compare_and_set("a", b"1", None)
    journal, end = (d / JOURNAL_NAME).read_bytes(), (d / END_NAME).read_bytes()
    # Crash after the snapshot rename, before the new journal was installed: old journal (and
    # the end record of its clean close) kept, and a half-written journal.new beside it.
    with JournalMetadataStore(d) as s:
        s.checkpoint()
    (d / JOURNAL_NAME).write_bytes(journal)
    (d / END_NAME).write_bytes(end)
    (d / "journal.new").write_bytes(journal_header(1)[:7])
    assert verify(d) == []
    with JournalMetadataStore(d) as s:
        assert s.get("a") == Versioned(b"1", 0)
    assert not (d / "journal.new").exists()
    # First open crashed after creating the journal, before the first snapshot.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / JOURNAL_NAME).write_bytes(journal_header(0))
    with JournalMetadataStore(fresh) as s:
        assert s.list("") == []


@pytest.mark.parametrize("name", [JOURNAL_NAME, SNAPSHOT_NAME])
def test_engine_refuses_a_catalog_with_a_deleted_file_and_verify_agrees(tmp_path, name):
    """A deleted catalog file stops the engine before its start-up sweep can treat batches as
    garbage (before, a deleted journal silently gave the snapshot's older catalog)."""
    import pyarrow as pa

    import sediment
    from sediment.engine.verify import verify_data_dir

    data = tmp_path / "data"
    with sediment.open(str(data), compact_interval=None) as e:
        e.add_relation("r", pa.schema([("k", pa.int64())]))
        e.append("r", pa.table({"k": [1, 2], "time": [1, 1], "diff": [1, 1]}))
        e.seal("r", 1)
        e.compact()
    with sediment.open(str(data), compact_interval=None) as e:  # the reopen checkpoints the catalog
        assert e.relations() == ["r"]
    blobs_before = sorted(p.name for p in (data / "blobs").rglob("*.parquet"))
    (data / "meta" / name).unlink()
    report = verify_data_dir(str(data))
    assert not report.ok and any(name in p for p in report.problems)
    with pytest.raises(MetadataCorruption, match="missing"):
        sediment.open(str(data), compact_interval=None)
    assert sorted(p.name for p in (data / "blobs").rglob("*.parquet")) == blobs_before


def test_engine_whose_whole_metadata_directory_vanished_is_refused_at_its_blob_prefix(tmp_path):
    """Both catalog files gone look like a new directory to the store itself; the engine sees
    the log that the lost catalog described and refuses (MetadataMissing) before its sweep
    could take the old batches for garbage. (Without a log, the blob prefix's owner marker
    refuses the new identity: test_blob_owner.py.)"""
    import pyarrow as pa

    import sediment
    from sediment.errors import MetadataMissing

    data = tmp_path / "data"
    with sediment.open(str(data), compact_interval=None) as e:
        e.add_relation("r", pa.schema([("k", pa.int64())]))
        e.append("r", pa.table({"k": [1], "time": [1], "diff": [1]}))
        e.seal("r", 1)
        e.compact()
    batches = sorted(p.name for p in (data / "blobs").rglob("*.parquet"))
    assert batches
    shutil.rmtree(data / "meta")
    with pytest.raises(MetadataMissing, match=str(data)):
        sediment.open(str(data), compact_interval=None)
    assert sorted(p.name for p in (data / "blobs").rglob("*.parquet")) == batches


def test_engine_journal_cut_after_clean_close_is_refused_and_verify_agrees(tmp_path):
    """Issue 12 campaign finding: the metadata journal cut mid-entry after a clean close lost an
    acknowledged ``set_since`` while open reported a torn tail and verify exited 0. Now the
    recorded durable end makes the cut a typed error in both."""
    import pyarrow as pa

    import sediment
    from sediment.cli import main as cli_main
    from sediment.engine.verify import verify_data_dir

    data = tmp_path / "data"
    with sediment.open(str(data), compact_interval=None) as e:
        e.add_relation("r", pa.schema([("k", pa.int64())]))
        e.append("r", pa.table({"k": [1, 2], "time": [1, 1], "diff": [1, 1]}))
        e.seal("r", 3)
        e.compact()
        e.set_since("r", 2)
    journal = (data / "meta" / JOURNAL_NAME).read_bytes()
    entries = _scan_journal(journal, "journal").entries
    assert entries, "the set_since must be in the journal"
    assert verify_data_dir(str(data)).ok
    (data / "meta" / JOURNAL_NAME).write_bytes(journal[: entries[-1].end - 5])  # inside the last entry
    report = verify_data_dir(str(data))
    assert not report.ok and any("journal cut" in p for p in report.problems)
    assert cli_main(["verify", "--data-dir", str(data)]) != 0
    with pytest.raises(MetadataCorruption, match="journal cut"):
        sediment.open(str(data), compact_interval=None)
