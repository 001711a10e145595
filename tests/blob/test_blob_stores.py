"""Blob stores: one conformance suite over memory, file and S3 (moto over HTTP), then
file-store crash-safety and S3 fault tolerance through a real fault-injecting proxy."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from support.faulty_proxy import FaultyProxy
from support.fixtures_s3 import TEST_MULTIPART_THRESHOLD, MotoServer
from support.protocols import assert_takes_protocol_calls

from sediment.blob import BlobStore, FileBlobStore, MemoryBlobStore, S3BlobStore, open_blob_store
from sediment.blob.keys import TEMP_SUFFIX
from sediment.errors import BlobAlreadyExists, BlobError, BlobNotFound

pytestmark = pytest.mark.timeout(30)

BINARY = bytes(range(256)) + b"\x00\x00tail\x00"

UNSAFE_KEYS = [
    "",
    "/abs",
    "/etc/passwd",
    "../escape",
    "a/../../b",
    "a/./b",
    "..",
    "a//b",
    "a/",
    "a\\b",
    "..\\x",
    "nul\x00byte",
    f"x{TEMP_SUFFIX}",
]


# --- conformance: every backend -------------------------------------------------------------


def test_store_takes_the_protocols_calls(blob_store: BlobStore) -> None:
    """Each protocol method is called as the protocol declares it (a runtime Protocol checks
    method names only): the same parameters and defaults, and list() with no prefix lists
    every key."""
    assert_takes_protocol_calls(blob_store, BlobStore)
    for key in ("b/2", "a/1"):
        blob_store.put(key, b"x")
    assert blob_store.list() == blob_store.list("") == ["a/1", "b/2"]


def test_put_get_binary_round_trip(blob_store: BlobStore) -> None:
    blob_store.put("obj", BINARY)
    assert blob_store.get("obj") == BINARY
    assert blob_store.size("obj") == len(BINARY)


def test_empty_object(blob_store: BlobStore) -> None:
    blob_store.put("empty", b"")
    assert blob_store.get("empty") == b""
    assert blob_store.size("empty") == 0
    assert blob_store.get_range("empty", 0, 10) == b""
    assert blob_store.list() == ["empty"]


def test_put_overwrites(blob_store: BlobStore) -> None:
    blob_store.put("k", b"first version, longer")
    blob_store.put("k", b"second")
    assert blob_store.get("k") == b"second"
    assert blob_store.size("k") == 6


def test_get_range(blob_store: BlobStore) -> None:
    blob_store.put("r", b"0123456789")
    assert blob_store.get_range("r", 0, 4) == b"0123"
    assert blob_store.get_range("r", 3, 4) == b"3456"
    assert blob_store.get_range("r", 8, 100) == b"89"
    assert blob_store.get_range("r", 10, 5) == b""
    assert blob_store.get_range("r", 50, 5) == b""
    assert blob_store.get_range("r", 2, 0) == b""
    with pytest.raises(ValueError, match="'r'"):
        blob_store.get_range("r", -1, 2)


def test_put_if_absent(blob_store: BlobStore) -> None:
    blob_store.put_if_absent("once", b"winner")
    with pytest.raises(BlobAlreadyExists, match="'once'"):
        blob_store.put_if_absent("once", b"loser")
    assert blob_store.get("once") == b"winner"
    assert blob_store.list() == ["once"]


@pytest.mark.parametrize("op", ["get", "size", "get_range", "get_range_empty"])
def test_missing_key_is_not_found(blob_store: BlobStore, op: str) -> None:
    blob_store.put("present", b"x")
    with pytest.raises(BlobNotFound, match="'dir/missing'") as info:
        if op == "get":
            blob_store.get("dir/missing")
        elif op == "size":
            blob_store.size("dir/missing")
        elif op == "get_range":
            blob_store.get_range("dir/missing", 0, 4)
        else:
            blob_store.get_range("dir/missing", 0, 0)
    assert isinstance(info.value, LookupError)


def test_delete_is_idempotent(blob_store: BlobStore) -> None:
    blob_store.put("d/x", b"1")
    blob_store.put("d/y", b"2")
    blob_store.delete("d/x")
    blob_store.delete("d/x")
    blob_store.delete("never/existed")
    assert blob_store.list() == ["d/y"]
    with pytest.raises(BlobNotFound):
        blob_store.get("d/x")
    blob_store.put_if_absent("d/x", b"again")
    assert blob_store.get("d/x") == b"again"


def test_list_sorted_and_prefix_filtered(blob_store: BlobStore) -> None:
    keys = ["b/2", "a", "b/10/x", "ab", "b/1", "c/d/e/f", "b-sibling", "a1/z"]
    for key in keys:
        blob_store.put(key, key.encode())
    assert blob_store.list() == sorted(keys)
    assert blob_store.list("") == sorted(keys)
    assert blob_store.list("b/") == ["b/1", "b/10/x", "b/2"]
    assert blob_store.list("b/1") == ["b/1", "b/10/x"]
    assert blob_store.list("b") == ["b-sibling", "b/1", "b/10/x", "b/2"]
    assert blob_store.list("a") == ["a", "a1/z", "ab"]
    assert blob_store.list("c/d/e/") == ["c/d/e/f"]
    assert blob_store.list("zzz") == []
    assert blob_store.list("nope/") == []
    assert all(blob_store.get(k) == k.encode() for k in keys)


def test_large_object_round_trips(blob_store: BlobStore) -> None:
    data = os.urandom(TEST_MULTIPART_THRESHOLD + 5 * 1024 * 1024 + 123)
    blob_store.put("big/object", data)
    assert blob_store.size("big/object") == len(data)
    assert blob_store.get("big/object") == data
    assert blob_store.get_range("big/object", len(data) - 200, 1000) == data[-200:]
    if isinstance(blob_store, S3BlobStore):
        head = blob_store._client.head_object(Bucket=blob_store.bucket, Key=blob_store.prefix + "big/object")
        assert head["ETag"].strip('"').endswith("-3"), "expected a 3-part multipart upload"


@pytest.mark.parametrize("key", UNSAFE_KEYS)
def test_unsafe_keys_rejected(blob_store: BlobStore, key: str) -> None:
    for op in (
        lambda: blob_store.put(key, b"x"),
        lambda: blob_store.put_if_absent(key, b"x"),
        lambda: blob_store.get(key),
        lambda: blob_store.size(key),
        lambda: blob_store.delete(key),
    ):
        with pytest.raises(ValueError) as info:
            op()
        assert repr(key) in str(info.value) or key == ""
    assert blob_store.list() == []


def test_closed_store_refuses(blob_store: BlobStore) -> None:
    blob_store.put("k", b"v")
    blob_store.close()
    with pytest.raises(BlobError, match="closed"):
        blob_store.get("k")
    with pytest.raises(BlobError, match="closed"):
        blob_store.list()


def test_concurrent_put_if_absent_has_one_winner(blob_store: BlobStore, request: pytest.FixtureRequest) -> None:
    if isinstance(blob_store, S3BlobStore):  # moto checks without a lock: race through the serializing proxy
        proxy = request.getfixturevalue("serializing_proxy")
        blob_store = S3BlobStore(blob_store.bucket, prefix=blob_store.prefix, endpoint_url=proxy.endpoint)
        request.addfinalizer(blob_store.close)
    winners: list[int] = []
    losers: list[int] = []
    barrier = threading.Barrier(8)

    def contend(i: int) -> None:
        barrier.wait()
        try:
            blob_store.put_if_absent("lock", f"writer-{i}".encode())
            winners.append(i)
        except BlobAlreadyExists:
            losers.append(i)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1 and len(losers) == 7
    assert blob_store.get("lock") == f"writer-{winners[0]}".encode()


# --- memory store ---------------------------------------------------------------------------


def test_named_memory_stores_share_objects() -> None:
    name = f"shared-{uuid.uuid4().hex}"
    first = MemoryBlobStore(name=name)
    first.put("k", b"v")
    first.close()
    second = MemoryBlobStore(name=name)
    assert second.get("k") == b"v"
    assert MemoryBlobStore().list() == []
    MemoryBlobStore.forget(name)
    assert MemoryBlobStore(name=name).list() == []


# --- file store -----------------------------------------------------------------------------


def _all_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("key", ["../outside", "/tmp/abs", "a/../../outside", "a\\..\\..\\outside"])
def test_file_store_never_writes_outside_root(tmp_path: Path, key: str) -> None:
    store = FileBlobStore(tmp_path / "root")
    with pytest.raises(ValueError, match="blob key"):
        store.put(key, b"x")
    assert _all_files(tmp_path) == []


def test_file_store_objects_are_plain_files(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path)
    store.put("batches/rel/0001", b"payload")
    assert (tmp_path / "batches" / "rel" / "0001").read_bytes() == b"payload"


def test_leftover_temporary_is_unlisted_and_swept(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path)
    store.put("dir/real", b"complete")
    orphan = tmp_path / "dir" / f"real.deadbeef{TEMP_SUFFIX}"
    orphan.write_bytes(b"half-writ")
    top_orphan = tmp_path / f"other.cafe{TEMP_SUFFIX}"
    top_orphan.write_bytes(b"")
    assert store.list() == ["dir/real"]
    assert store.list("dir/") == ["dir/real"]
    assert store.sweep_temporaries(min_age_seconds=3600) == []
    assert orphan.exists()
    removed = store.sweep_temporaries()
    assert removed == sorted([f"dir/real.deadbeef{TEMP_SUFFIX}", f"other.cafe{TEMP_SUFFIX}"])
    assert not orphan.exists() and not top_orphan.exists()
    assert store.get("dir/real") == b"complete"


def test_file_writes_leave_no_temporaries(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path)
    store.put("a/k", b"1")
    store.put("a/k", b"2")
    store.put_if_absent("a/j", b"3")
    with pytest.raises(BlobAlreadyExists):
        store.put_if_absent("a/j", b"4")
    assert _all_files(tmp_path) == ["a/j", "a/k"]
    assert store.get("a/j") == b"3"


def test_file_put_is_atomic_for_concurrent_readers(tmp_path: Path) -> None:
    """Readers racing overwrites see one complete version or the other, never a mix or a torn file."""
    store = FileBlobStore(tmp_path)
    versions = [b"A" * 2_000_000, b"B" * 1_000_003]
    store.put("hot", versions[0])
    stop = threading.Event()
    seen: set[bytes] = set()
    bad: list[int] = []

    def reader() -> None:
        while not stop.is_set():
            data = store.get("hot")
            if data not in versions:
                bad.append(len(data))
            seen.add(data[:1])
            assert store.list() == ["hot"]

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for i in range(40):
            store.put("hot", versions[i % 2])
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert bad == []
    assert seen <= {b"A", b"B"} and seen
    assert _all_files(tmp_path) == ["hot"]


def test_file_key_cannot_be_object_and_directory(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path)
    store.put("a", b"object")
    with pytest.raises(BlobError, match="'a/b'"):
        store.put("a/b", b"x")
    store.put("d/e", b"x")
    with pytest.raises(BlobError, match="directory"):
        store.put("d", b"x")
    with pytest.raises(BlobNotFound):
        store.get("d")
    assert store.list() == ["a", "d/e"]


# --- S3: fault tolerance through a real proxy -----------------------------------------------


def _is_part(method: str, path: str) -> bool:
    return method == "PUT" and "partNumber=" in path


@pytest.fixture
def proxied(
    faulty_proxy: FaultyProxy, s3_bucket: tuple[str, str], moto_server: MotoServer
) -> Iterator[tuple[S3BlobStore, FaultyProxy, Any]]:
    """An S3 store reaching moto through the faulty proxy (3 attempts, 0.5 s read timeout),
    plus the proxy and a direct moto client to check what really got stored."""
    _, bucket = s3_bucket
    store = S3BlobStore(
        bucket,
        prefix="p",
        endpoint_url=faulty_proxy.endpoint,
        connect_timeout=0.5,
        read_timeout=0.5,
        max_attempts=3,
        multipart_threshold=6 * 1024 * 1024,
        part_size=5 * 1024 * 1024,
        multipart_concurrency=2,
    )
    direct = moto_server.client()
    try:
        yield store, faulty_proxy, direct
    finally:
        store.close()
        direct.close()


def _exists(direct: Any, bucket: str, key: str) -> bool:
    try:
        direct.head_object(Bucket=bucket, Key=key)
        return True
    except ClientError as e:
        assert e.response["Error"]["Code"] in ("404", "NoSuchKey")
        return False


@pytest.mark.s3
@pytest.mark.parametrize("status", [500, 503])
def test_s3_put_and_get_survive_transient_errors(proxied: Any, status: int) -> None:
    store, proxy, direct = proxied
    proxy.fail_next(2, status=status)
    store.put("k", b"value")
    proxy.fail_next(2, status=status)
    assert store.get("k") == b"value"
    proxy.fail_next(2, status=status)
    assert store.list() == ["k"]
    assert [kind for _, _, kind in proxy.log.faults] == ["fail"] * 6
    assert direct.get_object(Bucket=store.bucket, Key="p/k")["Body"].read() == b"value"


@pytest.mark.s3
@pytest.mark.parametrize("op", ["put", "put_if_absent"])
def test_s3_write_past_retry_budget_fails_cleanly(proxied: Any, op: str) -> None:
    store, proxy, direct = proxied
    proxy.fail_next(3, status=503)
    with pytest.raises(BlobError) as info:
        getattr(store, op)("doomed/key", b"value")
    assert not isinstance(info.value, BlobAlreadyExists)
    message = str(info.value)
    assert "'doomed/key'" in message and store.bucket in message
    assert "3 attempt" in message and "ServiceUnavailable" in message
    assert not _exists(direct, store.bucket, "p/doomed/key")
    assert proxy.pending() == 0
    getattr(store, op)("doomed/key", b"value")
    assert store.get("doomed/key") == b"value"


@pytest.mark.s3
def test_s3_multipart_survives_transient_part_errors(proxied: Any) -> None:
    store, proxy, direct = proxied
    data = os.urandom(11 * 1024 * 1024)
    proxy.fail_next(2, status=503, match=lambda m, p: _is_part(m, p) and "partNumber=2" in p)
    store.put("big", data)
    assert store.get("big") == data
    assert len(proxy.log.faults) == 2
    assert direct.list_multipart_uploads(Bucket=store.bucket).get("Uploads", []) == []


@pytest.mark.s3
def test_s3_multipart_past_retry_budget_aborts_upload(proxied: Any) -> None:
    store, proxy, direct = proxied
    data = os.urandom(11 * 1024 * 1024)
    proxy.fail_next(3, status=500, match=lambda m, p: _is_part(m, p) and "partNumber=2" in p)
    with pytest.raises(BlobError, match="'big'") as info:
        store.put("big", data)
    assert "multipart" in str(info.value)
    assert not _exists(direct, store.bucket, "p/big")
    assert direct.list_multipart_uploads(Bucket=store.bucket).get("Uploads", []) == []
    assert any(m == "DELETE" and "uploadId=" in p for m, p in proxy.log.requests), "no abort was sent"


@pytest.mark.s3
def test_s3_multipart_complete_failure_aborts_upload(proxied: Any) -> None:
    store, proxy, direct = proxied
    proxy.fail_next(3, status=503, match=lambda m, p: m == "POST" and "uploadId=" in p)
    with pytest.raises(BlobError, match="'big'"):
        store.put("big", os.urandom(7 * 1024 * 1024))
    assert not _exists(direct, store.bucket, "p/big")
    assert direct.list_multipart_uploads(Bucket=store.bucket).get("Uploads", []) == []


@pytest.mark.s3
def test_s3_stalled_responses_are_retried(proxied: Any) -> None:
    store, proxy, direct = proxied
    proxy.stall_next(2, match=lambda m, p: m == "PUT")
    store.put("slow", b"eventually")
    proxy.stall_next(1, match=lambda m, p: m == "GET")
    assert store.get("slow") == b"eventually"
    assert [kind for _, _, kind in proxy.log.faults] == ["stall"] * 3
    assert direct.get_object(Bucket=store.bucket, Key="p/slow")["Body"].read() == b"eventually"


@pytest.mark.s3
def test_s3_stall_past_retry_budget_fails_cleanly(proxied: Any) -> None:
    store, proxy, direct = proxied
    proxy.stall_next(3, match=lambda m, p: m == "PUT")
    with pytest.raises(BlobError, match="'stuck'") as info:
        store.put("stuck", b"v")
    assert "read timeout" in str(info.value)
    assert not _exists(direct, store.bucket, "p/stuck")


@pytest.mark.s3
def test_s3_truncated_body_is_retried(proxied: Any) -> None:
    store, proxy, _ = proxied
    data = os.urandom(100_000)
    store.put("t", data)
    proxy.truncate_body_next(2, match=lambda m, p: m == "GET")
    assert store.get("t") == data
    assert len(proxy.log.faults) == 2


@pytest.mark.s3
def test_s3_put_if_absent_whose_answer_was_lost_succeeds(proxied: Any) -> None:
    """The first attempt lands but its answer is lost; the retry's 412 must not be reported as a conflict."""
    store, proxy, _ = proxied
    proxy.drop_response_next(1, match=lambda m, p: m == "PUT")
    store.put_if_absent("once", b"mine")
    assert proxy.log.faults == [("PUT", f"/{store.bucket}/p/once", "drop")]
    assert store.get("once") == b"mine"
    proxy.drop_response_next(1, match=lambda m, p: m == "PUT")
    with pytest.raises(BlobAlreadyExists, match="'once'"):
        store.put_if_absent("once", b"someone else's")
    assert store.get("once") == b"mine"


