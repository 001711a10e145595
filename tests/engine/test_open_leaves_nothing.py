"""A failed ``sediment.open`` leaves the disk as it found it: a path that cannot be a data
directory (or a metadata directory) is refused before anything is made, and once past the
option checks a data directory that the open itself created is removed again, or emptied
again when it was there but empty; a directory that held anything is never removed."""

from __future__ import annotations

import threading

import pytest
from test_engine import SCHEMA, rows, ups

import sediment
from sediment import errors


def listing(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("option", ["data_dir", "metadata"])
@pytest.mark.parametrize("where", ["the file", "under the file"])
def test_a_regular_file_is_not_a_directory(tmp_path, option, where):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    path = afile if where == "the file" else afile / "data"
    before = listing(tmp_path)
    with pytest.raises(errors.InvalidArgument) as refused:
        if option == "data_dir":
            sediment.open(path)
        else:
            sediment.open(tmp_path / "data", metadata=str(path))
    text = str(refused.value)
    assert f"{afile} exists and is not a directory" in text and (option == "data_dir" or "metadata" in text)
    assert listing(tmp_path) == before and afile.read_text() == "mine"


def _fail_once_locked(data_dir, tmp_path, metadata, match="wal_capacity"):
    """An open that passes the option checks and fails with the directory's lock held: a
    device ring that does not exist, and no wal_capacity to create it with (or, where an
    engine with the file log is found, a log it was not created with)."""
    with pytest.raises(errors.InvalidArgument, match=match):
        sediment.open(data_dir, wal=f"device:{tmp_path / 'no-ring'}", metadata=metadata)


@pytest.mark.parametrize("metadata", [None, "memory://"])
def test_a_new_data_directory_is_removed_when_opening_fails(tmp_path, metadata):
    _fail_once_locked(tmp_path / "a" / "b" / "data", tmp_path, metadata)
    assert listing(tmp_path) == []


@pytest.mark.parametrize("metadata", [None, "memory://"])
def test_an_empty_data_directory_is_emptied_again_and_kept(tmp_path, metadata):
    (tmp_path / "data").mkdir()
    _fail_once_locked(tmp_path / "data", tmp_path, metadata)
    assert listing(tmp_path) == ["data"]


def test_a_directory_with_files_or_data_is_kept_as_it_was(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    _fail_once_locked(mine, tmp_path, "memory://")
    assert (mine / "notes.txt").read_text() == "keep"
    data = tmp_path / "data"
    with sediment.open(data, compact_interval=None) as eng:
        eng.add_relation("orders", SCHEMA)
        eng.append("orders", ups([(1, "a", 1, 1)]))
        eng.seal("orders", 1)
    before = listing(data)
    with pytest.raises(errors.InvalidArgument, match="created with the file log"):  # refused once locked
        sediment.open(data, wal=f"device:{tmp_path / 'no-ring'}")
    assert listing(data) == before
    with sediment.open(data, compact_interval=None) as eng:
        assert rows(eng.snapshot("orders", 1)) == [(1, "a", 1)]


def test_an_engine_made_while_an_open_waited_for_the_lock_is_kept(tmp_path, monkeypatch):
    """The open found the directory empty, another process made an engine in it before this
    open took the lock, and this open then failed: the other engine is not this open's to
    remove (it was emptied with everything in it before)."""
    import subprocess
    import sys
    import textwrap

    from sediment.engine.data_dir import DataDir

    data = tmp_path / "data"
    data.mkdir()
    maker = textwrap.dedent(f"""
        import pyarrow as pa, sediment
        with sediment.open({str(data)!r}, compact_interval=None) as eng:
            eng.add_relation("r", pa.schema([("k", pa.int64())]))
            eng.append("r", pa.table({{"k": [7], "time": [1], "diff": [1]}}))
            eng.seal("r", 2)
    """)
    take_lock = DataDir.take_lock

    def another_process_first(self):
        subprocess.run([sys.executable, "-c", maker], check=True, timeout=120)
        return take_lock(self)

    monkeypatch.setattr(DataDir, "take_lock", another_process_first)
    _fail_once_locked(data, tmp_path, None, match="created with the file log")
    monkeypatch.undo()
    with sediment.open(data, compact_interval=None) as eng:
        assert eng.snapshot("r", 1).column("k").to_pylist() == [7]


def test_a_refused_open_of_an_engine_leaves_its_metadata_files_as_they_were(tmp_path):
    """The metadata store is open when the engine refuses an option that contradicts the
    directory's storage record; that open must not rewrite ``meta/`` (it checkpointed the
    snapshot and journal before, at every open). Bytes, inodes and mtimes are compared; the
    lock file is left out: taking the lock records the holder's pid in it."""
    data = tmp_path / "data"
    with sediment.open(data, compact_interval=None) as eng:
        eng.add_relation("orders", SCHEMA)
        eng.append("orders", ups([(1, "a", 1, 1)]))
        eng.seal("orders", 1)

    def meta_files():
        return {p.name: (p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns)
                for p in sorted((data / "meta").iterdir()) if p.name != "lock"}

    before = meta_files()
    assert {"snapshot", "journal", "journal.end"} <= set(before)
    for _ in range(2):
        with pytest.raises(errors.InvalidArgument, match="created with the file log"):
            sediment.open(data, wal=f"device:{tmp_path / 'no-ring'}")
        assert meta_files() == before
    with sediment.open(data, compact_interval=None) as eng:
        assert rows(eng.snapshot("orders", 1)) == [(1, "a", 1)]


@pytest.mark.s3
def test_a_failed_open_keeps_a_directory_another_open_made_beside_it(tmp_path, faulty_proxy):
    """A cluster member opens its partitions under one new parent at once, and the first open
    makes that parent: when it failed, it removed the parent with the other partitions'
    directories in it, locks, markers and all, while their engines were open. Its lock
    covers its own directory only."""
    parent = tmp_path / "member" / "partitions"
    held = faulty_proxy.hold_next(1)  # the failing open's first S3 request: after its lock and mkdir
    failed: list[BaseException] = []

    def open_into_a_missing_bucket() -> None:
        try:
            sediment.open(parent / "1", blob="s3://no-such-bucket-here/p1", s3_endpoint=faulty_proxy.endpoint)
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            failed.append(exc)

    opener = threading.Thread(target=open_into_a_missing_bucket)
    opener.start()
    assert held.reached.wait(30), "the open did not reach S3"
    sibling = sediment.open(parent / "0")
    try:
        sibling.add_relation("r", SCHEMA)
        held.release.set()
        opener.join(30)
        assert not opener.is_alive() and len(failed) == 1 and isinstance(failed[0], errors.BlobError)
        assert not (parent / "1").exists()
        assert (parent / "0" / "LOCK").exists() and (parent / "0" / "meta").is_dir()
        sibling.append("r", ups([(1, "a", 1, 1)]))
    finally:
        sibling.close()
    with sediment.open(parent / "0") as again:
        assert again.relations() == ["r"]
