"""`sediment verify` on a replicated engine's data directory: it checks the metadata in
ZooKeeper, the batches in the shared blob store and every storage node's copy of the log,
read-only, and never reports "ok" about what it could not check."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from support.replication import KEY

import sediment
from sediment.cli import main
from sediment.clock import ManualClock

SCHEMA = pa.schema([("k", pa.int64())])
pytestmark = pytest.mark.zookeeper


def ups(ks, t):
    return pa.table({"k": pa.array(ks, pa.int64()), "time": pa.array([t] * len(ks), pa.int64()),
                     "diff": pa.array([1] * len(ks), pa.int64())})


def verify(capsys, *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    return code, capsys.readouterr().out


@pytest.fixture
def cluster(tmp_path, zookeeper, zk_root, nodes):
    spec = f"zk://{zookeeper.hosts}{zk_root}"
    with sediment.open(tmp_path / "c", replicas=[n.address for n in nodes], cluster_key=str(KEY), metadata=spec,
                       blob=f"file://{tmp_path}/shared-blobs", clock=ManualClock()) as eng:
        eng.add_relation("r", SCHEMA)
        for t in range(1, 11):
            eng.append("r", ups([t, t + 100], t))
            eng.seal("r", t)
            if t == 5:
                eng.compact()
    return nodes, spec


def test_verify_checks_the_metadata_batches_and_every_node_without_metadata_option(tmp_path, cluster, capsys):
    nodes, spec = cluster
    data = str(tmp_path / "c")
    code, out = verify(capsys, "--data-dir", data, "verify", "--verbose")  # the marker names the metadata
    assert code == 0, out
    assert "checked 0" not in out and out.splitlines()[-1] == "ok: no problems"
    for n in nodes:
        assert f"storage node {n.address} partition 0: LSN" in out
    assert f"{spec}/engine/storage" in out and "shared-blobs/" in out

    nodes[2].kill()  # a quorum remains: the engine would open, verify says so and notes the node
    code, out = verify(capsys, "--data-dir", data, "verify")
    assert code == 0, out
    assert f"note: storage node {nodes[2].address} partition 0: not reachable" in out

    nodes[1].kill()  # no quorum: the engine would not open, and verify cannot check the log
    code, out = verify(capsys, "--data-dir", data, "verify")
    assert code == 1, out
    assert "only 1 of 3 storage nodes" in out and "needs 2 to open" in out
    assert "--repair" not in out.splitlines()[-1]


def test_verify_reports_a_damaged_batch_and_an_unreachable_metadata_store(tmp_path, cluster, capsys):
    _nodes, spec = cluster
    data = str(tmp_path / "c")
    batches = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "shared-blobs") for f in fs
               if f.endswith(".parquet")]
    assert batches, "the compaction wrote no batch"
    with open(batches[0], "r+b") as f:
        f.seek(10)
        byte = f.read(1)
        f.seek(10)
        f.write(bytes([byte[0] ^ 0xFF]))
    code, out = verify(capsys, "--data-dir", data, "verify")
    assert code == 1 and "problem: relation 'r'" in out, out

    code, out = verify(capsys, "--data-dir", data, "--metadata", "zk://127.0.0.1:1/nowhere", "verify")
    assert code == 1 and "cannot be opened" in out and "nothing was checked" in out, out
    assert "ok: no problems" not in out


def test_verify_repair_on_a_replicated_directory_is_refused_changing_nothing(tmp_path, cluster, capsys):
    data = str(tmp_path / "c")
    before = sorted(os.listdir(data))
    capsys.readouterr()
    assert main(["--data-dir", data, "verify", "--repair"]) != 0
    err = capsys.readouterr().err
    assert "replicated engine" in err and "storage nodes' recovery" in err
    assert sorted(os.listdir(data)) == before


def test_verify_beside_a_running_coordinator_changes_nothing_it_relies_on(tmp_path, zookeeper, zk_root, nodes, capsys):
    """verify only asks (INFO, READ in the nodes' current session): the coordinator serving
    the engine meanwhile is neither fenced nor disturbed, and its next writes succeed."""
    spec = f"zk://{zookeeper.hosts}{zk_root}"
    with sediment.open(tmp_path / "c", replicas=[n.address for n in nodes], cluster_key=str(KEY),
                       metadata=spec, blob=f"file://{tmp_path}/shared-blobs") as eng:
        eng.add_relation("r", SCHEMA)
        eng.append("r", ups([1], 1))
        eng.seal("r", 1)
        session = eng.wal.coordinator.session
        code, out = verify(capsys, "--data-dir", str(tmp_path / "other"), "--metadata", spec, "verify")
        assert code == 0, out
        eng.append("r", ups([2], 2))
        eng.seal("r", 2)
        assert eng.wal.coordinator.fenced is None and eng.wal.coordinator.session == session
        assert eng.snapshot("r", 2).num_rows == 2
        assert not (tmp_path / "other").exists(), "verify created no directory"


def test_verify_checks_the_log_partition_the_engine_uses(tmp_path, zookeeper, zk_root, nodes, capsys):
    """A cluster's partition n keeps its log in partition n of the storage nodes (and its
    metadata under store/partition/n): verify of its directory checks that one, not 0."""
    spec = f"zk://{zookeeper.hosts}{zk_root}/p3"
    data = tmp_path / "partition-3"
    with sediment.open(data, replicas=[n.address for n in nodes], cluster_key=str(KEY), metadata=spec,
                       log_partition=3, blob=f"file://{tmp_path}/shared-blobs", clock=ManualClock()) as eng:
        eng.add_relation("r", SCHEMA)
        eng.append("r", ups([1, 2], 1))
        eng.seal("r", 1)
    code, out = verify(capsys, "--data-dir", str(data), "verify", "--verbose")
    assert code == 0, out
    assert "no partition metadata" not in out and out.splitlines()[-1] == "ok: no problems", out
    for n in nodes:
        assert f"storage node {n.address} partition 3: LSN" in out, out
