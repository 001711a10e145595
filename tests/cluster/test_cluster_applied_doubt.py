"""A keyed append whose outcome is unknown at its owner (two of three storage nodes gone:
QuorumLost, with the records on the third, which the next recovery keeps) is not applied a
second time by a retry with the same key at the same owner: the owner opens the partition
again, and the table it rebuilds from the recovered log knows the key (cluster/applied.py)."""

from __future__ import annotations

import pytest
from support.cluster_procs import TOKEN
from support.waiting import poll_until
from test_cluster import SCHEMA, keys_of, rows

import sediment
from sediment.client import Client
from sediment.errors import EngineFailed, MembershipLost, NotPartitionOwner, OutcomeUnknown, QuorumUnavailable

pytestmark = [pytest.mark.slow, pytest.mark.zookeeper, pytest.mark.s3, pytest.mark.timeout(240)]


def test_a_retry_of_an_append_of_unknown_outcome_at_the_same_owner_is_applied_once(cluster):
    owner = cluster.start_member()
    cluster.wait_assigned([owner])
    with sediment.connect(cluster.uri, token=TOKEN) as db:
        db.add_relation("r", SCHEMA, partition=0)
    with Client(owner.uri, TOKEN) as c:
        c.append_once("r", rows([1]), "writer", 1)
        cluster.nodes[1].kill()
        cluster.nodes[2].kill()
        with pytest.raises(OutcomeUnknown):  # on node 0 only: the recovery keeps it
            c.append_once("r", rows([2]), "writer", 2)
        cluster.nodes[1].start()
        cluster.nodes[2].start()

        def retried() -> bool:
            try:
                c.append_once("r", rows([2]), "writer", 2)
            except (NotPartitionOwner, QuorumUnavailable):  # being opened again; its log recovering
                return False
            return True

        poll_until(retried, 60, "the retry to be answered")
    owner.signal(9)  # a new owner reads the log as it is
    owner.wait()
    successor = cluster.start_member()
    cluster.wait_assigned([successor])
    with sediment.connect(cluster.uri, token=TOKEN) as db:
        assert keys_of(db, "r", 1) == [1, 2]  # [1, 2, 2] before: the retry wrote it again


def test_an_unkeyed_write_of_unknown_outcome_has_the_owner_open_the_partition_again(cluster):
    """Without a key nothing tells the owner to doubt its engine but the engine itself, which
    fails after the QuorumLost (EngineFailed, engine/view.py): the owner opens the partition
    again, and reads then show the record the recovery kept, instead of the stale engine
    answering without it (before) or refusing for good."""
    owner = cluster.start_member()
    cluster.wait_assigned([owner])
    with sediment.connect(cluster.uri, token=TOKEN) as db:
        db.add_relation("r", SCHEMA, partition=0)
    with Client(owner.uri, TOKEN) as c:
        c.append("r", rows([1]))
        cluster.nodes[1].kill()
        cluster.nodes[2].kill()
        with pytest.raises(OutcomeUnknown):  # sent to node 0 only, durable there or not
            c.append("r", rows([2]))
        # no quorum can open the partition again yet: the failed engine refuses, where before it answered [1]
        with pytest.raises((NotPartitionOwner, QuorumUnavailable, EngineFailed, MembershipLost)):
            keys_of(c, "r", 1)
        cluster.nodes[1].start()  # node 2 stays away: the recovery's quorum is node 0 and node 1
        seen: list[list[int]] = []

        def answers() -> bool:
            try:
                seen.append(keys_of(c, "r", 1))
            except (NotPartitionOwner, QuorumUnavailable, EngineFailed, MembershipLost):  # being opened again
                return False
            return True

        poll_until(answers, 60, "the owner to open the partition again")
        assert seen[-1] in ([1], [1, 2])  # what the recovery kept of the write in doubt, once
