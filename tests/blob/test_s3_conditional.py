"""S3 conditional writes through the fault-injecting proxy: a 409 ConditionalRequestConflict
is retried (it is no proof the object exists), a 412 after a landed retry is our success,
and the serializing proxy really lets only one of two racing creators win."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from support.faulty_proxy import FaultyProxy

from sediment.blob import S3BlobStore
from sediment.blob.owner import OWNER_KEY, claim, read_owner
from sediment.errors import BlobAlreadyExists, BlobError

pytestmark = pytest.mark.s3


def _is_conditional_put(method: str, path: str) -> bool:
    return method == "PUT" and "?" not in path


@pytest.fixture
def via_proxy(s3_bucket: tuple[str, str], serializing_proxy: FaultyProxy) -> Iterator[tuple[S3BlobStore, list[float]]]:
    _, bucket = s3_bucket
    sleeps: list[float] = []
    store = S3BlobStore(bucket, prefix="p", endpoint_url=serializing_proxy.endpoint, connect_timeout=1.0,
                        read_timeout=2.0, max_attempts=3, conflict_attempts=4, sleep=sleeps.append)
    try:
        yield store, sleeps
    finally:
        store.close()


def test_one_409_is_retried_not_taken_for_existence(via_proxy: Any, serializing_proxy: FaultyProxy) -> None:
    store, sleeps = via_proxy
    serializing_proxy.fail_next(1, status=409, code="ConditionalRequestConflict", match=_is_conditional_put)
    store.put_if_absent("once", b"mine")
    assert [kind for _, _, kind in serializing_proxy.log.faults] == ["fail"]
    assert store.get("once") == b"mine"
    assert len(sleeps) == 1 and sleeps[0] > 0
    with pytest.raises(BlobAlreadyExists):
        store.put_if_absent("once", b"other")


def test_409_on_every_attempt_is_an_error_not_existence(via_proxy: Any, serializing_proxy: FaultyProxy) -> None:
    store, sleeps = via_proxy
    serializing_proxy.fail_next(4, status=409, code="ConditionalRequestConflict", match=_is_conditional_put)
    with pytest.raises(BlobError) as info:
        store.put_if_absent("busy", b"mine")
    assert not isinstance(info.value, BlobAlreadyExists)
    assert "ConditionalRequestConflict" in str(info.value) and "'busy'" in str(info.value)
    assert sleeps == sorted(sleeps) and len(sleeps) == 3
    assert store.list() == []


def test_409_then_landed_retry_with_lost_answer_is_success(via_proxy: Any, serializing_proxy: FaultyProxy) -> None:
    store, _ = via_proxy
    serializing_proxy.fail_next(1, status=409, code="ConditionalRequestConflict", match=_is_conditional_put)
    serializing_proxy.drop_response_next(1, match=_is_conditional_put)
    store.put_if_absent("k", b"mine")
    assert [kind for _, _, kind in serializing_proxy.log.faults] == ["fail", "drop"]
    assert store.get("k") == b"mine"


def test_owner_claim_survives_a_409(via_proxy: Any, serializing_proxy: FaultyProxy) -> None:
    """The engine's owner marker: one 409 used to make an engine refuse its own prefix."""
    store, _ = via_proxy
    serializing_proxy.fail_next(1, status=409, code="ConditionalRequestConflict",
                                match=lambda m, p: _is_conditional_put(m, p) and p.endswith(OWNER_KEY))
    mine = claim(store, "e" * 32, "s3://test")
    assert mine.engine_id == "e" * 32
    owner = read_owner(store, "s3://test")
    assert owner is not None and owner.engine_id == "e" * 32
    assert serializing_proxy.pending() == 0


def test_serialized_racing_creators_have_one_winner(s3_bucket: tuple[str, str],
                                                    serializing_proxy: FaultyProxy) -> None:
    _, bucket = s3_bucket
    stores = [S3BlobStore(bucket, prefix="race", endpoint_url=serializing_proxy.endpoint, max_attempts=2)
              for _ in range(8)]
    try:
        for round_ in range(20):
            start = threading.Barrier(len(stores))
            won: list[int] = []

            def create(i: int, key: str = f"lock-{round_}", start: threading.Barrier = start,
                       won: list[int] = won) -> None:
                start.wait()
                try:
                    stores[i].put_if_absent(key, b"w%d" % i + b"-" * 65_536)
                    won.append(i)
                except BlobAlreadyExists:
                    pass

            threads = [threading.Thread(target=create, args=(i,)) for i in range(len(stores))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(won) == 1, f"round {round_}: winners {won}"
            assert stores[0].get(f"lock-{round_}").startswith(b"w%d-" % won[0])
    finally:
        for s in stores:
            s.close()
