"""The cluster of member processes most tests here run against (tests/support/cluster_procs.py)."""

from __future__ import annotations

import pytest
from support.cluster_procs import Cluster


@pytest.fixture
def cluster(tmp_path, zookeeper, zk_root, moto_server, s3_bucket):
    """Members started by the test (``cluster.start_member()``), every one stopped at the end."""
    c = Cluster(tmp_path, f"127.0.0.1:{zookeeper.port}", zk_root, moto_server.endpoint, s3_bucket[1])
    try:
        yield c
    finally:
        c.close()
