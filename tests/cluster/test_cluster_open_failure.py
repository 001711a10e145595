"""A partition its member cannot open (here: the cluster's bucket is gone) is reported once in
the member's log, not once per retry, and clients are told why at their deadline instead of
only that no owner answered; once the cause is fixed the member opens it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from support.cluster_procs import TOKEN, running_cluster
from support.waiting import poll_until

import sediment
from sediment.errors import CoordinatorUnavailable

pytestmark = [pytest.mark.zookeeper, pytest.mark.s3, pytest.mark.timeout(120)]


def test_a_partition_that_cannot_open_is_logged_once_and_its_reason_reaches_clients(tmp_path, zookeeper, zk_root,
                                                                                     moto_server, s3_bucket):
    s3 = moto_server.client()
    with running_cluster(tmp_path, zookeeper, zk_root, moto_server, s3_bucket, partitions=1) as cluster:
        s3.delete_bucket(Bucket=s3_bucket[1])  # empty still: nothing was opened
        try:
            _refused_then_opened(cluster, s3, s3_bucket[1])
        finally:
            if s3_bucket[1] not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
                s3.create_bucket(Bucket=s3_bucket[1])  # the fixture empties and deletes it


def _refused_then_opened(cluster, s3, bucket: str) -> None:
    """The member logs the failed open once; a client is told why; the bucket back, it opens."""
    member = cluster.start_member()
    log = Path(member.log.name)
    poll_until(lambda: "could not open partition 0" in log.read_text(), 30, "the member's failed open")
    with sediment.connect(cluster.uri, token=TOKEN, deadline=3.0) as db:
        with pytest.raises(CoordinatorUnavailable) as err:  # 3 s: the member retried its open twice or more
            db.add_relation("r", pa.schema([("k", pa.int64())]))
        text = str(err.value)
        assert "\n" not in text and f"bucket '{bucket}' does not exist" in text
        assert f"{member.uri}, which cannot open it" in text and "cluster status" in text
        assert log.read_text().count("could not open partition 0") == 1
        s3.create_bucket(Bucket=bucket)
    with sediment.connect(cluster.uri, token=TOKEN) as db:
        db.add_relation("r", pa.schema([("k", pa.int64())]))
        assert db.relations() == ["r"]
