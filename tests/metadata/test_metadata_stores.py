"""The metadata stores: one conformance suite over memory, journal and ZooKeeper, then
each store's own failure behaviour (torn journals, crashed writers, ZooKeeper outages)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from support.waiting import Progress

from sediment.errors import (
    DataDirLocked,
    InvalidMetadataRequest,
    MetadataConflict,
    MetadataCorruption,
    MetadataUnavailable,
)
from sediment.metadata.journal import (
    END_NAME,
    JOURNAL_NAME,
    PARTIAL_NAME,
    SNAPSHOT_NAME,
    JournalMetadataStore,
    encode_snapshot,
    verify,
)
from sediment.metadata.journal_format import HEADER_SIZE, _decode_snapshot, journal_header
from sediment.metadata.memory import MemoryMetadataStore
from sediment.metadata.open_store import open_metadata_store
from sediment.metadata.protocol import MetadataStore, Versioned
from sediment.metadata.zookeeper import ZooKeeperMetadataStore

PYTHON = sys.executable


# --- conformance -------------------------------------------------------------------------------


def test_create_update_and_conflicts(store: MetadataStore) -> None:
    assert store.get("catalog/relations/orders") is None
    assert store.compare_and_set("catalog/relations/orders", b"v0", None) == 0
    assert store.get("catalog/relations/orders") == Versioned(b"v0", 0)
    with pytest.raises(MetadataConflict):
        store.compare_and_set("catalog/relations/orders", b"again", None)
    assert store.compare_and_set("catalog/relations/orders", b"v1", 0) == 1
    assert store.compare_and_set("catalog/relations/orders", b"v2", 1) == 2
    with pytest.raises(MetadataConflict):
        store.compare_and_set("catalog/relations/orders", b"stale", 1)
    with pytest.raises(MetadataConflict):
        store.compare_and_set("catalog/relations/missing", b"x", 0)
    assert store.get("catalog/relations/orders") == Versioned(b"v2", 2)
    assert store.get("catalog/relations/missing") is None


def test_delete_with_and_without_version(store: MetadataStore) -> None:
    store.compare_and_set("trace/1", b"a", None)
    store.compare_and_set("trace/1", b"b", 0)
    with pytest.raises(MetadataConflict):
        store.delete("trace/1", expected_version=0)
    assert store.get("trace/1") == Versioned(b"b", 1)
    store.delete("trace/1", expected_version=1)
    assert store.get("trace/1") is None
    store.delete("trace/1")
    with pytest.raises(MetadataConflict):
        store.delete("trace/1", expected_version=0)
    store.compare_and_set("trace/2", b"c", None)
    store.delete("trace/2")
    assert store.get("trace/2") is None
    assert store.compare_and_set("trace/2", b"again", None) == 0
    assert store.list("trace/") == ["trace/2"]


def test_list_prefix_sorted_nested_and_no_intermediates(store: MetadataStore) -> None:
    keys = ["trace/17", "trace/17/batches/3", "trace/2", "trace/1/x/y", "catalog/relations/orders", "tracer"]
    for key in keys:
        store.compare_and_set(key, key.encode(), None)
    assert store.list("") == sorted(keys)
    assert store.list("trace/") == ["trace/1/x/y", "trace/17", "trace/17/batches/3", "trace/2"]
    assert store.list("trace/1") == ["trace/1/x/y", "trace/17", "trace/17/batches/3"]
    assert store.list("trace") == ["trace/1/x/y", "trace/17", "trace/17/batches/3", "trace/2", "tracer"]
    assert store.list("catalog/relations/orders") == ["catalog/relations/orders"]
    assert store.list("nothing/") == []
    assert store.get("trace/1/x") is None
    assert store.get("trace/17/batches") is None
    # A key created where an intermediate znode already exists still starts at version 0.
    assert store.compare_and_set("trace/1/x", b"now a key", None) == 0
    assert store.compare_and_set("trace/1/x", b"next", 0) == 1
    # Deleting a key that has keys below it keeps them and hides the deleted one.
    store.delete("trace/17", expected_version=0)
    assert store.list("trace/17") == ["trace/17/batches/3"]
    assert store.compare_and_set("trace/17", b"back", None) == 0
    store.delete("trace/17/batches/3")
    assert store.list("trace/17") == ["trace/17"]


def test_values_are_arbitrary_bytes(store: MetadataStore) -> None:
    values = [b"", b"\x00", b"\x00\x01\x02\xff" * 100, bytes(range(256)), os.urandom(200_000)]
    for i, value in enumerate(values):
        store.compare_and_set(f"bytes/{i}", value, None)
    for i, value in enumerate(values):
        assert store.get(f"bytes/{i}") == Versioned(value, 0)
    assert store.get("bytes/0") is not None


@pytest.mark.parametrize(
    "key", ["", "/abs", "a//b", "a/", "a/../b", "./a", "a/.", "nul\x00byte", "tab\tkey", "x" * 1025]
)
def test_invalid_keys_are_rejected(store: MetadataStore, key: str) -> None:
    with pytest.raises(InvalidMetadataRequest):
        store.compare_and_set(key, b"v", None)
    with pytest.raises(InvalidMetadataRequest):
        store.get(key)
    assert store.list("") == []


def test_value_too_large_is_rejected(store: MetadataStore) -> None:
    with pytest.raises(InvalidMetadataRequest):
        store.compare_and_set("big", b"x" * 1_000_001, None)
    assert store.get("big") is None


def test_concurrent_create_has_one_winner(store: MetadataStore) -> None:
    threads = 8
    barrier = threading.Barrier(threads)
    wins: list[int] = []
    conflicts: list[int] = []

    def worker(i: int) -> None:
        barrier.wait()
        try:
            store.compare_and_set("leader", str(i).encode(), None)
            wins.append(i)
        except MetadataConflict:
            conflicts.append(i)

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert len(wins) == 1 and len(conflicts) == threads - 1
    assert store.get("leader") == Versioned(str(wins[0]).encode(), 0)


def test_concurrent_cas_one_winner_per_version(store: MetadataStore) -> None:
    target = 40
    store.compare_and_set("counter", b"start", None)
    won: dict[int, list[int]] = {}
    lock = threading.Lock()

    def worker(i: int) -> None:
        while True:
            current = store.get("counter")
            assert current is not None
            if current.version >= target:
                return
            try:
                version = store.compare_and_set("counter", f"{i}:{current.version}".encode(), current.version)
            except MetadataConflict:
                continue
            with lock:
                won.setdefault(version, []).append(i)

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert sorted(won) == list(range(1, target + 1))
    assert all(len(winners) == 1 for winners in won.values())
    final = store.get("counter")
    assert final is not None and final.version == target
    assert final.value == f"{won[target][0]}:{target - 1}".encode()


def test_a_rewrite_fences_every_older_version_and_keeps_a_write_that_won_the_race(store: MetadataStore) -> None:
    """metadata/fence.py on every store: after the rewrite a compare-and-set from any version
    read before fails; a write that landed first is in the value rewritten; a missing key is
    created, so a writer that expected it absent fails too."""
    from sediment.metadata.fence import rewrite_all

    v0 = store.compare_and_set("trace/a", b"old", None)
    v1 = store.compare_and_set("trace/a", b"raced", v0)  # the old owner's commit wins the race
    got = rewrite_all(store, ["trace/a", "trace/b", "trace/c"], {"trace/b": b"empty"}.get)
    assert got[0] == Versioned(b"raced", v1 + 1) and got[1] == Versioned(b"empty", 0) and got[2] is None
    for key, version in (("trace/a", v1), ("trace/a", v0), ("trace/b", None)):
        with pytest.raises(MetadataConflict):
            store.compare_and_set(key, b"late", version)
    assert store.get("trace/a") == Versioned(b"raced", v1 + 1) and store.get("trace/c") is None


# --- journal -----------------------------------------------------------------------------------


def write_entries(directory: Path, count: int, **options: object) -> list[int]:
    """Write ``count`` keys, returning the journal size after each write."""
    sizes = []
    with JournalMetadataStore(directory, **options) as s:
        for i in range(count):
            s.compare_and_set(f"k/{i}", f"value-{i}".encode(), None)
            sizes.append(os.path.getsize(directory / JOURNAL_NAME))
    return sizes


def test_journal_persists_across_reopen(tmp_path: Path) -> None:
    d = tmp_path / "meta"
    with JournalMetadataStore(d) as s:
        s.compare_and_set("a", b"1", None)
        s.compare_and_set("a", b"2", 0)
        s.compare_and_set("b/c", b"\x00x", None)
        s.compare_and_set("gone", b"x", None)
        s.delete("gone")
    with JournalMetadataStore(d) as s:
        assert s.get("a") == Versioned(b"2", 1)
        assert s.get("b/c") == Versioned(b"\x00x", 0)
        assert s.get("gone") is None
        assert s.list("") == ["a", "b/c"]
        assert s.report.journal_entries_replayed == 5
        assert s.compare_and_set("a", b"3", 1) == 2
    with JournalMetadataStore(d) as s:
        assert s.get("a") == Versioned(b"3", 2)
    assert verify(d) == []


def test_a_cleanly_closed_journal_is_folded_before_the_first_change(tmp_path: Path) -> None:
    """An open after a clean close writes nothing; the session's first change first folds the
    journal it found into a snapshot, so the journal holds one writing session's changes."""
    d = tmp_path / "meta"
    write_entries(d, 5)
    journal = (d / JOURNAL_NAME).read_bytes()
    assert len(journal) > HEADER_SIZE
    with JournalMetadataStore(d) as s:
        assert s.report.checkpointed is None and s.report.closed_cleanly
        assert s.get("k/4") == Versioned(b"value-4", 0)
        assert (d / JOURNAL_NAME).read_bytes() == journal
        assert s.compare_and_set("k/5", b"value-5", None) == 0
        txid, records = _decode_snapshot((d / SNAPSHOT_NAME).read_bytes(), "snapshot")
        assert txid == 5 == s.report.checkpoint_txid
        assert sorted(records) == [f"k/{i}" for i in range(5)]
        assert not (d / PARTIAL_NAME).exists()
        after = (d / JOURNAL_NAME).read_bytes()
        assert after[:HEADER_SIZE] == journal_header(5) and len(after) > HEADER_SIZE
        assert s.compare_and_set("k/6", b"value-6", None) == 0  # folded once per session
        assert (d / JOURNAL_NAME).read_bytes().startswith(after)
    with JournalMetadataStore(d) as s:
        assert s.list("") == [f"k/{i}" for i in range(7)]