@pytest.mark.s3
def test_s3_unreachable_endpoint_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = S3BlobStore(
        "bucket",
        endpoint_url=f"http://127.0.0.1:{port}",
        connect_timeout=0.2,
        read_timeout=0.2,
        max_attempts=2,
    )
    try:
        with pytest.raises(BlobError, match="'k'") as info:
            store.put("k", b"v")
        assert "could not be reached" in str(info.value) and str(port) in str(info.value)
    finally:
        store.close()


@pytest.mark.s3
def test_s3_missing_bucket_is_a_clear_error(moto_server: MotoServer) -> None:
    store = S3BlobStore("no-such-bucket-here", endpoint_url=moto_server.endpoint, max_attempts=2)
    try:
        with pytest.raises(BlobError, match="does not exist") as info:
            store.put("k", b"v")
        assert not isinstance(info.value, BlobNotFound)
        with pytest.raises(BlobError, match="NoSuchBucket"):
            store.list()
    finally:
        store.close()


@pytest.mark.s3
def test_s3_endpoint_from_environment(
    s3_bucket: tuple[str, str], monkeypatch: pytest.MonkeyPatch, moto_server: MotoServer
) -> None:
    endpoint, bucket = s3_bucket
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    store = S3BlobStore(bucket)
    try:
        assert store.endpoint_url == endpoint
        store.put("via/env", b"ok")
    finally:
        store.close()
    direct = moto_server.client()
    assert direct.get_object(Bucket=bucket, Key="via/env")["Body"].read() == b"ok"
    direct.close()


