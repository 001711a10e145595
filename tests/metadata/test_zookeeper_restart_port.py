"""The test ZooKeeper comes back on its port after stop(), even when another process held
the port meanwhile (support.fixtures_zookeeper with support.ports): clients configured with
its address reach it again; a port that stays taken fails the start naming the port."""

from __future__ import annotations

import socket
import threading

import pytest
from support.fixtures_zookeeper import ZooKeeperServer, four_letter_word
from support.ports import RESTART_DEADLINE, PortTaken

pytestmark = [pytest.mark.zookeeper, pytest.mark.timeout(180)]


def test_zookeeper_restarts_on_its_port_once_another_process_lets_it_go(zookeeper: ZooKeeperServer) -> None:
    port, hosts = zookeeper.port, zookeeper.hosts
    zookeeper.stop()
    held = socket.create_server(("127.0.0.1", port))
    starter = threading.Thread(target=zookeeper.start)
    try:
        starter.start()
        starter.join(1.0)
        assert starter.is_alive() and zookeeper.pid is None  # waiting for the port, no JVM started
        held.close()
        starter.join(120)
        assert not starter.is_alive()
        assert (zookeeper.port, zookeeper.hosts) == (port, hosts) and four_letter_word(port, "ruok") == "imok"
    finally:
        held.close()
        starter.join(120)
        zookeeper.start()


def test_zookeeper_fails_naming_its_port_when_it_stays_taken(zookeeper: ZooKeeperServer) -> None:
    port = zookeeper.port
    zookeeper.stop()
    zookeeper.restart_deadline = 0.5
    try:
        with socket.create_server(("127.0.0.1", port)):
            with pytest.raises(PortTaken, match=f"ZooKeeper: 127.0.0.1:{port} stayed taken"):
                zookeeper.start()
            assert zookeeper.pid is None
    finally:
        zookeeper.restart_deadline = RESTART_DEADLINE
        zookeeper.start()
    assert four_letter_word(port, "ruok") == "imok"
