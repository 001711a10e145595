"""A cluster client whose ZooKeeper stops answering (the real process SIGSTOPped): between
retries the client reads the cluster's layout again, and kazoo holds a read while its
connection is suspended, so before those reads were bounded an append whose owner had died
waited as long as ZooKeeper was away, whatever its ``deadline``. Now it ends about
``deadline`` seconds after the call with a typed error, and ``members()`` too."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid

import pyarrow as pa
import pytest
from kazoo.client import KazooState
from support.fixtures_zookeeper import ZooKeeperServer
from support.ports import free_port

from sediment.cluster import layout
from sediment.cluster_client import ClusterClient
from sediment.errors import CoordinatorUnavailable, SedimentError

pytestmark = [pytest.mark.zookeeper, pytest.mark.timeout(240)]
DEADLINE = 3.0
BOUND = DEADLINE + 15.0  # the deadline, and room for a loaded machine


def in_thread(call) -> tuple[threading.Thread, list]:
    out: list = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            out.append(exc)
    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, out


def test_calls_end_by_their_deadline_while_zookeeper_is_paused(tmp_path):
    zk_server = ZooKeeperServer(tmp_path / "zk")
    zk_server.start()
    paused, client, zk = False, None, None
    try:
        where = layout.ClusterPath.parse(f"zk://127.0.0.1:{zk_server.port}/paused")
        zk = layout.connect_zk(where)
        layout.create(zk, where, layout.ClusterConfig(partitions=1, replicas=["127.0.0.1:1"],
                                                      cluster_key=str(uuid.uuid4()), blob="file:///nowhere",
                                                      session_timeout=4.0))
        dead = f"grpc://127.0.0.1:{free_port()}"  # the owner's process is gone: its port refuses
        zk.create(where.path("members", "m-"), json.dumps({"advertise": dead}).encode(), ephemeral=True,
                  sequence=True)
        member = zk.get_children(where.path("members"))[0]
        zk.create(where.path("assignment"), layout.encode_assignment({0: (member, 1)}))
        zk.create(where.path("relations", "r"), b"0")
        client = ClusterClient(where.uri, "token", deadline=DEADLINE)
        suspended = threading.Event()
        client._zk.add_listener(lambda state: suspended.set() if state != KazooState.CONNECTED else None)
        os.kill(zk_server.pid, signal.SIGSTOP)
        paused = True
        assert suspended.wait(60), "the client's ZooKeeper connection never noticed the pause"

        began = time.monotonic()
        th, out = in_thread(lambda: client.append("r", pa.table({"k": [1], "time": [1], "diff": [1]})))
        th.join(BOUND)
        assert not th.is_alive(), f"an append with deadline={DEADLINE:g} s still ran after {BOUND:g} s"
        assert isinstance(out[0], SedimentError), out  # CoordinatorUnavailable or OutcomeUnknown
        assert time.monotonic() - began < BOUND

        th, out = in_thread(client.members)
        th.join(BOUND)
        assert not th.is_alive(), "members() waited for ZooKeeper"
        assert isinstance(out[0], CoordinatorUnavailable), out
    finally:
        if paused:
            os.kill(zk_server.pid, signal.SIGCONT)
        if client is not None:
            client.close()
        if zk is not None:  # else its reconnecting thread outlives the server, logging into later tests
            zk.stop()
            zk.close()
        zk_server.stop()
