"""``sediment cluster create`` of an S3-only cluster (``--metadata s3://...``), through the CLI's
main in process against moto's S3: options that only a ZooKeeper cluster's storage nodes use
are refused in one line, with nothing created."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from sediment.cli import main as cli_main
from sediment.cluster import s3_layout
from sediment.errors import InvalidArgument

pytestmark = pytest.mark.s3


def objects(moto_server, bucket: str) -> list[str]:
    s3 = moto_server.client()
    try:
        return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    finally:
        s3.close()


def test_an_s3_only_cluster_refuses_a_cluster_key_and_creates_nothing(s3_bucket, moto_server, capsys):
    """It was accepted and recorded, but an S3-only cluster has no storage nodes, whose key it is:
    a user who gave one would believe it meant something."""
    endpoint, bucket = s3_bucket
    uri = f"s3://{bucket}/prod?endpoint={endpoint}"
    create = ["cluster", "create", "--metadata", uri, "--partitions", "2", "--blob", f"s3://{bucket}/prod-blobs"]
    assert cli_main([*create, "--cluster-key", str(uuid.uuid4())]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--cluster-key is the storage nodes' key, and an S3-only cluster" in err, err
    assert "leave --cluster-key out; nothing was created" in err
    assert objects(moto_server, bucket) == []
    assert cli_main(create) == 0  # the same command without it
    where = s3_layout.S3ClusterPath.parse(uri)
    store = s3_layout.open_store(where)
    try:
        config = s3_layout.read_config(store, where)
    finally:
        store.close()
    assert config.cluster_key == ""
    with pytest.raises(InvalidArgument, match=r"^an S3-only cluster .* no cluster key .*: leave it out$"):
        s3_layout.check_config(dataclasses.replace(config, cluster_key=str(uuid.uuid4())))