def test_journal_torn_tail_at_every_offset(tmp_path: Path) -> None:
    source = tmp_path / "source"
    sizes = write_entries(source, 4)
    journal = (source / JOURNAL_NAME).read_bytes()
    start, end = sizes[-2], sizes[-1]
    assert len(journal) == end
    for cut in range(start, end):
        d = tmp_path / f"cut{cut}"
        shutil.copytree(source, d)
        (d / JOURNAL_NAME).write_bytes(journal[:cut])
        # Issue 12: after a clean close the journal's end is recorded, so the cut is lost data.
        with pytest.raises(MetadataCorruption, match="journal cut"):
            JournalMetadataStore(d)
        assert any("journal cut" in p for p in verify(d))
        # A crash (no close) records no end: the same cut is a torn tail, cut at open.
        (d / END_NAME).unlink()
        with JournalMetadataStore(d) as s:
            assert s.list("") == ["k/0", "k/1", "k/2"], cut
            assert (s.report.torn_tail is not None) == (cut > start)
            if cut > start:
                assert s.report.torn_tail.offset == start
        # Zero-filled tail (the file grew but the data never reached the disk).
        d2 = tmp_path / f"nul{cut}"
        shutil.copytree(source, d2)
        (d2 / END_NAME).unlink()
        (d2 / JOURNAL_NAME).write_bytes(journal[:cut] + b"\x00" * (end - cut + 7))
        with JournalMetadataStore(d2) as s:
            assert s.list("") == ["k/0", "k/1", "k/2"], cut
            assert s.compare_and_set("k/3", b"after", None) == 0
        with JournalMetadataStore(d2) as s:
            assert s.get("k/3") == Versioned(b"after", 0)


