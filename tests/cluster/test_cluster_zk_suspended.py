"""A cluster member whose ZooKeeper is suspended (the real ZooKeeper process SIGSTOPped, then
SIGCONTed): kazoo queues a call made while its connection is suspended until ZooKeeper answers
again, so before cluster/member.py bounded them a client asking for a relation the member had
not cached, or listing the relations, waited as long as the outage lasted, and a SIGTERMed
member never exited (its leave waited to write its ``leaving`` znode). Now every call ends in
bounded time with a typed error, the member stops serving, a SIGTERM ends it, and once
ZooKeeper runs again the cluster serves every partition."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pyarrow as pa
import pytest
from support.cluster_procs import TOKEN, running_cluster
from support.fixtures_zookeeper import ZooKeeperServer
from support.waiting import poll_until

import sediment
from sediment.client import Client
from sediment.cluster.member import ZK_CALL_TIMEOUT
from sediment.errors import NotPartitionOwner, SedimentError

pytestmark = [pytest.mark.slow, pytest.mark.zookeeper, pytest.mark.s3, pytest.mark.timeout(300)]
SCHEMA = pa.schema([("k", pa.int64())])
SESSION = 3.0
CALL_BOUND = ZK_CALL_TIMEOUT + 10.0  # the bound, and room for a loaded machine
EXIT_BOUND = 90.0  # a SIGTERMed member's leave, grace and closes, each bounded (see the test)


def rows(keys: list[int], t: int = 1) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.int64()), "time": pa.array([t] * len(keys), pa.int64()),
                     "diff": pa.array([1] * len(keys), pa.int64())})


def within(seconds: float, call: Any) -> Any:
    """``call()``'s result or exception, from a thread; fails the test if it is still running after ``seconds``."""
    out: list = []

    def run() -> None:
        try:
            out.append(("ok", call()))
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            out.append(("error", exc))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"the call did not end within {seconds} s while ZooKeeper was suspended"
    return out[0]


def test_a_member_whose_zookeeper_is_suspended_refuses_in_bounded_time_exits_and_recovers(
        tmp_path, moto_server, s3_bucket):
    zk = ZooKeeperServer(tmp_path / "zk")
    zk.start()
    stopped = False
    try:
        with running_cluster(tmp_path / "cluster", zk, "/suspended", moto_server, s3_bucket, partitions=2,
                             session_timeout=SESSION) as cluster:
            members = [cluster.start_member(), cluster.start_member()]
            cluster.wait_assigned(members)
            serving = cluster.owner_of(0)
            other = next(m for m in members if m is not serving)
            with Client(serving.uri, TOKEN) as db:
                db.add_relation("r0", SCHEMA, partition=0)
                db.append("r0", rows([1]))
                os.kill(zk.pid, signal.SIGSTOP)
                stopped = True
                suspended_at = time.monotonic()
                while True:  # appends are refused once the member is out of touch (half the session)
                    kind, value = within(CALL_BOUND, lambda: db.append("r0", rows([2], t=2)))
                    if kind == "error":
                        break
                    assert time.monotonic() - suspended_at < SESSION + CALL_BOUND, "still serving"
                assert isinstance(value, SedimentError), repr(value)
                for call in (lambda: db.snapshot("never-added", 0), db.relations,
                             lambda: db.add_relation("r1", SCHEMA, partition=0)):
                    kind, value = within(CALL_BOUND, call)
                    assert kind == "error" and isinstance(value, NotPartitionOwner), repr(value)
            began = time.monotonic()
            other.signal(signal.SIGTERM)
            other.wait(timeout=EXIT_BOUND)
            assert time.monotonic() - began < EXIT_BOUND
            os.kill(zk.pid, signal.SIGCONT)
            stopped = False
            with sediment.connect(cluster.uri, token=TOKEN) as client:

                def appended() -> bool:  # refused until the member that stayed (under a new member id:
                    # a new ZooKeeper session) has taken every partition again and opened them
                    try:
                        client.append("r0", rows([3], t=3))
                    except SedimentError:
                        return False
                    return True

                poll_until(appended, 60, "the cluster to serve r0 again")
                client.seal("r0", 3)
                keys = client.snapshot("r0", 3).column("k").to_pylist()
                assert 1 in keys and 3 in keys, keys
    finally:
        if stopped:
            os.kill(zk.pid, signal.SIGCONT)
        zk.stop()
