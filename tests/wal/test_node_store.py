"""A storage node's partition store is the local log's code: it opens through its manifest
and recovers through the shared reader (wal/log_reader.py), with the same rules.

Real storage-node processes (SIGKILLed by PID) wherever a node restarts; the coordinator
is a real ReplicatedLog. The in-process tests at the end drive the store's structural
changes (trim, reset, truncation across segments) and reopen it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import trio
from support.replication import KEY, Node, r, wait_until

from sediment.errors import OutcomeUnknown, WalMissing
from sediment.metadata.memory import MemoryMetadataStore
from sediment.wal import manifest as mf
from sediment.wal import record as rec
from sediment.wal import segment as sg
from sediment.wal.control import CONTROL_NAME
from sediment.wal.replication.node.partition_store import FilePartitionStore, open_directory
from sediment.wal.replication.replica import ReplicaConnection, tcp_connect
from sediment.wal.replication.replicated_log import ReplicatedLog
from sediment.wal.replication.wire import MsgType, Status

pytestmark = pytest.mark.timeout(180)
SESSION = 1


def bodies(n: int, start: int = 0) -> list[bytes]:
    return [f"rec-{i}".encode() for i in range(start, start + n)]


def open_log(nodes: list[Node], meta) -> ReplicatedLog:
    return ReplicatedLog.open([n.address for n in nodes], meta, 0, KEY, timeout=2.0)


def append_range(log: ReplicatedLog, start: int, stop: int, batch: int = 50) -> None:
    for i in range(start, stop, batch):
        log.append([r(j) for j in range(i, min(stop, i + batch))])


def stop_all(nodes: list[Node]) -> None:
    for n in nodes:
        if n.proc is not None:
            n.kill()


def stderr_after_kill(node: Node) -> str:
    assert node.proc is not None
    node.kill()
    return node.stderr_since_start()


def segment_files(directory: Path, partition: int = 0) -> dict[str, bytes]:
    pdir = directory / str(partition)
    return {name: (pdir / name).read_bytes() for name in sorted(os.listdir(pdir)) if sg.parse_name(name)}


def active_segment(directory: Path, partition: int = 0) -> Path:
    m = mf.read(str(directory), partition)
    return directory / str(partition) / sg.segment_name(m.active_first)


@pytest.fixture
def cluster(tmp_path: Path):
    made: list[Node] = []

    def make(count: int, *extra: str) -> list[Node]:
        for _ in range(count):
            made.append(Node(tmp_path / f"node{len(made)}", extra_args=extra))
            made[-1].start()
        return made[-count:]

    yield make
    stop_all(made)


def test_a_node_whose_manifest_was_deleted_refuses_the_partition_and_the_cluster_goes_on(cluster) -> None:
    """The manifest of node 2's partition is deleted while it is down. On restart the node
    answers FAILED for the partition with the typed error (logged), creates nothing and
    touches none of its segments; the coordinator counts it as a failed replica and goes on
    with the other two, losing nothing."""
    nodes = cluster(3, "--segment-bytes", "16384")
    meta = MemoryMetadataStore()
    log = open_log(nodes, meta)
    append_range(log, 0, 300)
    log.close()
    stop_all(nodes)
    victim = nodes[2]
    manifest = victim.dir / mf.manifest_name(0)
    manifest.unlink()
    before = segment_files(victim.dir)
    assert len(before) > 2  # finished segments and the active one
    for n in nodes:
        n.start()
    log = open_log(nodes, meta)
    append_range(log, 300, 400)
    assert [x.body for x in log.scan()] == bodies(400)
    log.close()
    err = stderr_after_kill(victim)
    assert "WalMissing" in err and str(manifest) in err and "refused" in err, err
    assert not manifest.exists()
    assert segment_files(victim.dir) == before  # nothing cut, deleted or created
    for n in nodes[:2]:
        n.kill()
        assert n.records() == bodies(400)
    with pytest.raises(WalMissing, match="manifest"):
        open_directory(str(victim.dir), KEY)(0)
    victim.dir.rename(victim.dir.with_name("node2-refused"))  # the remedy the error names
    for n in nodes:
        n.start()
    log = open_log(nodes, meta)  # the node starts empty and is caught up from its peers
    append_range(log, 400, 410)
    coord = log.coordinator
    wait_until(log, lambda: victim.address in coord.in_sync() and coord.links[victim.address].acked >= coord.committed,
               60, "the emptied node to be caught up")
    assert victim.records() == bodies(410)
    log.close()


def test_a_node_whose_control_file_was_deleted_refuses_to_start_and_the_cluster_goes_on(cluster) -> None:
    nodes = cluster(3)
    meta = MemoryMetadataStore()
    log = open_log(nodes, meta)
    append_range(log, 0, 100)
    log.close()
    stop_all(nodes)
    victim = nodes[1]
    control = victim.dir / CONTROL_NAME
    control.unlink()
    proc = subprocess.run([sys.executable, "-m", "sediment.wal.replication.node.storage_node", "--dir", str(victim.dir), "--listen",
                           victim.address, "--cluster-key", str(KEY)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "WalMissing" in proc.stderr and str(control) in proc.stderr, proc.stderr
    assert not control.exists()  # no new control file, no new cluster key
    for n in (nodes[0], nodes[2]):
        n.start()
    log = open_log(nodes, meta)  # node 1 does not answer: a failed replica
    append_range(log, 100, 150)
    assert [x.body for x in log.scan()] == bodies(150)
    log.close()
    assert victim.records() == bodies(100)  # its data is still there, for an operator to restore


def test_an_active_segment_cut_at_a_record_boundary_is_detected_by_the_durable_end(cluster) -> None:
    """Node 0 recorded a durable end (every 100 records); its active segment is then cut
    exactly at a record boundary below it. The scan alone would see a shorter, healthy
    replica; the manifest's durable end makes it a refusal naming the lost LSNs."""
    nodes = cluster(3, "--checkpoint-records", "100")
    meta = MemoryMetadataStore()
    log = open_log(nodes, meta)
    append_range(log, 0, 450)
    log.close()
    stop_all(nodes)
    victim = nodes[0]
    durable_end = mf.read(str(victim.dir), 0).durable_end
    assert durable_end >= 400
    seg = active_segment(victim.dir)
    scan = sg.scan_segment(str(seg), sg.parse_name(seg.name)[0])
    cut_lsn = 250
    os.truncate(seg, scan.offsets[cut_lsn - sg.parse_name(seg.name)[0]])
    for n in nodes:
        n.start()
    log = open_log(nodes, meta)
    append_range(log, 450, 500)
    assert [x.body for x in log.scan()] == bodies(500)
    log.close()
    err = stderr_after_kill(victim)
    assert "WalMissing" in err and "shortened" in err and f"LSNs [{cut_lsn}, {durable_end - 1}]" in err, err
    with pytest.raises(WalMissing) as info:
        open_directory(str(victim.dir), KEY)(0)
    assert info.value.first_lsn == cut_lsn and info.value.last_lsn == durable_end - 1


