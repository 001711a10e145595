"""The engine on a replicated log: three storage nodes on loopback, metadata in ZooKeeper."""

from __future__ import annotations

import pyarrow as pa
import pytest
from test_replication import KEY, Node

import sediment

SCHEMA = pa.schema([("k", pa.int64())])
pytestmark = pytest.mark.zookeeper


def ups(ks, t):
    return pa.table({"k": pa.array(ks, pa.int64()), "time": pa.array([t] * len(ks), pa.int64()),
                     "diff": pa.array([1] * len(ks), pa.int64())})


def test_engine_over_three_storage_nodes_survives_a_dead_replica_and_a_restart(tmp_path, zookeeper, zk_root):
    nodes = [Node(tmp_path / f"node{i}") for i in range(3)]
    for n in nodes:
        n.start()
    options = {"replicas": [n.address for n in nodes], "cluster_key": str(KEY),
               "metadata": f"zk://{zookeeper.hosts}{zk_root}", "compact": False}
    try:
        with sediment.open(tmp_path / "coordinator", **options) as eng:
            eng.add_relation("r", SCHEMA)
            for t in range(1, 11):
                eng.append("r", ups([t, t + 100], t))
                eng.seal("r", t)
                if t == 5:
                    nodes[2].kill()  # a quorum of two remains: writes go on
            assert eng.snapshot("r", 10).num_rows == 20
        with sediment.open(tmp_path / "coordinator", **options) as eng:
            assert eng.relations() == ["r"] and eng.sealed("r") == 10
            assert sorted(eng.snapshot("r", 10).column("k").to_pylist()) == sorted(
                [t for t in range(1, 11)] + [t + 100 for t in range(1, 11)])
    finally:
        for n in nodes:
            if n.proc is not None:
                n.kill()
