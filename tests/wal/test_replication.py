"""Replicated partitions with real storage-node processes on 127.0.0.1 and a real ZooKeeper.

Nodes are killed with SIGKILL by PID. Every wait is on a condition with a deadline.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from pathlib import Path

import pytest
from support.replication import KEY, Node, r, wait_until  # noqa: F401 - used here and re-exported
from support.waiting import Progress

from sediment.errors import QuorumLost, QuorumUnavailable, ReplicationError, SessionFenced
from sediment.metadata.memory import MemoryMetadataStore
from sediment.metadata.zookeeper import ZooKeeperMetadataStore
from sediment.wal import record as rec
from sediment.wal.replication import wire
from sediment.wal.replication.partition_meta import PartitionMetaStore
from sediment.wal.replication.replicated_log import ReplicatedLog

pytestmark = pytest.mark.timeout(120)


def open_log(nodes, meta, **kw) -> ReplicatedLog:
    return ReplicatedLog.open([n.address for n in nodes], meta, 0, KEY, timeout=2.0, **kw)


def test_wire_example_in_docs_decodes() -> None:
    doc = (Path(__file__).parent.parent.parent / "docs" / "formats.md").read_text()
    section = doc[doc.index("## Replication formats"):]
    hexes = section.split("```hex\n")[1].split("```")[0]
    assert wire.FRAME_SIZE == 16  # the frame header's table
    msg = wire.decode_message(bytes.fromhex("".join(hexes.split())))
    assert isinstance(msg, wire.Request) and msg.type == wire.MsgType.APPEND and msg.arg1 == 0
    [record] = list(wire.iter_records(msg.payload))
    assert record.body == b"hello" and record.lsn == 0
    bad = bytearray(bytes.fromhex("".join(hexes.split())))
    bad[-1] ^= 1
    with pytest.raises(wire.WireError):
        wire.decode_message(bytes(bad))


def test_kill_one_replica_during_appends_loses_nothing(nodes) -> None:
    meta = MemoryMetadataStore()
    log = open_log(nodes, meta)
    acked: list[int] = []
    for i in range(50):
        acked.append(log.append([r(i)]))
    nodes[2].kill()
    for i in range(50, 150):  # writes continue on the remaining quorum
        acked.append(log.append([r(i)]))
    assert acked == list(range(150))
    assert [x.body for x in log.scan()] == [f"rec-{i}".encode() for i in range(150)]
    log.close()
    for n in nodes[:2]:
        n.kill()
        assert n.records() == [f"rec-{i}".encode() for i in range(150)]


def test_sigkill_under_concurrent_writers_restarts_the_session_and_fails_nothing(nodes) -> None:
    """Eight writers stream appends; a replica is SIGKILLed mid-stream. The store session
    closes and a new one recovers (Waltz), and no writer sees an error: appends in flight
    are settled by the recovery, each exactly once."""
    meta = MemoryMetadataStore()
    log = open_log(nodes, meta)
    first_session = log.coordinator.session
    stop = threading.Event()
    acked: dict[int, list[tuple[int, bytes]]] = {w: [] for w in range(8)}
    errors: list[BaseException] = []
    progress = Progress()

    def writer(w: int) -> None:
        i = 0
        while not stop.is_set():
            body = f"w{w}-{i}".encode()
            try:
                lsn = log.append([rec.Record(rec.RecordKind.UPDATES, relation_id=1, body=body)])
            except BaseException as exc:  # noqa: BLE001 - the assertion below reports it
                errors.append(exc)
                return
            acked[w].append((lsn, body))
            progress.changed()
            i += 1

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    progress.wait_for(lambda: sum(map(len, acked.values())) >= 200, 20, "appends before the kill")
    nodes[1].kill()
    wait_until(log, lambda: log.coordinator.session > first_session, what="a new store session")
    done_at_restart = sum(map(len, acked.values()))
    progress.wait_for(lambda: sum(map(len, acked.values())) >= done_at_restart + 200, 20, "appends after the restart")
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors, errors
    stored = {x.lsn: x.body for x in log.scan()}
    every = sorted(a for w in acked.values() for a in w)
    assert len(stored) == len(every) == len({b for _, b in every})  # exactly once each
    assert all(stored[lsn] == body for lsn, body in every)
    for w in acked.values():  # each writer's appends are in its own order
        assert [lsn for lsn, _ in w] == sorted(lsn for lsn, _ in w)
    log.close()
    for n in (nodes[0], nodes[2]):
        n.kill()
        assert n.records() == [stored[lsn] for lsn in sorted(stored)]


def test_kill_two_fails_without_false_ack_then_recovers(nodes) -> None:
    meta = MemoryMetadataStore()
    log = open_log(nodes, meta)
    for i in range(20):
        log.append([r(i)])
    nodes[1].kill()
    nodes[2].kill()
    with pytest.raises(QuorumLost, match="quorum"):
        for i in range(20, 40):
            log.append([r(i)])
    with pytest.raises((QuorumLost, QuorumUnavailable)):  # or refused at once while a session recovers
        log.append([r(99)])
    nodes[1].start()
    nodes[2].start()
    wait_until(log, lambda: log.coordinator.writable.is_set(), what="recovery after the nodes returned")
    lsn = log.append([r(1000)])
    bodies = [x.body for x in log.scan()]
    assert bodies[:20] == [f"rec-{i}".encode() for i in range(20)]
    assert bodies[lsn] == b"rec-1000" and len(bodies) == lsn + 1
    log.close()


def test_superseded_coordinator_is_fenced(nodes) -> None:
    meta = MemoryMetadataStore()
    old = open_log(nodes, meta)
    old.append([r(0)])
    new = open_log(nodes, meta)
    with pytest.raises(SessionFenced, match="superseded"):
        old.append([r(1)])
    assert new.append([r(1)]) == 1
    assert [x.body for x in new.scan()] == [b"rec-0", b"rec-1"]
    old.close()
    new.close()


def test_a_store_without_watches_is_checked_for_a_new_owner_on_the_clock(nodes) -> None:
    """A metadata store without watches: the coordinator re-reads the partition's owner every
    interval of its clock, so a replaced one is fenced, naming the new owner, with no write."""
    from sediment.clock import ManualClock

    meta = MemoryMetadataStore()
    clock = ManualClock()
    old = open_log(nodes, meta, owner="coordinator-a", clock=clock, owner_check_interval=1.0)
    old.append([r(0)])
    wait_until(old, lambda: len(old.coordinator.in_sync()) == 3, what="all replicas in sync (no metadata write left)")
    store = PartitionMetaStore(meta, 0)  # another coordinator's claim, made in the metadata alone: the
    taken, version = store.load()        # nodes, which would also tell the old one at its next request, see nothing
    taken.session_id, taken.owner = taken.session_id + 1, "coordinator-b"
    store.save(taken, version)
    fenced = lambda: old.coordinator.fenced is not None  # noqa: E731
    assert not old.wait_for(fenced, 0.3), "fenced before the clock said a check was due"
    clock.advance(0.5)
    assert not old.wait_for(fenced, 0.3)
    clock.advance(0.5)
    assert old.wait_for(fenced, 2.0), "the check due on the clock did not fence the replaced coordinator"
    assert "coordinator-b" in str(old.coordinator.fenced)
    with pytest.raises(SessionFenced, match="coordinator-b"):
        old.append([r(1)])
    old.close()


def test_lagging_replica_catches_up(nodes) -> None:
    meta = MemoryMetadataStore()
    log = open_log(nodes, meta)
    for i in range(10):
        log.append([r(i)])
    nodes[2].kill()
    for i in range(10, 300):
        log.append([r(i)])
    nodes[2].start()
    wait_until(log, lambda: nodes[2].address in log.coordinator.in_sync(), what="the lagging replica to catch up")
    log.append([r(300)])
    states = PartitionMetaStore(meta, 0).load()[0]
    assert states.replicas[nodes[2].address].session_id == log.coordinator.session
    # the append returned on a quorum; close does not wait for the third acknowledgement
    wait_until(log, lambda: all(v["lag"] == 0 for v in log.replica_lag().values()),
               what="every replica to acknowledge the last record")
    log.close()
    for n in nodes:
        n.kill()
        assert n.records() == [f"rec-{i}".encode() for i in range(301)]


def test_replica_storage_replaced_by_old_copy(nodes, tmp_path: Path) -> None:
    meta = MemoryMetadataStore()
    log = open_log(nodes, meta)
    for i in range(10):
        log.append([r(i)])
    log.close()
    nodes[2].kill()
    old_copy = tmp_path / "old-copy"
    shutil.copytree(nodes[2].dir, old_copy)
    nodes[2].start()
    log = open_log(nodes, meta)  # session 2: node 2 becomes clean at LSN 9
    for i in range(10, 30):
        log.append([r(i)])
    log.close()
    nodes[2].kill()
    shutil.rmtree(nodes[2].dir)
    shutil.copytree(old_copy, nodes[2].dir)  # a stale snapshot from session 1
    nodes[2].start()
    log = open_log(nodes, meta)
    wait_until(log, lambda: len(log.coordinator.in_sync()) == 3, what="all three replicas in sync")
    log.append([r(30)])
    log.close()
    for n in nodes:
        n.kill()
        assert n.records() == [f"rec-{i}".encode() for i in range(31)]


def test_wrong_cluster_key_is_refused(tmp_path: Path) -> None:
    n = Node(tmp_path / "other", key=uuid.uuid4())
    n.start()
    try:
        started = time.monotonic()
        with pytest.raises(ReplicationError, match="belongs to cluster"):
            ReplicatedLog.open([n.address], MemoryMetadataStore(), 0, KEY, timeout=1.0, open_timeout=30.0)
        assert time.monotonic() - started < 10, "a definite refusal must not wait for the open timeout"
    finally:
        n.kill()


@pytest.mark.zookeeper
def test_zookeeper_restart_during_writes(nodes, zookeeper, zk_root) -> None:
    """Writes go on while ZooKeeper is down, and the store reconnects to the restarted server
    in its old session. A reconnection that lands while the server starts is taken and never
    answered (ZooKeeper 3.8); it once cost the whole 20 s session, so the client came back
    after 20 s with its session expired. Each attempt now gets a third of the session (see
    tests/metadata/test_zookeeper_reconnect.py): about 6.7 s, plus at most 1.4 s of retry delay."""
    store = ZooKeeperMetadataStore(zookeeper.hosts, zk_root, timeout=10.0, session_timeout=20.0)
    log = open_log(nodes, store)
    acked: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    progress = Progress()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            try:
                acked.append(log.append([r(i)]))
            except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                errors.append(exc)
                return
            finally:
                progress.changed()
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    progress.wait_for(lambda: len(acked) > 20, 20, "some appends")
    zookeeper.stop()
    mark = len(acked)
    progress.wait_for(lambda: len(acked) > mark + 20, 20, "appends while ZooKeeper is down")
    zookeeper.start()
    assert store.wait_connected(20), "timed out after 20s waiting for reconnection"
    assert not store.session_lost, "the restart cost the store its ZooKeeper session"
    stop.set()
    t.join()
    assert errors == []
    assert acked == list(range(len(acked)))
    assert store.get("store/partition/0") is not None
    assert len(list(log.scan())) == len(acked)
    log.close()
    store.close()


@pytest.mark.zookeeper
def test_zookeeper_metadata_path_and_fencing(nodes, zookeeper, zk_root) -> None:
    a = ZooKeeperMetadataStore(zookeeper.hosts, zk_root)
    b = ZooKeeperMetadataStore(zookeeper.hosts, zk_root)
    old = open_log(nodes, a)
    old.append([r(0)])
    new = open_log(nodes, b)
    with pytest.raises(SessionFenced):
        old.append([r(1)])
    assert new.append([r(1)]) == 1
    from kazoo.client import KazooClient
    zk = KazooClient(zookeeper.hosts)
    zk.start()
    assert zk.exists(f"{zk_root}/store/partition/0") is not None
    zk.stop()
    old.close()
    new.close()
    a.close()
    b.close()
