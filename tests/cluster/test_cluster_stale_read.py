"""A read that an owner began before it was paused past its session, and that fails when it
wakes (the new owner compacted and deleted the batch it was reading), is answered as a lost
partition, which the client retries at the new owner: not with the stale engine's error.

Found by the nemesis campaign (bench/nemesis.py, docs/reliability.md "Session 30"): with
owners paused mid-read, a snapshot failed with ``BlobError`` (a batch "missing") at the
client, which does not retry it, while the data was whole at the new owner."""

from __future__ import annotations

import signal
import threading

import boto3
import pyarrow as pa
import pytest
from support.cluster_procs import TOKEN, running_cluster
from support.faulty_proxy import FaultyProxy
from support.waiting import poll_until

import sediment

pytestmark = [pytest.mark.zookeeper, pytest.mark.s3, pytest.mark.timeout(180)]
SCHEMA = pa.schema([("k", pa.int64())])
SESSION = 3.0


def rows(keys: list[int], t: int) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.int64()), "time": pa.array([t] * len(keys), pa.int64()),
                     "diff": pa.array([1] * len(keys), pa.int64())})


class ProxiedMoto:
    """The test's moto behind a FaultyProxy: what the cluster is told its S3 endpoint is."""

    def __init__(self, moto_server, proxy: FaultyProxy) -> None:
        self.endpoint, self.server = proxy.endpoint, moto_server


def test_a_read_failing_at_an_owner_that_lost_its_partition_meanwhile_is_retried_at_the_new_owner(
        tmp_path, zookeeper, zk_root, moto_server, s3_bucket):
    with FaultyProxy(moto_server.endpoint) as proxy, running_cluster(
            tmp_path, zookeeper, zk_root, ProxiedMoto(moto_server, proxy), s3_bucket, partitions=1,
            session_timeout=SESSION) as cluster:
        first = cluster.start_member()
        cluster.wait_assigned([first])
        second = cluster.start_member()
        with sediment.connect(cluster.uri, token=TOKEN) as db:
            db.add_relation("r", SCHEMA, partition=0)
            for t in (1, 2):  # compacted (and merged) into batches the next owner's compaction replaces
                db.append("r", rows([10 * t, 10 * t + 1], t))
                db.seal("r", t)
                db.compact("r")
            expected = db.snapshot("r", 2)
        assert cluster.owner_of(0) is first
        held = proxy.hold_next(2, match=lambda method, path: method == "GET" and "/p0/trace/" in path and "?" not in path)
        got: dict[str, object] = {}
        # through the owner about to be paused, with a per-call timeout longer than the pause
        reader = sediment.connect(first.uri, token=TOKEN, timeout=60)
        reads = {"snapshot": lambda: reader.snapshot("r", 2),
                 "replay": lambda: pa.Table.from_batches(reader.replay("r")).sort_by("k")}

        def read(kind: str) -> None:
            try:
                got[kind] = reads[kind]()
            except Exception as exc:  # noqa: BLE001 - the test's verdict
                got[kind] = exc

        threads = [threading.Thread(target=read, args=(kind,), daemon=True) for kind in reads]
        for t in threads:
            t.start()
        try:
            poll_until(lambda: len(holds(proxy)) == 2, 30, "both reads to fetch a batch at the owner")
            first.signal(signal.SIGSTOP)
            try:
                cluster.wait_assigned([second])
                with sediment.connect(cluster.uri, token=TOKEN) as db:
                    db.append("r", rows([30], 3))
                    db.seal("r", 3)
                    db.compact("r")  # merged with the batch being read, which is deleted
                s3 = boto3.client("s3", endpoint_url=moto_server.endpoint)
                for path in set(holds(proxy)):
                    bucket, _, name = path.lstrip("/").partition("/")
                    poll_until(lambda bucket=bucket, name=name: s3.list_objects_v2(
                        Bucket=bucket, Prefix=name).get("KeyCount", 0) == 0, 30, f"the new owner to delete {name}")
                held.release.set()
            finally:
                first.signal(signal.SIGCONT)
            for t in threads:
                t.join(90)
                assert not t.is_alive()
        finally:
            held.release.set()
            reader.close()
        # before the fix: BatchCorruption ("batch ... is missing from the blob store; the trace
        # state references it") from the paused owner, for both reads
        assert isinstance(got["snapshot"], pa.Table) and got["snapshot"].equals(expected), got
        assert isinstance(got["replay"], pa.Table), got
        assert got["replay"].column("k").to_pylist() == [10, 11, 20, 21, 30]


def holds(proxy: FaultyProxy) -> list[str]:
    return [path for _method, path, kind in proxy.log.faults if kind == "hold"]


def test_a_keyed_append_failing_at_a_member_that_lost_the_partition_meanwhile_is_retried(
        tmp_path, zookeeper, zk_root, moto_server, s3_bucket):
    """The first keyed append after a partition opens reads the applied keys back from the
    partition's batches (``_cluster.applied``, cluster/applied.py). A member that lost its
    session during that read closed the engine, the read's next batch failed with BlobError
    ("the store is closed"), and the append answered that, which the client does not retry
    (found by bench/nemesis.py, seed 3004)."""
    with FaultyProxy(moto_server.endpoint) as proxy, running_cluster(
            tmp_path, zookeeper, zk_root, ProxiedMoto(moto_server, proxy), s3_bucket, partitions=1,
            session_timeout=SESSION) as cluster:
        first = cluster.start_member()
        cluster.wait_assigned([first])
        with sediment.connect(cluster.uri, token=TOKEN) as db:
            db.add_relation("r", SCHEMA, partition=0)
        for k in (1, 2):  # two clients' keys, each compacted into a batch of the applied keys
            with sediment.connect(cluster.uri, token=TOKEN) as db:
                db.append("r", rows([k], k))
                db.compact()
        owner = cluster.start_member()
        first.signal(signal.SIGKILL)
        first.wait()
        generation = cluster.wait_assigned([owner])["assignment"][0][1]
        poll_until(lambda: owner.metric("sediment_cluster_partitions_owned") == 1, 30, "the partition to open")
        held = proxy.hold_next(1, match=lambda method, path: method == "GET" and "/p0/trace/" in path and "?" not in path)
        got: list = []
        writer = sediment.connect(owner.uri, token=TOKEN, timeout=60)

        def append() -> None:
            try:
                writer.append("r", rows([3], 3))
                got.append("ok")
            except Exception as exc:  # noqa: BLE001 - the test's verdict
                got.append(exc)

        thread = threading.Thread(target=append, daemon=True)
        thread.start()
        try:
            assert held.reached.wait(30), "the first keyed append never read the applied keys"
            owner.signal(signal.SIGSTOP)
            try:
                poll_until(lambda: not cluster.view()["members"], 30, "the paused member's session to end")
            finally:
                owner.signal(signal.SIGCONT)

            def reopened() -> bool:  # in the same directory: the engine before (and its store) is closed
                _member, now = cluster.view()["assignment"].get(0, (None, -1))
                return now > generation and owner.metric("sediment_cluster_partitions_owned") == 1

            poll_until(reopened, 60, "the member to rejoin and open the partition again")
            held.release.set()
            thread.join(90)
            assert not thread.is_alive()
        finally:
            held.release.set()
            writer.close()
        assert got == ["ok"], got  # before the fix: BlobError ("... the store is closed; open a new one")
        with sediment.connect(cluster.uri, token=TOKEN) as db:
            db.seal("r", 3)
            assert db.snapshot("r", 3).column("k").to_pylist() == [1, 2, 3]  # the resent append, once