def test_journal_bit_flip_in_middle_is_corruption(tmp_path: Path) -> None:
    d = tmp_path / "meta"
    sizes = write_entries(d, 5)
    path = d / JOURNAL_NAME
    data = bytearray(path.read_bytes())
    bad_offset = sizes[1]
    data[bad_offset + 12] ^= 0x04
    path.write_bytes(bytes(data))
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    problems = verify(d)
    assert len(problems) == 1 and str(path) in problems[0] and f"offset {bad_offset}" in problems[0]
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before
    with pytest.raises(MetadataCorruption) as info:
        JournalMetadataStore(d)
    assert str(path) in str(info.value) and f"offset {bad_offset}" in str(info.value)
    # A failed open releases the lock and leaves the files as they were.
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before
    with pytest.raises(MetadataCorruption):
        JournalMetadataStore(d)


def test_journal_corrupt_length_in_middle_is_corruption(tmp_path: Path) -> None:
    d = tmp_path / "meta"
    sizes = write_entries(d, 5)
    path = d / JOURNAL_NAME
    data = bytearray(path.read_bytes())
    data[sizes[2] + 3] = 0x7F  # length field now points far past the end of the file
    path.write_bytes(bytes(data))
    with pytest.raises(MetadataCorruption, match=f"offset {sizes[2]}"):
        JournalMetadataStore(d)


