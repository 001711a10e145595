"""A member handing its partition over (SIGTERM) takes appends until the next owner fences
it, but a read that fails there meanwhile answers MembershipLost, which the client retries
at the next owner: not the engine's error.

The window is held open by the S3 proxy: the next owner's open waits at its first S3 request
(the blob prefix's owner marker), before it claims the log, so the leaving member has seen
the new assignment and is not fenced; reads begun before the SIGTERM wait at their batch's
GET, which is then answered 404, as when the next owner's compaction deleted the batch
before the leaving member noticed the fence (docs/reliability.md, session 31)."""

from __future__ import annotations

import signal
import threading

import pyarrow as pa
import pytest
from support.cluster_procs import TOKEN, running_cluster
from support.faulty_proxy import FaultyProxy
from support.waiting import poll_until

import sediment
from sediment.client import Client
from sediment.errors import EngineFailed, MembershipLost, NotPartitionOwner, OutcomeUnknown, QuorumUnavailable

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


def batch_get(method: str, path: str) -> bool:
    return method == "GET" and "/p0/trace/" in path and "?" not in path


def owner_marker_get(method: str, path: str) -> bool:
    return method == "GET" and path.split("?", 1)[0].endswith("/p0/sediment-owner")


def test_a_read_failing_at_a_member_handing_its_partition_over_is_retried_at_the_next_owner(
        tmp_path, zookeeper, zk_root, moto_server, s3_bucket):
    with FaultyProxy(moto_server.endpoint) as proxy, running_cluster(
            tmp_path, zookeeper, zk_root, ProxiedMoto(moto_server, proxy), s3_bucket, partitions=1,
            session_timeout=SESSION) as cluster:
        first = cluster.start_member()
        cluster.wait_assigned([first])
        second = cluster.start_member()
        with sediment.connect(cluster.uri, token=TOKEN) as db:
            db.add_relation("r", SCHEMA, partition=0)
            for t in (1, 2):
                db.append("r", rows([10 * t, 10 * t + 1], t))
                db.seal("r", t)
                db.compact("r")
            expected = db.snapshot("r", 2)
        assert cluster.owner_of(0) is first
        batches = proxy.hold_next(2, match=batch_get)
        raw = Client(first.uri, TOKEN, timeout=60)  # the leaving member's own answer, not retried
        follower = sediment.connect(cluster.uri, token=TOKEN, timeout=60)  # follows the owner
        got: dict[str, object] = {}
        reads = {"raw snapshot": lambda: raw.snapshot("r", 2),
                 "replay": lambda: pa.Table.from_batches(follower.replay("r")).sort_by("k")}

        def read(kind: str) -> None:
            try:
                got[kind] = reads[kind]()
            except Exception as exc:  # noqa: BLE001 - the test's verdict
                got[kind] = exc

        threads = {kind: threading.Thread(target=read, args=(kind,), daemon=True) for kind in reads}
        for t in threads.values():
            t.start()
        opening = None
        try:
            poll_until(lambda: len(batches_held(proxy)) == 2, 30, "both reads to fetch a batch at the owner")
            opening = proxy.hold_next(1, match=owner_marker_get)
            first.signal(signal.SIGTERM)
            assert opening.reached.wait(30), "the next owner never began to open the partition"
            # the leaving member saw the new assignment: the partition is handed over, not fenced
            poll_until(lambda: first.metric("sediment_cluster_partitions_owned") == 0, 30, "the hand-over")
            # a keyed append there is still taken, and must be in what the next owner recovers
            raw.append_once("r", rows([30], 3), "handover-test", 1)
            batches.fail(404, "NoSuchKey")
            threads["raw snapshot"].join(30)
            assert not threads["raw snapshot"].is_alive()
            poll_until(lambda: not threads["replay"].is_alive()
                       or second.metric("sediment_cluster_redirects_served_total") > 0, 30,
                       "the replay to fail, or to be retried at the next owner")
        finally:
            if opening is not None:
                opening.release.set()
            batches.release.set()
        threads["replay"].join(90)
        assert not threads["replay"].is_alive()
        raw.close()
        follower.close()
        # before the fix: BatchCorruption ("batch ... is missing from the blob store; the trace
        # state references it") from the leaving member, for both reads
        assert isinstance(got["raw snapshot"], MembershipLost), got["raw snapshot"]
        assert isinstance(got["replay"], pa.Table), got["replay"]
        assert got["replay"].column("k").to_pylist() == [10, 11, 20, 21, 30]  # the append the leaving member took
        assert first.wait() == 0
        assert cluster.owner_of(0) is second
        with sediment.connect(cluster.uri, token=TOKEN) as db:
            assert db.snapshot("r", 2).equals(expected)
            db.seal("r", 3)
            assert db.snapshot("r", 3).column("k").to_pylist() == [10, 11, 20, 21, 30]


def test_a_read_failing_on_the_engine_before_a_reopen_in_the_same_generation_answers_membership_lost(
        tmp_path, zookeeper, zk_root, moto_server, s3_bucket):
    """A write of unknown outcome (two of three storage nodes gone: QuorumLost) fails the
    engine, and its member opens the partition again under the same generation
    (cluster/member.py ``reopen``). A read begun on the engine before, failing once the new
    engine serves, answered the old engine's error: the check looked at the partition and
    the generation, which the new engine has too, not at the engine the call ran on."""
    with FaultyProxy(moto_server.endpoint) as proxy, running_cluster(
            tmp_path, zookeeper, zk_root, ProxiedMoto(moto_server, proxy), s3_bucket, partitions=1,
            session_timeout=SESSION) as cluster:
        owner = cluster.start_member()
        generation = cluster.wait_assigned([owner])["assignment"][0][1]
        with sediment.connect(cluster.uri, token=TOKEN) as db:
            db.add_relation("r", SCHEMA, partition=0)
            db.append("r", rows([1, 2], 1))
            db.seal("r", 1)
            db.compact("r")
        batches = proxy.hold_next(1, match=batch_get)
        reader = Client(owner.uri, TOKEN, timeout=60)
        got: list[object] = []

        def read() -> None:
            try:
                got.append(reader.snapshot("r", 1))
            except Exception as exc:  # noqa: BLE001 - the test's verdict
                got.append(exc)

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        try:
            assert batches.reached.wait(30), "the read never fetched its batch"
            with Client(owner.uri, TOKEN) as c:
                cluster.nodes[1].kill()
                cluster.nodes[2].kill()
                with pytest.raises(OutcomeUnknown):  # the engine fails; the member opens the partition again
                    c.append("r", rows([3], 2))
                cluster.nodes[1].start()

                def serves() -> bool:
                    try:
                        c.sealed("r")
                    except (NotPartitionOwner, QuorumUnavailable, EngineFailed, MembershipLost):
                        return False
                    return True

                poll_until(serves, 60, "the member to open the partition again")
            assert cluster.view()["assignment"][0][1] == generation  # the same generation, another engine
            batches.fail(404, "NoSuchKey")
            thread.join(30)
            assert not thread.is_alive()
        finally:
            batches.release.set()
            reader.close()
        # before the fix: BatchCorruption from the engine the member had closed
        assert len(got) == 1 and isinstance(got[0], MembershipLost), got
        with sediment.connect(cluster.uri, token=TOKEN) as db:
            assert sorted(db.snapshot("r", 1).column("k").to_pylist()) == [1, 2]


def batches_held(proxy: FaultyProxy) -> list[str]:
    return [path for method, path, kind in proxy.log.faults if kind == "hold" and batch_get(method, path)]
