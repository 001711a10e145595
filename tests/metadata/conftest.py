"""The metadata store of each implementation, for the tests that run over all of them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sediment.metadata.journal import JournalMetadataStore
from sediment.metadata.memory import MemoryMetadataStore
from sediment.metadata.protocol import MetadataStore
from sediment.metadata.s3 import S3MetadataStore
from sediment.metadata.zookeeper import ZooKeeperMetadataStore


@pytest.fixture(params=["memory", "journal", pytest.param("zookeeper", marks=pytest.mark.zookeeper),
                        pytest.param("s3", marks=pytest.mark.s3)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MetadataStore]:
    if request.param == "s3":
        # through the proxy that serializes conditional writes per object, as S3 does
        proxy = request.getfixturevalue("serializing_proxy")
        _, bucket = request.getfixturevalue("s3_bucket")
        s: MetadataStore = S3MetadataStore(bucket, "meta", endpoint_url=proxy.endpoint)
    elif request.param == "memory":
        s = MemoryMetadataStore()
    elif request.param == "journal":
        s = JournalMetadataStore(tmp_path / "meta")
    else:
        server = request.getfixturevalue("zookeeper")
        s = ZooKeeperMetadataStore(server.hosts, request.getfixturevalue("zk_root"), timeout=5)
    assert isinstance(s, MetadataStore)
    yield s
    s.close()
