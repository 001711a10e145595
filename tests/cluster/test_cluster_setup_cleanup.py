"""A test cluster whose setup fails part-way stops what it already started: the storage
nodes started before the one that failed are killed by their PIDs, not left running."""

from __future__ import annotations

import pytest
from support.cluster_procs import running_cluster
from support.replication import live_node_pids, make_refused_directory

pytestmark = [pytest.mark.zookeeper, pytest.mark.s3, pytest.mark.timeout(120)]


def test_a_cluster_whose_second_node_fails_to_start_leaves_no_node_running(tmp_path, zookeeper, zk_root,
                                                                           moto_server, s3_bucket):
    make_refused_directory(tmp_path / "node1")
    with pytest.raises(AssertionError, match="node1 did not start"):
        with running_cluster(tmp_path, zookeeper, zk_root, moto_server, s3_bucket):
            pass
    assert live_node_pids(tmp_path / "node0") == []
    assert (tmp_path / "node0").exists()  # it was started, then stopped


def test_a_cluster_that_cannot_be_created_leaves_no_node_running(tmp_path, zookeeper, zk_root, moto_server,
                                                                   s3_bucket):
    import subprocess

    with pytest.raises(subprocess.CalledProcessError):  # `sediment cluster create` refuses 0 partitions
        with running_cluster(tmp_path, zookeeper, zk_root, moto_server, s3_bucket, partitions=0):
            pass
    assert all(live_node_pids(tmp_path / f"node{i}") == [] for i in range(3))
    assert all((tmp_path / f"node{i}").exists() for i in range(3))