def test_s3_rejects_parts_below_minimum() -> None:
    with pytest.raises(ValueError, match="5 MiB"):
        S3BlobStore("bucket", part_size=1024 * 1024)


# --- open_blob_store ------------------------------------------------------------------------


def test_open_memory_uris() -> None:
    name = f"uri-{uuid.uuid4().hex}"
    a = open_blob_store(f"memory://{name}")
    a.put("k", b"v")
    assert open_blob_store(f"memory://{name}").get("k") == b"v"
    assert isinstance(open_blob_store("memory://"), MemoryBlobStore)
    assert open_blob_store("memory://").list() == []
    MemoryBlobStore.forget(name)


def test_open_file_uris(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    by_uri = open_blob_store(f"file://{tmp_path}/via-uri")
    by_uri.put("k", b"1")
    assert (tmp_path / "via-uri" / "k").read_bytes() == b"1"
    plain = open_blob_store(str(tmp_path / "plain"))
    assert isinstance(plain, FileBlobStore) and plain.root == tmp_path / "plain"
    monkeypatch.chdir(tmp_path)
    relative = open_blob_store("rel/dir")
    relative.put("k", b"2")
    assert (tmp_path / "rel" / "dir" / "k").read_bytes() == b"2"


@pytest.mark.s3
def test_open_s3_uri_with_options(s3_bucket: tuple[str, str], moto_server: MotoServer) -> None:
    endpoint, bucket = s3_bucket
    store = open_blob_store(
        f"s3://{bucket}/some/prefix/",
        s3_endpoint=endpoint,
        s3_region="eu-west-1",
        s3_read_timeout=3.0,
        s3_connect_timeout=1.0,
        s3_max_attempts=4,
        s3_multipart_threshold=None,
    )
    try:
        assert isinstance(store, S3BlobStore)
        assert (store.bucket, store.prefix, store.max_attempts) == (bucket, "some/prefix/", 4)
        store.put("obj", b"data")
        assert store.list() == ["obj"]
    finally:
        store.close()
    direct = moto_server.client()
    assert direct.get_object(Bucket=bucket, Key="some/prefix/obj")["Body"].read() == b"data"
    direct.close()


@pytest.mark.parametrize(
    ("uri", "options", "message"),
    [
        ("ftp://host/x", {}, "unknown blob store scheme 'ftp'"),
        ("", {}, "empty"),
        ("s3://", {}, "no bucket"),
        ("file://otherhost/x", {}, "file URIs are local"),
        ("memory://", {"s3_endpoint": "http://127.0.0.1:1"}, "apply only to s3://"),
        ("s3://b", {"s3_colour": "blue"}, "unknown blob store option"),
    ],
)
def test_open_rejects_bad_uris(uri: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        open_blob_store(uri, **options)


@pytest.mark.s3
def test_missing_s3_credentials_are_a_typed_error_and_not_retried(moto_server, monkeypatch, tmp_path):
    """No credentials at all: refused at once, typed, saying so (retrying cannot help)."""
    import time

    from sediment.blob.uri import open_blob_store
    from sediment.errors import BlobCredentialsError

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    store = open_blob_store("s3://no-creds-bucket/p", s3_endpoint=moto_server.endpoint)
    started = time.monotonic()
    with pytest.raises(BlobCredentialsError, match="not retried") as refused:
        store.put("k", b"x")
    assert "credentials" in str(refused.value) and "attempt" not in str(refused.value)
    assert time.monotonic() - started < 5


def test_local_capabilities_are_declared_and_the_counting_wrapper_keeps_exactly_them(tmp_path: Path) -> None:
    """A file store is a LocalBlobStore (read through its files, written by linking a spill
    file); memory and S3 stores are not; the engine's counting wrapper says the same as what
    it wraps and counts a read through the file as a get."""
    from sediment.blob.counting import counting
    from sediment.blob.protocol import LocalBlobStore
    from sediment.metrics import EngineMetrics

    assert isinstance(FileBlobStore(tmp_path / "f"), LocalBlobStore)
    assert not isinstance(MemoryBlobStore(), LocalBlobStore)
    assert not hasattr(S3BlobStore, "local_path")
    metrics = EngineMetrics()
    plain = counting(MemoryBlobStore(), metrics)
    assert isinstance(plain, BlobStore) and not isinstance(plain, LocalBlobStore)
    local = counting(FileBlobStore(tmp_path / "g"), metrics)
    assert isinstance(local, LocalBlobStore)
    spill = local.spill_path()
    with open(spill, "wb") as f:
        f.write(b"spilled")
    local.put_file("a/b", spill, if_absent=True)
    with open(local.local_path("a/b"), "rb") as f:
        assert f.read() == b"spilled"
    assert metrics.blob_requests.labels(op="get")._value.get() == 1
    assert metrics.blob_requests.labels(op="put_file")._value.get() == 1
    with pytest.raises(BlobNotFound):
        plain.get("missing")
