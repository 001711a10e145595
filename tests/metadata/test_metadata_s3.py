"""The S3 metadata store against what S3 really does, through the proxy that serializes
conditional writes per object and injects faults: racing writers, lost answers, 409s,
5xx past the retry budget, and garbage collection under a stalled writer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from support.faulty_proxy import FaultyProxy

from sediment.errors import InvalidMetadataRequest, MetadataConflict, MetadataError
from sediment.metadata import s3_format as fmt
from sediment.metadata.open_store import open_metadata_store
from sediment.metadata.protocol import Versioned
from sediment.metadata.s3 import S3MetadataStore

pytestmark = pytest.mark.s3


def _slot_put(key: str) -> Any:
    """Matches the conditional PUT of any slot of ``key`` (not its hint)."""
    return lambda m, p: m == "PUT" and f"/meta/{key}/" in p and not p.endswith("/hint") and "?" not in p


@pytest.fixture
def make(s3_bucket: tuple[str, str], serializing_proxy: FaultyProxy) -> Iterator[Any]:
    _, bucket = s3_bucket
    stores: list[S3MetadataStore] = []

    def build(**options: Any) -> S3MetadataStore:
        options = {"keep": 2, "read_timeout": 2.0, "max_attempts": 3, **options}
        store = S3MetadataStore(bucket, "meta", endpoint_url=serializing_proxy.endpoint, **options)
        stores.append(store)
        return store

    yield build
    for store in stores:
        store.close()


def _slots(direct: Any, bucket: str, key: str) -> dict[int, fmt.Slot]:
    out = {}
    for obj in direct.list_objects_v2(Bucket=bucket, Prefix=f"meta/{key}/").get("Contents", []):
        parsed = fmt.parse_name(obj["Key"][len("meta/"):])
        if parsed is not None and parsed[0] == key and parsed[1] is not None:
            body = direct.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
            out[parsed[1]] = fmt.decode_slot(body, obj["Key"])
    return out


def test_two_writers_racing_cas_exactly_one_wins_each_round(make: Any) -> None:
    a, b = make(), make()
    a.compare_and_set("epoch", b"0", None)
    for round_ in range(30):
        start = threading.Barrier(2)
        results: dict[str, Any] = {}

        def race(name: str, store: S3MetadataStore, version: int = round_, start: threading.Barrier = start,
                 results: dict[str, Any] = results) -> None:
            start.wait()
            try:
                results[name] = store.compare_and_set("epoch", name.encode(), version)
            except MetadataConflict as e:
                results[name] = e

        threads = [threading.Thread(target=race, args=(n, s)) for n, s in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [n for n, r in results.items() if r == round_ + 1]
        assert len(winners) == 1, f"round {round_}: {results}"
        assert a.get("epoch") == b.get("epoch") == Versioned(winners[0].encode(), round_ + 1)


def test_dropped_answer_after_landing_is_neither_lost_nor_doubled(make: Any, serializing_proxy: FaultyProxy,
                                                                  moto_server: Any, s3_bucket: Any) -> None:
    store = make()
    serializing_proxy.drop_response_next(1, match=_slot_put("k"))
    assert store.compare_and_set("k", b"first", None) == 0
    serializing_proxy.drop_response_next(1, match=_slot_put("k"))
    assert store.compare_and_set("k", b"second", 0) == 1
    assert [kind for _, _, kind in serializing_proxy.log.faults] == ["drop", "drop"]
    assert store.get("k") == Versioned(b"second", 1)
    slots = _slots(moto_server.client(), s3_bucket[1], "k")
    assert [(n, s.version, s.value) for n, s in sorted(slots.items())] == [(0, 0, b"first"), (1, 1, b"second")]
    with pytest.raises(MetadataConflict):
        store.compare_and_set("k", b"stale", 0)


def test_a_409_is_retried_with_backoff(make: Any, serializing_proxy: FaultyProxy) -> None:
    sleeps: list[float] = []
    store = make(sleep=sleeps.append)
    serializing_proxy.fail_next(2, status=409, code="ConditionalRequestConflict", match=_slot_put("k"))
    assert store.compare_and_set("k", b"v", None) == 0
    assert len(sleeps) == 2 and 0 < sleeps[0] < sleeps[1]
    assert store.get("k") == Versioned(b"v", 0)


def test_5xx_past_the_budget_is_resolved_by_reading(make: Any, serializing_proxy: FaultyProxy) -> None:
    store = make()
    serializing_proxy.fail_next(3, status=500, match=_slot_put("k"))
    assert store.compare_and_set("k", b"v", None) == 0
    assert store.get("k") == Versioned(b"v", 0)
    serializing_proxy.fail_next(6, status=503, match=_slot_put("k"))
    with pytest.raises(MetadataError, match="unknown outcome") as info:
        store.compare_and_set("k", b"w", 0)
    assert not isinstance(info.value, MetadataConflict)
    assert store.get("k") == Versioned(b"v", 0)


def test_gc_keeps_newest_slots_and_delete_is_a_tombstone(make: Any, moto_server: Any, s3_bucket: Any) -> None:
    store = make(keep=2)
    store.compare_and_set("k", b"v0", None)
    for v in range(5):
        store.compare_and_set("k", b"v%d" % (v + 1), v)
    direct = moto_server.client()
    assert sorted(_slots(direct, s3_bucket[1], "k")) == [3, 4, 5]  # collected at even slots: at most 2 * keep - 1
    store.delete("k", expected_version=5)
    slots = _slots(direct, s3_bucket[1], "k")
    assert sorted(slots) == [5, 6]
    assert slots[6].kind == fmt.TOMBSTONE and store.get("k") is None and store.list("") == []
    assert store.compare_and_set("k", b"again", None) == 0
    assert max(_slots(direct, s3_bucket[1], "k")) == 7


def test_stalled_writer_cannot_refill_a_collected_slot(make: Any, serializing_proxy: FaultyProxy,
                                                       moto_server: Any, s3_bucket: Any) -> None:
    """SlateDB issue 352: a writer reads slot 0, stalls; others write slots 1-2 and GC
    deletes slot 1; the stalled PUT then creates slot 1 again. It must not count."""
    stalled, other = make(keep=1, read_timeout=30.0), make(keep=1)
    stalled.compare_and_set("k", b"v0", None)
    hold = serializing_proxy.hold_next(1, match=_slot_put("k"))
    outcome: list[Any] = []
    writer = threading.Thread(target=lambda: _capture(outcome, stalled.compare_and_set, "k", b"stale", 0))
    writer.start()
    assert hold.reached.wait(10)
    assert other.compare_and_set("k", b"v1", 0) == 1
    assert other.compare_and_set("k", b"v2", 1) == 2
    assert sorted(_slots(moto_server.client(), s3_bucket[1], "k")) == [2]
    hold.release.set()
    writer.join()
    assert isinstance(outcome[0], MetadataConflict), outcome
    assert "garbage-collected" in str(outcome[0])
    for reader in (stalled, other, make()):
        assert reader.get("k") == Versioned(b"v2", 2)
    assert 1 not in _slots(moto_server.client(), s3_bucket[1], "k")
    assert other.compare_and_set("k", b"v3", 2) == 3


def _capture(out: list[Any], fn: Any, *args: Any) -> None:
    try:
        out.append(fn(*args))
    except Exception as e:  # noqa: BLE001 - the test inspects it
        out.append(e)


def test_open_metadata_store_s3_spec(s3_bucket: tuple[str, str]) -> None:
    endpoint, bucket = s3_bucket
    store = open_metadata_store(f"s3://{bucket}/deploy/meta?endpoint={endpoint}", keep=3)
    try:
        assert isinstance(store, S3MetadataStore) and store.keep == 3 and store.root == "deploy/meta/"
        store.compare_and_set("a", b"x", None)
        assert store.list("") == ["a"]
    finally:
        store.close()
    for bad in ("s3://", f"s3://{bucket}/p?endpoint=a&endpoint=b", f"s3://{bucket}/p?region=x"):
        with pytest.raises(InvalidMetadataRequest):
            open_metadata_store(bad)


def test_requests_per_compare_and_set(make: Any, serializing_proxy: FaultyProxy) -> None:
    """docs/formats.md: four requests per compare-and-set, the hint every 8th slot, one batch
    delete every keep-th: 4.4 on average with keep=4."""
    store = make(keep=4)
    store.compare_and_set("k", b"v", None)
    before = len(serializing_proxy.log.requests)
    for v in range(64):
        store.compare_and_set("k", b"v", v)
    sent = serializing_proxy.log.requests[before:]
    assert len(sent) == 64 * 4 + 64 // 8 + 64 // 4
    assert sum(1 for m, p in sent if m == "POST" and p.endswith("?delete")) == 16
    assert round(len(sent) / 64, 1) == 4.4


def test_stalled_answers_past_the_budget_are_resolved_by_reading(make: Any, serializing_proxy: FaultyProxy) -> None:
    """Every attempt of the PUT times out unanswered (never forwarded): the store reads the
    slot, finds it absent, resends the same bytes once, and that lands."""
    store = make(read_timeout=0.5, max_attempts=2)
    serializing_proxy.stall_next(2, seconds=5.0, match=_slot_put("k"))
    assert store.compare_and_set("k", b"v", None) == 0
    assert [kind for _, _, kind in serializing_proxy.log.faults] == ["stall", "stall"]
    assert store.get("k") == Versioned(b"v", 0)


WRITER = """
import sys
from sediment.metadata.s3 import S3MetadataStore
store = S3MetadataStore(sys.argv[1], "meta", endpoint_url=sys.argv[2], keep=2)
store.compare_and_set("counter", b"0", None)
version = 0
while True:
    version = store.compare_and_set("counter", str(version + 1).encode(), version)
    print(version, flush=True)
