"""Fixtures for S3 tests: a moto server on 127.0.0.1 (written with the blob stores).

``moto_server`` is one real moto HTTP server for the session; ``s3_bucket`` a fresh
bucket per test; ``blob_store`` a fresh store per test on each backend (memory, file,
S3 under a random prefix of a shared bucket), so conformance tests run on all three;
``faulty_proxy`` a fault-injecting proxy in front of moto.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from moto.server import ThreadedMotoServer

from sediment.blob import FileBlobStore, MemoryBlobStore, S3BlobStore
from sediment.blob.protocol import BlobStore
from support.faulty_proxy import FaultyProxy

# The blob_store fixture's S3 store goes multipart above this size (parts of 5 MiB).
TEST_MULTIPART_THRESHOLD = 6 * 1024 * 1024


@dataclass
class MotoServer:
    """A running moto S3 server; ``client()`` is a plain boto3 client for setup and checks."""

    endpoint: str
    server: ThreadedMotoServer

    def client(self, **config: Any) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            config=Config(retries={"mode": "standard", "total_max_attempts": 2}, **config),
        )


def unique_bucket_name() -> str:
    return f"sediment-{uuid.uuid4().hex[:16]}"


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    """moto on 127.0.0.1 with test credentials in the environment (restored afterwards).

    The developer's AWS profile, config files and endpoint variable are hidden so they
    cannot leak into the tests.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.setenv("AWS_CONFIG_FILE", os.devnull)
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
        for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            mp.delenv(name, raising=False)
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # its request lines outlive a test's captured stream
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            yield MotoServer(endpoint=f"http://{host}:{port}", server=server)
        finally:
            server.stop()


def _empty_and_delete(client: Any, bucket: str) -> None:
    for upload in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
        client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=bucket, Key=obj["Key"])
    client.delete_bucket(Bucket=bucket)


@pytest.fixture
def s3_bucket(moto_server: MotoServer) -> Iterator[tuple[str, str]]:
    """A fresh, empty bucket: yields (endpoint, bucket name); emptied and deleted afterwards."""
    client = moto_server.client()
    name = unique_bucket_name()
    client.create_bucket(Bucket=name)
    try:
        yield moto_server.endpoint, name
    finally:
        _empty_and_delete(client, name)
        client.close()


@pytest.fixture(scope="session")
def _shared_blob_bucket(moto_server: MotoServer) -> Iterator[str]:
    client = moto_server.client()
    name = unique_bucket_name()
    client.create_bucket(Bucket=name)
    try:
        yield name
    finally:
        _empty_and_delete(client, name)
        client.close()


@pytest.fixture(
    params=["memory", "file", pytest.param("s3", marks=pytest.mark.s3)],
)
def blob_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlobStore]:
    """A fresh, empty store on each backend; the S3 one lives under a random prefix."""
    store: BlobStore
    if request.param == "memory":
        store = MemoryBlobStore()
    elif request.param == "file":
        store = FileBlobStore(tmp_path / "blobs")
    else:
        moto: MotoServer = request.getfixturevalue("moto_server")
        bucket: str = request.getfixturevalue("_shared_blob_bucket")
        store = S3BlobStore(
            bucket,
            prefix=f"test-{uuid.uuid4().hex}",
            endpoint_url=moto.endpoint,
            connect_timeout=2.0,
            read_timeout=10.0,
            max_attempts=3,
            multipart_threshold=TEST_MULTIPART_THRESHOLD,
            part_size=5 * 1024 * 1024,
        )
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def faulty_proxy(moto_server: MotoServer) -> Iterator[FaultyProxy]:
    """A fault-injecting proxy in front of moto (``.endpoint`` is where clients should connect)."""
    with FaultyProxy(moto_server.endpoint) as proxy:
        yield proxy


@pytest.fixture
def serializing_proxy(moto_server: MotoServer) -> Iterator[FaultyProxy]:
    """A fault-injecting proxy that also forwards conditional requests one at a time per object,
    as S3 does (moto alone can let two racing conditional PUTs both win)."""
    with FaultyProxy(moto_server.endpoint, serialize_conditional=True) as proxy:
        yield proxy