def test_restore_rule_no_snapshot(tmp_path: Path) -> None:
    d = tmp_path / "meta"
    write_entries(d, 3)
    (d / SNAPSHOT_NAME).unlink()
    with JournalMetadataStore(d) as s:
        assert s.list("") == ["k/0", "k/1", "k/2"]
        assert s.report.snapshot_rule.startswith("no snapshot")
    assert (d / SNAPSHOT_NAME).exists()


def test_restore_rule_snapshot_only(tmp_path: Path) -> None:
    d = tmp_path / "meta"
    with JournalMetadataStore(d) as s:
        s.compare_and_set("a", b"1", None)
        s.checkpoint()
    with JournalMetadataStore(d) as s:
        assert s.get("a") == Versioned(b"1", 0)
        assert s.report.snapshot_rule.startswith("snapshot only")
        assert s.report.snapshot_txid == 1
    # Issue 12: a snapshot without its journal is damage (the journal may have held later
    # changes), never a silent restore from the snapshot alone.
    (d / JOURNAL_NAME).unlink()
    with pytest.raises(MetadataCorruption, match="journal missing"):
        JournalMetadataStore(d)
    assert any("journal missing" in p for p in verify(d))


def test_restore_rule_snapshot_and_partial(tmp_path: Path) -> None:
    d = tmp_path / "meta"
    write_entries(d, 2)
    with JournalMetadataStore(d):
        pass
    (d / PARTIAL_NAME).write_bytes(encode_snapshot(99, {"bogus": Versioned(b"x", 0)})[:40])
    with JournalMetadataStore(d) as s:
        assert s.list("") == ["k/0", "k/1"]
        assert ".partial deleted" in s.report.snapshot_rule
    assert not (d / PARTIAL_NAME).exists()


def test_restore_rule_partial_only(tmp_path: Path) -> None:
    d = tmp_path / "meta"
    with JournalMetadataStore(d) as s:
        s.compare_and_set("a", b"1", None)
        s.checkpoint()
        s.compare_and_set("b", b"2", None)
    os.rename(d / SNAPSHOT_NAME, d / PARTIAL_NAME)
    with JournalMetadataStore(d) as s:
        assert s.list("") == ["a", "b"]
        assert "renamed to snapshot" in s.report.snapshot_rule
    assert (d / SNAPSHOT_NAME).exists() and not (d / PARTIAL_NAME).exists()


def test_restore_rule_incomplete_partial_only(tmp_path: Path) -> None:
    d = tmp_path / "meta"
    write_entries(d, 3)
    (d / SNAPSHOT_NAME).unlink()
    (d / PARTIAL_NAME).write_bytes(encode_snapshot(3, {"k/0": Versioned(b"value-0", 0)})[:-5])
    with JournalMetadataStore(d) as s:
        assert s.list("") == ["k/0", "k/1", "k/2"]
        assert "incomplete" in s.report.snapshot_rule
    assert not (d / PARTIAL_NAME).exists()


def test_journal_missing_entries_is_corruption(tmp_path: Path) -> None:
    d = tmp_path / "meta"
    sizes = write_entries(d, 3)
    path = d / JOURNAL_NAME
    data = path.read_bytes()
    path.write_bytes(data[:HEADER_SIZE] + data[sizes[0] :])
    with pytest.raises(MetadataCorruption, match="entries are missing"):
        JournalMetadataStore(d)
    assert any("entries are missing" in p for p in verify(d))


def test_journal_auto_checkpoint(tmp_path: Path) -> None:
    d = tmp_path / "meta"
    limit = 2000
    with JournalMetadataStore(d, checkpoint_bytes=limit) as s:
        for i in range(100):
            s.compare_and_set(f"k/{i}", b"v" * 100, None)
            assert os.path.getsize(d / JOURNAL_NAME) <= limit + 200
        txid, records = _decode_snapshot((d / SNAPSHOT_NAME).read_bytes(), "snapshot")
        assert txid > 50 and len(records) == txid
    with JournalMetadataStore(d) as s:
        assert len(s.list("k/")) == 100


