"""A cluster of coordinators (issue 29), with real processes: a ZooKeeper, moto's S3, three
storage nodes and three ``sediment serve --cluster`` members, killed, paused and stopped by
their PIDs. The scenarios share one cluster per test where they can, to keep the suite fast."""

from __future__ import annotations

import signal
import time

import pyarrow as pa
import pytest
from cluster_procs import TOKEN, Cluster

import sediment

pytestmark = [pytest.mark.slow, pytest.mark.zookeeper, pytest.mark.s3, pytest.mark.timeout(240)]
SCHEMA = pa.schema([("k", pa.int64())])


def rows(keys: list[int], t: int = 1) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.int64()), "time": pa.array([t] * len(keys), pa.int64()),
                     "diff": pa.array([1] * len(keys), pa.int64())})


@pytest.fixture
def cluster(tmp_path, zookeeper, zk_root, moto_server, s3_bucket):
    c = Cluster(tmp_path, f"127.0.0.1:{zookeeper.port}", zk_root, moto_server.endpoint, s3_bucket[1])
    try:
        yield c
    finally:
        c.close()


def keys_of(client, name: str, as_of: int) -> list[int]:
    """The relation's keys as of ``as_of``, sealed first; a key twice shows as a diff of 2."""
    if client.sealed(name) < as_of:
        client.seal(name, as_of)
    table = client.snapshot(name, as_of)
    return sorted(k for k, d in zip(table.column("k").to_pylist(), table.column("diff").to_pylist(), strict=True)
                  for _ in range(d))


def test_members_share_partitions_and_a_killed_owner_is_replaced(cluster):
    members = [cluster.start_member() for _ in range(3)]
    cluster.wait_assigned(members)
    with sediment.connect(cluster.uri, token=TOKEN) as db:
        for p in range(4):
            db.add_relation(f"r{p}", SCHEMA, partition=p)
            db.append(f"r{p}", rows([p]))
        assert [keys_of(db, f"r{p}", 1) for p in range(4)] == [[0], [1], [2], [3]]
        victim = cluster.owner_of(0)
        acked = [0]
        victim.signal(signal.SIGKILL)
        killed = time.monotonic()
        victim.wait()
        for i in range(1, 40):
            db.append("r0", rows([i], t=i + 1))
            if i == 1:
                first_ack = time.monotonic() - killed
            acked.append(i)
        assert keys_of(db, "r0", 40) == acked  # nothing acknowledged lost, nothing twice
        assert first_ack <= cluster.session_timeout + 2 + 3, first_ack  # + the open of the partition's engine
        new_owner = cluster.owner_of(0)
        assert new_owner is not victim and new_owner.proc.poll() is None
        assert [keys_of(db, f"r{p}", 1) for p in range(1, 4)] == [[1], [2], [3]]
