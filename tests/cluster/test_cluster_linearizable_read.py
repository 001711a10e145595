"""A member deposed by a move while live and in touch does not answer a read from the state
it had: once the new owner acknowledged a write, a read sent to the old member answers
MembershipLost (the client retries at the owner and sees the write), not the state without
it (docs/reliability.md, session 32).

The old member is made to lag deterministically: its control pass's read of the assignment
is held in the process (tests/support/member_hold_at.py), so it keeps its view and counts
itself in touch (ZooKeeper: within half the session timeout of its last pass; S3: its lease
renewed), and its log's look for a newer owner is held too (the replicated log's check of the
partition metadata, which a watch starts; the S3 log's look every 2 s), which would fence it
soon after the new owner's recovery: a look that is late, as the pass is. A proxy cannot hold the pass's read alone: the
confirmation reads the same key. With four partitions, members m (oldest) and x hold two
each (x: 2 and 3); a third member y takes partition 3 from x (the plan keeps the most
loaded, lower id first)."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from support.cluster_procs import TOKEN, S3Cluster, running_cluster
from support.member_hold_at import hold_file, reached_file
from support.waiting import poll_until

import sediment
from sediment.client import Client
from sediment.errors import MembershipLost, NotPartitionOwner

pytestmark = [pytest.mark.s3, pytest.mark.timeout(240)]
SCHEMA = pa.schema([("k", pa.int64())])
SESSION = 30.0  # ZooKeeper: the old member counts itself in touch for half of it without a pass
PASS = {"zk": "sediment.cluster.zk_membership:ZooKeeperMembership.read_assignment",
        "s3": "sediment.cluster.s3_membership:S3Membership.read_assignment"}
LOOK = {"zk": "sediment.wal.replication.store_session:Coordinator.check_owner",
        "s3": "sediment.wal.s3_log:S3Log.look_for_takeover"}


def rows(keys: list[int], t: int) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.int64()), "time": pa.array([t] * len(keys), pa.int64()),
                     "diff": pa.array([1] * len(keys), pa.int64())})


@pytest.fixture(params=[pytest.param("zk", marks=pytest.mark.zookeeper), "s3"])
def cluster(request, tmp_path, moto_server, s3_bucket):
    if request.param == "zk":
        zookeeper, zk_root = request.getfixturevalue("zookeeper"), request.getfixturevalue("zk_root")
        with running_cluster(tmp_path, zookeeper, zk_root, moto_server, s3_bucket, partitions=4,
                             session_timeout=SESSION) as c:
            c.kind = "zk"
            yield c
        return
    c = S3Cluster(tmp_path, moto_server.endpoint, s3_bucket[1], partitions=4, lease_time=15.0)
    c.kind = "s3"
    try:
        yield c
    finally:
        c.close()


def test_a_member_that_has_not_seen_a_move_answers_no_read_behind_the_new_owner(cluster):
    held_steps = (PASS[cluster.kind], LOOK[cluster.kind])
    m = cluster.start_member()
    cluster.wait_assigned([m])
    x = cluster.start_member(hold_at=held_steps)
    cluster.wait_assigned([m, x])
    assert cluster.owner_of(3) is x
    raw = Client(x.uri, TOKEN, timeout=60)  # x's own answers, not retried
    follower = sediment.connect(cluster.uri, token=TOKEN, timeout=60)  # remembers x as the owner
    try:
        with sediment.connect(cluster.uri, token=TOKEN) as db:
            db.add_relation("r", SCHEMA, partition=3)
            db.append("r", rows([1], 1))
            db.seal("r", 1)
            db.compact("r")  # x's compaction writes nothing more to the log (a write would fence it)
        assert follower.sealed("r") == 1 and raw.sealed("r") == 1
        for spec in held_steps:
            hold_file(x.holds, spec).touch()
        try:
            poll_until(lambda: reached_file(x.holds, PASS[cluster.kind]).exists(), 30, "x's pass to be held")
            held_at = time.monotonic()
            y = cluster.start_member()
            poll_until(lambda: y.metric("sediment_cluster_partitions_owned") == 1, 60, "y to serve partition 3")
            assert cluster.owner_of(3) is y
            with sediment.connect(cluster.uri, token=TOKEN) as db:  # reads the assignment: goes to y
                db.append("r", rows([2], 2))
                db.seal("r", 2)  # acknowledged by y
            with pytest.raises(MembershipLost):  # before the fix: 1
                raw.sealed("r")
            with pytest.raises(MembershipLost):  # before the fix: the rows without k=2
                pa.Table.from_batches(raw.replay("r"))
            assert follower.sealed("r") == 2  # refused at x, retried at y; before the fix: 1 from x
            assert sorted(pa.Table.from_batches(follower.replay("r")).column("k").to_pylist()) == [1, 2]
            # x never saw the move: still in touch, still holding partition 3 in its view
            assert x.metric("sediment_cluster_partitions_owned") == 2
            if cluster.kind == "zk":
                assert time.monotonic() - held_at < SESSION / 2, "x counted itself out of touch: no proof"
        finally:
            for spec in held_steps:
                hold_file(x.holds, spec).unlink(missing_ok=True)
        poll_until(lambda: x.metric("sediment_cluster_partitions_owned") == 1, 30, "x to see the move")
        with pytest.raises(NotPartitionOwner):
            raw.sealed("r")
    finally:
        raw.close()
        follower.close()