"""


def test_sigkilled_writer_loses_no_acknowledged_write(s3_bucket: tuple[str, str], make: Any) -> None:
    endpoint, bucket = s3_bucket
    proc = subprocess.Popen([sys.executable, "-c", WRITER, bucket, endpoint], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    acked = 0
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            acked = int(line)
            if acked >= 25:
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        rest, err = proc.stdout.read(), proc.stderr.read()
    acked = max([acked, *(int(x) for x in rest.split())])
    assert acked >= 25, err
    store = make(keep=2)
    counter = store.get("counter")
    assert counter is not None and counter.version >= acked
    assert counter.value == str(counter.version).encode(), "value and version move together"
    assert store.compare_and_set("counter", b"next", counter.version) == counter.version + 1


def test_keys_named_like_slots_or_hints_do_not_clash(make: Any) -> None:
    store = make()
    keys = ["a", "a/hint", "a/00000000000000000007", "a/00000000000000000007/hint"]
    for i, key in enumerate(keys):
        store.compare_and_set(key, key.encode(), None)
        store.compare_and_set(key, key.encode() + b"!", 0)
        assert i == len(store.list("a")) - 1
    assert store.list("a") == sorted(keys)
    for key in keys:
        assert store.get(key) == Versioned(key.encode() + b"!", 1)
    store.delete("a")
    assert store.list("") == sorted(keys[1:]) and store.get("a/hint") == Versioned(b"a/hint!", 1)
