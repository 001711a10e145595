"""An engine on a replicated log after an append whose outcome is unknown (QuorumLost: two of
three storage nodes gone, the record on the third, which the next recovery keeps) refuses
reads and writes with EngineFailed until it is reopened, and the reopened engine shows the
record: no read answers from a state the reopen contradicts, and a retry of the append
cannot write the row a second time unseen."""

from __future__ import annotations

import pyarrow as pa
import pytest
from support.replication import KEY, Node, start_all

import sediment
from sediment.errors import EngineClosed, EngineFailed, QuorumLost

SCHEMA = pa.schema([("k", pa.int64())])
pytestmark = pytest.mark.zookeeper


def ups(ks, t):
    return pa.table({"k": pa.array(ks, pa.int64()), "time": pa.array([t] * len(ks), pa.int64()),
                     "diff": pa.array([1] * len(ks), pa.int64())})


def keys(eng) -> list[int]:
    return sorted(k for b in eng.replay("r") for k in b.column("k").to_pylist())


def test_after_quorum_lost_the_engine_refuses_reads_and_writes_until_reopened(tmp_path, zookeeper, zk_root):
    nodes = [Node(tmp_path / f"node{i}") for i in range(3)]
    start_all(nodes)
    options = {"replicas": [n.address for n in nodes], "cluster_key": str(KEY),
               "metadata": f"zk://{zookeeper.hosts}{zk_root}", "blob": f"file://{tmp_path}/shared-blobs",
               "compact_interval": 3600}
    try:
        eng = sediment.open(tmp_path / "c", **options)
        try:
            eng.add_relation("r", SCHEMA)
            eng.append("r", ups([1], 1))
            eng.seal("r", 1)
            sub = eng.subscribe("r", 1)
            nodes[1].kill()
            nodes[2].kill()
            with pytest.raises(QuorumLost):
                eng.append("r", ups([2], 2))  # reached node 0 only
            # before: the replay answered [1] (and a snapshot as of 2 would once sealed) while a reopen answers [1, 2]
            with pytest.raises(EngineFailed, match="open it again") as refused:
                keys(eng)
            assert "QuorumLost" in str(refused.value) and str(tmp_path / "c") in str(refused.value)
            with pytest.raises(EngineFailed):
                eng.snapshot("r", 1)
            with pytest.raises(EngineFailed):
                eng.append("r", ups([2], 2))  # the retry is refused, not written a second time
            with pytest.raises(EngineFailed):
                eng.relations()
            with pytest.raises(EngineFailed):
                eng.compact()
            with pytest.raises(EngineClosed, match="reopening"):
                while sub.next(timeout=30) is not None:  # its feed ended: it never sees the kept record
                    pass
        finally:
            eng.close()
        nodes[1].start()  # node 2 stays away: the recovery's quorum is node 0 (which holds k=2) and node 1
        with sediment.open(tmp_path / "c", **options) as eng:
            assert keys(eng) == [1, 2]
    finally:
        for n in nodes:
            if n.proc is not None:
                n.kill()
