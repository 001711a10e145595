"""The ZooKeeper metadata store after its connection drops: a reconnection attempt that the
server accepts and never answers (ZooKeeper 3.8 does this to a connection it takes while it
starts) costs a third of the session timeout, not the whole session."""

from __future__ import annotations

import logging
import struct

import pytest
from support.cut_proxy import CutProxy

from sediment.errors import InvalidMetadataRequest, MetadataUnavailable
from sediment.metadata.zookeeper import ATTEMPTS_PER_SESSION, attempt_hosts
from sediment.metadata.zookeeper import ZooKeeperMetadataStore as Store

SESSION = 15.0
# The held attempt is given SESSION / 3 (5 s), kazoo's retry then sleeps at most 1.4 s
# (max_delay 1 s, 40% jitter) and the next attempt is answered at once: about 6.4 s. With
# the whole session per attempt the client came back only after 15 s, its session expired.
RECONNECTED_WITHIN = SESSION * 2 / 3


def test_each_server_is_listed_so_an_attempt_gets_a_third_of_the_session() -> None:
    assert attempt_hosts("127.0.0.1:2181") == ["127.0.0.1:2181"] * ATTEMPTS_PER_SESSION
    assert attempt_hosts("a:1,b:2/chroot/x") == ["a:1", "b:2", "a:1", "b:2", "/chroot/x"]
    assert attempt_hosts("a:1,b:2,c:3") == ["a:1", "b:2", "c:3"]
    with pytest.raises(InvalidMetadataRequest, match="no ZooKeeper host"):
        attempt_hosts(",/x")


@pytest.mark.zookeeper
def test_a_reconnection_never_answered_is_abandoned_within_the_session(zookeeper, zk_root) -> None:
    proxy = CutProxy()
    proxy.upstream = zookeeper.hosts
    store = Store(proxy.uri.removeprefix("grpc://"), zk_root, timeout=10.0, session_timeout=SESSION)
    try:
        store.compare_and_set("k", b"v", None)
        # The reconnection's handshake carries the session id: the server gets it, its answer is lost.
        proxy.arm(struct.pack(">q", store.session_id))
        proxy.cut()
        assert proxy.triggered.wait(10), "the client did not try to reconnect through the proxy"
        assert store.wait_connected(RECONNECTED_WITHIN), (
            f"not reconnected {RECONNECTED_WITHIN}s after a handshake went unanswered")
        assert not store.session_lost
        got = store.get("k")
        assert got is not None and got.value == b"v"
    finally:
        store.close()
        proxy.close()


@pytest.mark.zookeeper
def test_an_unreachable_zookeeper_is_one_error_not_a_warning_per_attempt(zookeeper, zk_root, caplog) -> None:
    """kazoo warned at each attempt to reach a ZooKeeper that is not there (about 40 lines in
    10 s before the command's one-line error); once a client has connected, a lost connection
    is still warned about."""
    from support.ports import free_port
    from support.waiting import poll_until

    from sediment.cluster import layout

    caplog.set_level(logging.WARNING)
    nowhere = f"127.0.0.1:{free_port()}"
    with pytest.raises(MetadataUnavailable, match=f"cannot connect to ZooKeeper at {nowhere}"):
        Store(nowhere, zk_root, timeout=1.0)
    with pytest.raises(MetadataUnavailable, match=f"cannot reach ZooKeeper at {nowhere}"):
        layout.connect_zk(layout.ClusterPath.parse(f"zk://{nowhere}/c"), timeout=1.0)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("kazoo")] == []
    proxy = CutProxy()
    proxy.upstream = zookeeper.hosts
    store = Store(proxy.uri.removeprefix("grpc://"), zk_root, timeout=10.0, session_timeout=SESSION)
    try:
        proxy.cut()
        poll_until(lambda: any(r.name.startswith("kazoo") and r.levelno == logging.WARNING for r in caplog.records),
                   10.0, "a warning that the connection was lost")
        assert store.wait_connected(RECONNECTED_WITHIN)
    finally:
        store.close()
        proxy.close()
