"""A member counts on the session timeout ZooKeeper granted, not the one it asked for.

ZooKeeper grants at most its ``maxSessionTimeout`` (60 s on the test server). A member
resumed after a pause serves only while it read ZooKeeper within half the session timeout;
had it used the 120 s it asked for, it would serve up to 60 s after its last read, past the
moment the ensemble ended its session and another member took its partitions."""

from __future__ import annotations

from support.fixtures_zookeeper import MAX_SESSION_MS, ZooKeeperServer

from sediment.clock import ManualClock
from sediment.cluster import layout
from sediment.cluster.member import Member
from sediment.cluster.zk_membership import ZooKeeperMembership


def test_the_granted_session_timeout_is_recorded_at_connect(zookeeper: ZooKeeperServer, zk_root: str) -> None:
    where = layout.ClusterPath.parse(f"zk://127.0.0.1:{zookeeper.port}{zk_root}")
    granted_max = MAX_SESSION_MS / 1000
    for asked, expected in ((3.0, 3.0), (2 * granted_max, granted_max)):
        zk = layout.connect_zk(where, timeout=asked)
        try:
            assert layout.granted_timeout(zk, asked) == expected
        finally:
            zk.stop()
            zk.close()


def test_a_member_is_out_of_touch_after_half_the_granted_timeout(
        zookeeper: ZooKeeperServer, zk_root: str, tmp_path) -> None:
    where = layout.ClusterPath.parse(f"zk://127.0.0.1:{zookeeper.port}{zk_root}")
    granted_max = MAX_SESSION_MS / 1000
    clock = ManualClock(100.0)
    membership = ZooKeeperMembership(where)
    member = Member(where, "127.0.0.1:1", str(tmp_path), clock=clock, membership=membership)
    member.config = membership.config = layout.ClusterConfig(partitions=1, replicas=[], cluster_key="k",
                                                             blob="file:///x", session_timeout=2 * granted_max)
    membership._zk = layout.connect_zk(where, timeout=member.config.session_timeout)
    try:
        member._connected.set()
        member._heard = clock.current_time()  # as the control loop's last read of ZooKeeper
        clock.advance(granted_max / 2 - 1)
        assert member._in_touch()
        clock.advance(2)  # past half the granted 60 s, well within half the asked 120 s
        assert not member._in_touch()
    finally:
        membership._zk.stop()
        membership._zk.close()
