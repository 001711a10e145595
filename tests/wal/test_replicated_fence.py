"""A replicated engine (ZooKeeper metadata, three storage nodes) replaced by a newer coordinator
while its compaction commit was held: the commit is refused (metadata/fence.py), though the old
coordinator's ZooKeeper watch had not closed it yet, so the batch the new one swept is never named."""

from __future__ import annotations

import pytest
from support.replication import KEY, Node, start_all
from support.takeover_fence import SCHEMA, HeldCommit, in_thread, keys, ups

import sediment
from sediment.errors import CoordinatorSuperseded

pytestmark = pytest.mark.zookeeper


@pytest.mark.timeout(120)
def test_a_replicated_coordinators_commit_held_past_a_takeover_is_refused(tmp_path, zookeeper, zk_root):
    nodes = [Node(tmp_path / f"node{i}") for i in range(3)]
    spec = f"zk://{zookeeper.hosts}{zk_root}"
    start_all(nodes)  # a node's address is the port it bound at its first start
    options = {"replicas": [n.address for n in nodes], "cluster_key": str(KEY), "metadata": spec,
               "blob": f"file://{tmp_path}/shared-blobs", "compact_interval": 3600.0}
    try:
        old = sediment.open(tmp_path / "a", **options)
        old.add_relation("r", SCHEMA)
        for t in range(1, 4):
            old.append("r", ups([t], t))
            old.seal("r", t)
        held = HeldCommit(old)
        compacting = in_thread(old.compact)
        assert held.reached.wait(30)
        newer = sediment.open(tmp_path / "b", metadata=spec, compact_interval=3600.0)
        assert newer.swept
        held.release()
        assert compacting["done"].wait(60)
        assert isinstance(compacting.get("error"), CoordinatorSuperseded), compacting
        newer.close()
        old.close()
        with sediment.open(tmp_path / "c", metadata=spec) as again:
            assert keys(again, "r", 3) == [1, 2, 3]
    finally:
        for n in nodes:
            if n.proc is not None:
                n.kill()