def test_nodes_killed_mid_stream_recover_through_the_shared_reader_losing_nothing(cluster) -> None:
    """A writer streams appends over small segments (rollovers, manifest rewrites); node 1
    is SIGKILLed mid-stream and restarted, then every node is SIGKILLed. Each directory
    opens through the shared reader with no fatal problem, and a new coordinator reads back
    every acknowledged record, in order."""
    nodes = cluster(3, "--segment-bytes", "8192", "--checkpoint-records", "25")
    meta = MemoryMetadataStore()
    log = open_log(nodes, meta)
    acked: list[int] = []
    stop = threading.Event()
    progress = threading.Condition()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            try:
                last = log.append([r(j) for j in range(i, i + 3)])
            except OutcomeUnknown:  # every node was killed: unacknowledged, maybe written
                return
            with progress:
                acked.extend(range(i, last + 1))
                progress.notify_all()
            i = last + 1

    def wait_for(n: int) -> None:
        with progress:
            assert progress.wait_for(lambda: len(acked) >= n, timeout=60), f"only {len(acked)} acknowledged"

    t = threading.Thread(target=writer)
    t.start()
    try:
        wait_for(150)
        nodes[1].kill()
        wait_for(len(acked) + 150)
        nodes[1].start()
        wait_for(len(acked) + 150)
        for n in nodes:
            n.kill()
    finally:
        stop.set()
        t.join(60)
    log.close()
    assert acked == list(range(len(acked)))
    for n in nodes:  # in-process, the way the node opens it: the shared reader, no fatal problem
        store = open_directory(str(n.dir), KEY)(0)
        try:
            assert all(not p.fatal for p in store.problems)
        finally:
            store.close()
        held = n.records()  # what the node holds: a prefix of what was sent (the last append may be unacked)
        assert held == bodies(len(held)) and len(held) <= len(acked) + 3
    assert len(os.listdir(nodes[0].dir / "0")) > 4  # rollovers happened (node 0 was never killed mid-stream)
    for n in nodes:
        n.start()
    log = open_log(nodes, meta)
    got = [x.body for x in log.scan()]
    log.close()
    assert got[:len(acked)] == bodies(len(acked))