LOCK_PROBE = """
import sys
from sediment.metadata.journal import JournalMetadataStore
from sediment.errors import DataDirLocked
try:
    JournalMetadataStore(sys.argv[1]).close()
except DataDirLocked as exc:
    print("LOCKED", exc)
    sys.exit(3)
print("OPENED")
"""


def test_journal_lock_excludes_second_process(tmp_path: Path) -> None:
    d = tmp_path / "meta"
    with JournalMetadataStore(d):
        probe = subprocess.run([PYTHON, "-c", LOCK_PROBE, str(d)], capture_output=True, text=True, timeout=60)
        assert probe.returncode == 3, probe.stderr
        assert "LOCKED" in probe.stdout and str(d) in probe.stdout and str(os.getpid()) in probe.stdout
        with pytest.raises(DataDirLocked):
            JournalMetadataStore(d)
    probe = subprocess.run([PYTHON, "-c", LOCK_PROBE, str(d)], capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0 and "OPENED" in probe.stdout, probe.stderr


WRITER = """
import sys
from sediment.metadata.journal import JournalMetadataStore
s = JournalMetadataStore(sys.argv[1], checkpoint_bytes=int(sys.argv[2]))
version = None
i = 0
while True:
    version = s.compare_and_set("counter", str(i).encode(), version)
    s.compare_and_set(f"k/{i:06d}", bytes([i % 256]) * (i % 50), None)
    print(i, version, flush=True)
    i += 1
"""


@pytest.mark.parametrize("checkpoint_bytes", [4 << 20, 3000])
def test_journal_sigkill_keeps_acknowledged_writes(tmp_path: Path, checkpoint_bytes: int) -> None:
    d = tmp_path / "meta"
    proc = subprocess.Popen(
        [PYTHON, "-c", WRITER, str(d), str(checkpoint_bytes)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    acked: list[tuple[int, int]] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            i, version = map(int, line.split())
            acked.append((i, version))
            if len(acked) >= 150:
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        # Through the same buffered reader: lines it read ahead are acknowledged writes too
        # (communicate() would read the pipe underneath it and lose them).
        rest, err = proc.stdout.read(), proc.stderr.read()
    for line in rest.splitlines():
        if line.strip():
            i, version = map(int, line.split())
            acked.append((i, version))
    assert len(acked) >= 150, err
    last_i, last_version = acked[-1]
    with JournalMetadataStore(d) as s:
        counter = s.get("counter")
        assert counter is not None and counter.version >= last_version
        for i, _ in acked:
            assert s.get(f"k/{i:06d}") == Versioned(bytes([i % 256]) * (i % 50), 0)
        assert len(s.list("k/")) in (last_i + 1, last_i + 2)


def test_verify_reports_torn_tail_without_changing_files(tmp_path: Path) -> None:
    d = tmp_path / "meta"
    sizes = write_entries(d, 3)
    path = d / JOURNAL_NAME
    path.write_bytes(path.read_bytes()[: sizes[-1] - 3])
    assert any("journal cut" in p for p in verify(d))  # after a clean close: lost, not torn
    (d / END_NAME).unlink()  # as a crash before the close leaves it
    problems = verify(d)
    assert len(problems) == 1 and "torn tail" in problems[0] and f"offset {sizes[-2]}" in problems[0]
    assert os.path.getsize(path) == sizes[-1] - 3
    assert verify(tmp_path / "absent") != []


# --- ZooKeeper ---------------------------------------------------------------------------------


@pytest.mark.zookeeper
def test_zookeeper_unavailable_then_back(zookeeper, zk_root: str) -> None:
    s = ZooKeeperMetadataStore(zookeeper.hosts, zk_root, timeout=2)
    try:
        s.compare_and_set("a", b"1", None)
        zookeeper.stop()
        for call in (lambda: s.get("a"), lambda: s.compare_and_set("a", b"2", 0), lambda: s.list("")):
            started = time.monotonic()
            with pytest.raises(MetadataUnavailable):
                call()
            assert time.monotonic() - started < 4
        zookeeper.start()
        assert s.wait_connected(20), "the store did not reconnect within 20s of ZooKeeper restarting"
        current = s.get("a")
        assert current is not None
        assert s.compare_and_set("a", b"3", current.version) == current.version + 1
    finally:
        s.close()
        zookeeper.start()


@pytest.mark.zookeeper
def test_zookeeper_connect_timeout_when_down(zookeeper, zk_root: str) -> None:
    zookeeper.stop()
    try:
        started = time.monotonic()
        with pytest.raises(MetadataUnavailable, match=zookeeper.hosts):
            ZooKeeperMetadataStore(zookeeper.hosts, zk_root, timeout=1.5)
        assert time.monotonic() - started < 4
    finally:
        zookeeper.start()


@pytest.mark.zookeeper
def test_zookeeper_session_expiry_is_observable(zookeeper, zk_root: str) -> None:
    lost = threading.Event()
    s = ZooKeeperMetadataStore(
        zookeeper.hosts, zk_root, timeout=5, session_timeout=4, on_session_lost=lost.set
    )
    try:
        s.compare_and_set("x", b"1", None)
        assert not s.session_lost
        # Closed from elsewhere: a second client joins the session and closes it. The store's
        # client retries at once when the server hands its session over, and may win it back
        # before the close arrives: the intruder joins and closes again until the loss shows.
        deadline = time.monotonic() + 15
        while not lost.is_set() and time.monotonic() < deadline:
            intruder = KazooClient(hosts=zookeeper.hosts, client_id=s._client.client_id, timeout=4)
            with contextlib.suppress(intruder.handler.timeout_exception):  # the store held the session
                intruder.start(timeout=5)
            intruder.stop()
            intruder.close()
            lost.wait(1.0)
        assert lost.is_set(), "session loss was not reported"
        assert s.session_lost
        assert s.wait_connected(15), "no new session within 15s of the expiry"
        assert s.get("x") == Versioned(b"1", 0)
    finally:
        s.close()


@pytest.mark.zookeeper
def test_zookeeper_restart_during_writes_keeps_acknowledged(zookeeper, zk_root: str) -> None:
    s = ZooKeeperMetadataStore(zookeeper.hosts, zk_root, timeout=3)
    acked: list[int] = []
    stop = threading.Event()
    errors: list[BaseException] = []
    progress = Progress()

    def writer() -> None:
        version: int | None = None
        while not stop.is_set():
            try:
                version = s.compare_and_set("counter", str(len(acked)).encode(), version)
                acked.append(version)
                progress.changed()
            except MetadataUnavailable:
                try:
                    current = s.get("counter")
                    version = None if current is None else current.version
                except MetadataUnavailable:
                    pass
            except BaseException as exc:
                errors.append(exc)
                progress.changed()
                return

    t = threading.Thread(target=writer)
    t.start()
    try:
        progress.wait_for(lambda: len(acked) >= 20 or bool(errors), 20, "writes before the restart")
        zookeeper.stop()
        zookeeper.start()
        seen = len(acked)
        progress.wait_for(lambda: len(acked) >= seen + 20 or bool(errors), 30, "writes after the restart")
    finally:
        stop.set()
        t.join(30)
        zookeeper.start()
    assert not errors, errors
    assert acked == sorted(acked) and len(set(acked)) == len(acked)
    final = s.get("counter")
    s.close()
    assert final is not None and final.version >= acked[-1]


@pytest.mark.zookeeper
def test_zookeeper_root_holds_foreign_data(zookeeper, zk_root: str) -> None:
    client = KazooClient(hosts=zookeeper.hosts)
    client.start(timeout=10)
    try:
        client.create(f"{zk_root}/foreign", b"not ours", makepath=True)
    finally:
        client.stop()
        client.close()
    with ZooKeeperMetadataStore(zookeeper.hosts, zk_root, timeout=5) as s:
        with pytest.raises(MetadataCorruption, match="foreign"):
            s.get("foreign")


# --- opening by spec ---------------------------------------------------------------------------


def test_open_metadata_store_specs(tmp_path: Path) -> None:
    memory = open_metadata_store("memory://")
    assert isinstance(memory, MemoryMetadataStore)
    journal = open_metadata_store(str(tmp_path / "meta"), checkpoint_bytes=10_000)
    try:
        assert isinstance(journal, JournalMetadataStore) and journal.checkpoint_bytes == 10_000
    finally:
        journal.close()
    for spec in ("ftp://bucket/x", "s3:///no-bucket", "s3://bucket/x?unknown=1"):
        with pytest.raises(InvalidMetadataRequest):
            open_metadata_store(spec)


@pytest.mark.zookeeper
def test_open_metadata_store_zk(zookeeper, zk_root: str) -> None:
    s = open_metadata_store(f"zk://{zookeeper.hosts}{zk_root}", timeout=5)
    try:
        assert isinstance(s, ZooKeeperMetadataStore) and s.root == zk_root
        s.compare_and_set("k", b"v", None)
        assert s.get("k") == Versioned(b"v", 0)
    finally:
        s.close()
