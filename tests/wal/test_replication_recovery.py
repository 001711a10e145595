"""Recovery by Waltz's rules with real storage-node processes and a real ZooKeeper.

Storage directories are laid out with the node's own store code (what earlier sessions
would have left), the partition metadata is written into ZooKeeper, then nodes are
started as processes (killed with SIGKILL by PID) and a ReplicatedLog recovers over them.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
from support.replication import KEY, Node, r, wait_until

from sediment.metadata.zookeeper import ZooKeeperMetadataStore
from sediment.wal import record as rec
from sediment.wal.control import ControlFile, PartitionState
from sediment.wal.replication.node.partition_store import open_directory
from sediment.wal.replication.partition_meta import (
    UNRESOLVED,
    PartitionMeta,
    PartitionMetaStore,
    ReplicaState,
)
from sediment.wal.replication.replicated_log import ReplicatedLog

pytestmark = [pytest.mark.timeout(180), pytest.mark.zookeeper]
GATE_TIMEOUT = 90.0


def lay_out(directory: Path, last: int, session: int, lwm: int) -> None:
    """A replica holding rec-0..rec-<last> whose storage last opened ``session``."""
    store = open_directory(str(directory), KEY)(0)
    frames = [rec.encode(r(i), i) for i in range(last + 1)]
    store.write(b"".join(frames), 0, [len(f) for f in frames])
    store.write_state(PartitionState(session, lwm, min(lwm, last)))
    store.close()


def expected(n: int) -> list[bytes]:
    return [f"rec-{i}".encode() for i in range(n)]


def open_log(nodes: list[Node], meta, **kw) -> ReplicatedLog:
    return ReplicatedLog.open([n.address for n in nodes], meta, 0, KEY, timeout=2.0, **kw)


@pytest.fixture
def zk_store(zookeeper, zk_root):
    store = ZooKeeperMetadataStore(zookeeper.hosts, zk_root)
    yield store
    store.close()


@pytest.fixture
def cluster(tmp_path: Path):
    made: list[Node] = []

    def make(count: int) -> list[Node]:
        for _i in range(count):
            made.append(Node(tmp_path / f"node{len(made)}"))
        return made[-count:]

    yield make
    for n in made:
        if n.proc is not None:
            n.kill()


def test_issue_example_real_nodes_resolves_120(cluster, zk_store) -> None:
    """{120, 120, 110, 105, 105}, only the two at 120 may vote: the lower three are caught
    up and 120 resolves (resolving 110 would cut records 111-120)."""
    nodes = cluster(5)
    for i, (n, last) in enumerate(zip(nodes, [120, 120, 110, 105, 105], strict=True)):
        lay_out(n.dir, last, 2 if i < 2 else 1, 100 if i < 2 else last)
    for n in reversed(nodes):  # the lower replicas are up first (each learns its port here)
        n.start()
    states = {n.address: ReplicaState(2, UNRESOLVED) if i < 2 else ReplicaState(1, [0, 0, 110, 105, 105][i])
              for i, n in enumerate(nodes)}
    PartitionMetaStore(zk_store, 0).save(PartitionMeta(0, 2, states), None)
    log = open_log(nodes, zk_store)
    assert log.end_lsn == 121
    assert [x.body for x in log.scan()] == expected(121)
    assert log.append([r(121)]) == 121
    wait_until(log, lambda: len(log.coordinator.in_sync()) == 5, what="all five in sync")
    log.append([r(122)])
    log.close()
    for n in nodes:
        n.kill()
        assert n.records() == expected(123)
        assert ControlFile.open(str(n.dir)).read_state(0).low_water_mark == 120


def test_storage_restored_from_an_old_copy(cluster, zk_store, tmp_path: Path) -> None:
    nodes = cluster(3)
    for n in nodes:
        n.start()
    log = open_log(nodes, zk_store)
    for i in range(10):
        log.append([r(i)])
    log.close()
    nodes[2].kill()
    old_copy = tmp_path / "old-copy"
    shutil.copytree(nodes[2].dir, old_copy)
    nodes[2].start()
    log = open_log(nodes, zk_store)  # session 2: node 2 clean at 9, low-water mark 9
    for i in range(10, 30):
        log.append([r(i)])
    log.close()
    nodes[2].kill()
    shutil.rmtree(nodes[2].dir)
    shutil.copytree(old_copy, nodes[2].dir)  # a stale copy of session 1 (low-water mark -1)
    nodes[2].start()
    nodes[0].kill()  # and the vote must not count the old copy: only node 1 votes, 0 is absent
    nodes[0].start()
    log = open_log(nodes, zk_store)
    assert log.end_lsn == 30
    wait_until(log, lambda: len(log.coordinator.in_sync()) == 3, what="all three replicas in sync")
    log.append([r(30)])
    log.close()
    for n in nodes:
        n.kill()
        assert n.records() == expected(31)
        assert ControlFile.open(str(n.dir)).read_state(0).low_water_mark >= 29


def test_replicas_replaced_added_and_removed(cluster, zk_store) -> None:
    nodes = cluster(4)
    for n in nodes:
        n.start()
    n0, n1, n2, n3 = nodes
    count = 0
    for replicas in ([n0, n1, n2], [n0, n1, n3], [n0, n1, n2, n3], [n1, n2, n3]):
        log = open_log(replicas, zk_store)
        assert log.end_lsn == count
        for _ in range(10):
            assert log.append([r(count)]) == count
            count += 1
        wait_until(log, lambda log=log, replicas=replicas: len(log.coordinator.in_sync()) == len(replicas),
                   what="every assigned replica in sync")
        log.append([r(count)])
        count += 1
        meta = PartitionMetaStore(zk_store, 0).load()[0]
        assert set(meta.replicas) == {n.address for n in replicas}
        assert [x.body for x in log.scan()] == expected(count)
        log.close()
    for n in (n1, n2, n3):
        n.kill()
        assert n.records() == expected(count)


class GatedZooKeeper(ZooKeeperMetadataStore):
    """The real ZooKeeper store whose compare-and-set waits while the test keeps ``gate``
    shut: a metadata update started then stays in progress until the test opens it."""

    def __init__(self, *args, **kwargs) -> None:
        self.gate = threading.Event()
        self.gate.set()
        super().__init__(*args, **kwargs)

    def compare_and_set(self, key: str, value: bytes, expected_version: int | None) -> int:
        self.gate.wait(GATE_TIMEOUT)  # bounded: the test's own wait fails first
        return super().compare_and_set(key, value, expected_version)


def test_two_catch_ups_finishing_together(cluster, zookeeper, zk_root) -> None:
    """Finding 2 with real processes: two replicas come back together and finish catching
    up at the same time: the second one's metadata update is asked for while the first
    one's is still in progress (held at the gate); the coordinator is not fenced and
    records both."""
    nodes = cluster(5)
    for n in nodes:
        n.start()
    zk_store = GatedZooKeeper(zookeeper.hosts, zk_root)
    log = open_log(nodes, zk_store)
    for i in range(10):
        log.append([r(i)])
    wait_until(log, lambda: len(log.coordinator.in_sync()) == 5, what="all five in sync")  # 3 of 5 open it
    nodes[3].kill()
    nodes[4].kill()
    for i in range(10, 400):
        log.append([r(i)])
    coord = log.coordinator
    zk_store.gate.clear()  # the first caught-up replica's metadata update stays in progress
    nodes[3].start()
    nodes[4].start()
    wait_until(log, lambda: all(coord.links[n.address].state == "joining" for n in nodes[3:])
               and coord.meta_writer.queued() == 1, timeout=60,
               what="both caught up, the second one's metadata update queued behind the first one's")
    zk_store.gate.set()
    wait_until(log, lambda: len(log.coordinator.in_sync()) == 5, timeout=60, what="both back in sync")
    assert log.coordinator.fenced is None
    assert log.append([r(400)]) == 400
    meta = PartitionMetaStore(zk_store, 0).load()[0]
    session = log.coordinator.session
    assert all(meta.replicas[n.address] == ReplicaState(session, UNRESOLVED) for n in nodes)
    # LSN 400 was acknowledged by a quorum; the other replicas confirm it on their own time
    wait_until(log, lambda: all(coord.links[n.address].acked >= 400 for n in nodes), timeout=60,
               what="every replica has confirmed LSN 400")
    log.close()
    for n in nodes:
        n.kill()
        assert n.records() == expected(401)
        assert ControlFile.open(str(n.dir)).read_state(0).low_water_mark >= 9
    zk_store.close()
