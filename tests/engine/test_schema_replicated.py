"""Schema evolution on the replicated log (three storage nodes, metadata in ZooKeeper): the
history lives in ZooKeeper, the WAL records' schema versions come back from the nodes, and
a new coordinator reads every version after a restart."""

from __future__ import annotations

import pyarrow as pa
import pytest
from support.replication import KEY

import sediment

pytestmark = pytest.mark.zookeeper


def test_alters_on_a_replicated_engine_survive_a_restart(tmp_path, zookeeper, zk_root, nodes):
    options = {"replicas": [n.address for n in nodes], "cluster_key": str(KEY),
               "metadata": f"zk://{zookeeper.hosts}{zk_root}", "blob": f"file://{tmp_path}/shared-blobs",
               "compact_interval": None}
    want = [{"id": 1, "product": "a", "qty": 4, "diff": 1}, {"id": 2, "product": "b", "qty": 4, "diff": 1},
            {"id": 3, "product": "c", "qty": 5, "diff": 1}]
    with sediment.open(tmp_path / "c", **options) as eng:
        eng.add_relation("r", pa.schema([("id", pa.int32()), ("item", pa.string()), ("note", pa.string())]))
        eng.append("r", pa.table({"id": pa.array([1], pa.int32()), "item": ["a"], "note": ["x"], "time": [1],
                                  "diff": [1]}))
        eng.seal("r", 1)
        eng.compact("r")  # version 0 in a batch
        eng.append("r", pa.table({"id": pa.array([2], pa.int32()), "item": ["b"], "note": ["y"], "time": [2],
                                  "diff": [1]}))  # version 0 in the replicated WAL
        eng.alter_relation("r", add=[pa.field("qty", pa.int32())], defaults={"qty": 4}, widen={"id": pa.int64()},
                           rename={"item": "product"}, drop=["note"])
        eng.append("r", pa.table({"id": [3], "product": ["c"], "qty": pa.array([5], pa.int32()), "time": [3],
                                  "diff": [1]}))  # version 1 in the replicated WAL
        eng.seal("r", 3)
        assert eng.snapshot("r", 3).to_pylist() == want
    with sediment.open(tmp_path / "c", **options) as eng:  # recovery from the nodes and ZooKeeper
        assert eng.schema_version("r") == 1
        assert eng.snapshot("r", 3).to_pylist() == want
        eng.compact("r")
        assert eng.snapshot("r", 3).to_pylist() == want
