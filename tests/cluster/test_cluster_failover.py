"""Failover time with real processes: the manager moves a SIGKILLed member's partitions as
soon as its port refuses connections, long before its ZooKeeper session ends, and nothing
acknowledged is lost or applied twice on the way."""

from __future__ import annotations

import signal
import time

import pytest
from support.cluster_procs import TOKEN, Cluster
from test_cluster import SCHEMA, Writer, keys_of

import sediment

pytestmark = [pytest.mark.slow, pytest.mark.zookeeper, pytest.mark.s3, pytest.mark.timeout(240)]
SESSION = 10.0  # long, so that a move before it ends can only come from the refused connection


@pytest.fixture
def cluster(tmp_path, zookeeper, zk_root, moto_server, s3_bucket):
    c = Cluster(tmp_path, f"127.0.0.1:{zookeeper.port}", zk_root, moto_server.endpoint, s3_bucket[1],
                session_timeout=SESSION)
    try:
        yield c
    finally:
        c.close()


def test_a_killed_owner_is_replaced_before_its_session_ends(cluster):
    members = [cluster.start_member() for _ in range(3)]
    view = cluster.wait_assigned(members)
    with sediment.connect(cluster.uri, token=TOKEN) as db:
        for p in range(4):
            db.add_relation(f"r{p}", SCHEMA, partition=p)
        victim = next(cluster.owner_of(p) for p in range(4) if view["assignment"][p][0] != view["manager"])
        moved = [p for p in range(4) if view["assignment"][p][0] == victim.member_id]
        writers = [Writer(db, f"r{p}", 0) for p in range(4)]
        writers[moved[0]].first_ack_after(time.monotonic())
        victim.signal(signal.SIGKILL)
        victim.wait()
        killed = time.monotonic()  # reaped: no answer of it can arrive after this
        failover = writers[moved[0]].first_ack_after(killed)
        after = cluster.view()
        assert victim.member_id in after["members"], "its session ended already: the test proves nothing"
        assert failover < SESSION / 2, failover
        assert all(after["assignment"][p][0] != victim.member_id for p in moved)
        new_owner = cluster.owner_of(moved[0])
        assert new_owner.metric("sediment_cluster_failovers_total") >= 1
        for w in writers:
            acked = w.stop()
            assert keys_of(db, w.name, w.next + 1) == acked  # nothing lost, nothing twice
