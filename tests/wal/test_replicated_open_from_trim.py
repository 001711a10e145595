"""A new owner of a replicated partition reads the log from the trim point on, not from the
first record of the oldest segment the storage nodes still keep (they drop whole segments
only): three real storage node processes, metadata in ZooKeeper."""

from __future__ import annotations

import pyarrow as pa
import pytest
from support.replication import KEY, Node, start_all

import sediment

SCHEMA = pa.schema([("k", pa.int64())])
pytestmark = pytest.mark.zookeeper


def ups(ks, t):
    return pa.table({"k": pa.array(ks, pa.int64()), "time": pa.array([t] * len(ks), pa.int64()),
                     "diff": pa.array([1] * len(ks), pa.int64())})


def state(eng) -> dict:
    return {name: (eng.sealed(name), sorted(eng.snapshot(name, eng.sealed(name)).column("k").to_pylist()))
            for name in ("hot", "quiet", "both")}


def test_a_new_owner_scans_from_the_trim_point_and_a_restarted_node_only_makes_it_read_more(
        tmp_path, zookeeper, zk_root):
    nodes = [Node(tmp_path / f"node{i}") for i in range(3)]  # 64 MiB segments: nothing is dropped on disk
    start_all(nodes)
    options = {"replicas": [n.address for n in nodes], "cluster_key": str(KEY),
               "metadata": f"zk://{zookeeper.hosts}{zk_root}", "blob": f"file://{tmp_path}/shared-blobs"}
    try:
        with sediment.open(tmp_path / "old-owner", **options) as eng:
            for name in ("hot", "quiet", "both"):
                eng.add_relation(name, SCHEMA)
            eng.append("quiet", ups([1], 1))  # written and sealed once, then idle: its trace lags the trim
            eng.seal("quiet", 1)
            for t in range(1, 201):
                eng.append("hot", ups([t], t))
                eng.seal("hot", t)
            eng.compact()
            trimmed = eng.wal.start_lsn
            assert trimmed > 200
            with eng.transaction() as txn:  # past the trim point: replayed by the next owner
                txn.append("hot", ups([1000], 201))
                txn.append("both", ups([7], 3))
            eng.seal("both", 3)
            end = eng.wal.end_lsn
            expected = state(eng)
        assert all((n.dir / "0" / "0000000000000000000.seg").exists() for n in nodes), "LSN 0 is still on disk"

        with sediment.open(tmp_path / "new-owner", **options) as eng:
            assert eng.wal.start_lsn == trimmed, "the new owner's scan starts at the trim point"
            assert eng.wal.report.records == end - trimmed  # not the `trimmed` records below it
            assert state(eng) == expected
            eng.append("hot", ups([2000], 202))
            eng.seal("hot", 202)
            expected = state(eng)
            assert 1000 in expected["hot"][1] and 2000 in expected["hot"][1]

        for n in nodes:  # a restarted node forgets the trim point: it serves all it holds again
            n.kill()
            n.start()
        with sediment.open(tmp_path / "third-owner", **options) as eng:
            assert eng.wal.start_lsn == 0
            assert state(eng) == expected
    finally:
        for n in nodes:
            if n.proc is not None:
                n.kill()