def test_truncation_to_a_closing_high_water_mark_then_restart_opens_cleanly(tmp_path: Path) -> None:
    """A real node: 300 records over several segments, the durable end recorded at 300, then
    TRUNCATE to keep LSNs below 120 (a coordinator's closing high-water mark). After SIGKILL
    the node opens cleanly -- the manifest already held the lower end -- and serves 0..119."""
    node = Node(tmp_path / "node", extra_args=("--segment-bytes", "8192", "--checkpoint-records", "50"))
    node.start()
    body = [f"r{i}".encode() * 30 for i in range(300)]

    def frames(first: int, items: list[bytes]) -> bytes:
        return b"".join(rec.encode(rec.Record(rec.RecordKind.UPDATES, relation_id=1, body=b), first + i)
                        for i, b in enumerate(items))

    async def write_and_truncate() -> None:
        async with trio.open_nursery() as nursery:
            conn = await ReplicaConnection.open(nursery, node.address, tcp_connect, KEY, 0, 30.0)
            assert (await conn.call(MsgType.OPEN, SESSION)).ok
            for i in range(0, 300, 10):
                assert (await conn.call(MsgType.APPEND, SESSION, i, 0, frames(i, body[i:i + 10]))).ok
            assert (await conn.call(MsgType.TRUNCATE, SESSION, 120)).max_lsn == 119
            conn.kill("done")

    async def after_restart() -> None:
        async with trio.open_nursery() as nursery:
            conn = await ReplicaConnection.open(nursery, node.address, tcp_connect, KEY, 0, 30.0)
            info = await conn.call(MsgType.OPEN, SESSION + 1)
            assert info.status == Status.OK and info.max_lsn == 119, info.message
            assert (await conn.call(MsgType.APPEND, SESSION + 1, 120, 0, frames(120, [b"after"]))).ok
            conn.kill("done")

    try:
        trio.run(write_and_truncate)
        assert mf.read(str(node.dir), 0).durable_end == 120  # lowered before any byte was cut
        node.kill()
        node.start()
        trio.run(after_restart)
        node.kill()
        assert node.records() == body[:120] + [b"after"]
    finally:
        if node.proc is not None:
            node.kill()


def _store(root: Path, segment_bytes: int = 8192, checkpoint: int = 10) -> FilePartitionStore:
    return open_directory(str(root), KEY, segment_bytes, checkpoint)(0)


def _write(store: FilePartitionStore, first: int, n: int) -> None:
    frames = [rec.encode(rec.Record(rec.RecordKind.UPDATES, relation_id=1, body=b"x" * 300), first + i)
              for i in range(n)]
    store.write(b"".join(frames), first, [len(f) for f in frames])


def test_trim_reset_and_truncation_are_recorded_before_files_change(tmp_path: Path) -> None:
    store = _store(tmp_path)
    for i in range(0, 200, 10):
        _write(store, i, 10)
    assert mf.read(str(tmp_path), 0).finished  # rollovers recorded
    store.trim_prefix(100)
    start = store.start_lsn
    assert 60 < start <= 100 and mf.read(str(tmp_path), 0).start_lsn == start
    store.truncate(150)  # drops whole segments and cuts one
    m = mf.read(str(tmp_path), 0)
    assert m.durable_end == 150 and all(f.last_lsn < 150 for f in m.finished)
    store.close()
    store = _store(tmp_path)
    assert (store.start_lsn, store.next_lsn) == (start, 150)
    assert not store.problems
    store.reset(500)
    store.close()
    store = _store(tmp_path)
    assert (store.start_lsn, store.next_lsn) == (500, 500)
    assert sorted(os.listdir(tmp_path / "0")) == [sg.index_name(500), sg.segment_name(500)]
    store.close()


def test_a_deleted_finished_segment_of_a_replica_is_refused(tmp_path: Path) -> None:
    store = _store(tmp_path)
    for i in range(0, 100, 10):
        _write(store, i, 10)
    first_finished = mf.read(str(tmp_path), 0).finished[1]
    store.close()
    (tmp_path / "0" / sg.segment_name(first_finished.first_lsn)).unlink()
    with pytest.raises(WalMissing) as info:
        _store(tmp_path)
    assert (info.value.first_lsn, info.value.last_lsn) == (first_finished.first_lsn, first_finished.last_lsn)


class Crash(BaseException):
    """The process dies here: nothing after it runs (the store is abandoned, not closed)."""


def _abandon(store: FilePartitionStore) -> None:
    store._active.close()


def test_a_crash_inside_truncate_or_reset_leaves_a_replica_that_opens(tmp_path: Path, monkeypatch) -> None:
    """The manifest is rewritten first; a crash right after it (before any file changes)
    must leave a directory the shared reader opens without a fatal problem."""
    store = _store(tmp_path)
    for i in range(0, 120, 10):
        _write(store, i, 10)
    store.close()
    assert mf.read(str(tmp_path), 0).durable_end == 120

    def crash(*_a, **_k):
        raise Crash

    store = _store(tmp_path)
    with monkeypatch.context() as mp:
        mp.setattr(sg, "remove_segment_files", crash)
        with pytest.raises(Crash):
            store.truncate(30)  # drops whole segments: the crash comes before the first deletion
    _abandon(store)
    assert mf.read(str(tmp_path), 0).durable_end == 30
    store = _store(tmp_path)
    assert not [p for p in store.problems if p.fatal] and store.next_lsn >= 30
    store.truncate(30)
    assert store.next_lsn == 30
    _write(store, 30, 5)
    with monkeypatch.context() as mp:
        mp.setattr(FilePartitionStore, "_new_segment", crash)
        with pytest.raises(Crash):
            store.reset(400)  # manifest and deletions done, the new active segment not yet created
    _abandon(store)
    store = _store(tmp_path)
    assert (store.start_lsn, store.next_lsn) == (400, 400)
    _write(store, 400, 3)
    store.close()
    store = _store(tmp_path)
    assert store.next_lsn == 403
    store.close()
