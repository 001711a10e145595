"""A relation's add and drop write twice, the cluster's record of it in ZooKeeper and the
owning partition's catalog: a member SIGKILLed between the two (it kills itself at that
step, tests/support/member_kill_at.py) leaves one written. The next add or drop of the name
completes (or undoes) it, so the name is neither stuck nor held by two partitions."""

from __future__ import annotations

import pyarrow as pa
import pytest
from support.cluster_procs import TOKEN
from test_cluster import SCHEMA, keys_of, rows

import sediment
from sediment.errors import (
    CoordinatorUnavailable,
    OutcomeUnknown,
    RelationExists,
    SchemaMismatch,
    UnknownRelation,
)

pytestmark = [pytest.mark.slow, pytest.mark.zookeeper, pytest.mark.s3, pytest.mark.timeout(240)]
ENGINE = "sediment.engine.engine:Engine"
# the member dies once the catalog dropped "dropped", and before the catalog adds "added"
KILLS = (f"{ENGINE}.drop_relation|after|dropped", f"{ENGINE}.add_relation|before|added")
DIED = (OutcomeUnknown, CoordinatorUnavailable)  # what the client sees of an owner dying in the call


def test_a_drop_or_add_cut_between_its_two_writes_is_completed_by_the_next(cluster):
    doomed = cluster.start_member(kill_at=KILLS)
    cluster.wait_assigned([doomed])
    with sediment.connect(cluster.uri, token=TOKEN) as db:
        with pytest.raises(SchemaMismatch):  # refused by the catalog: its record in ZooKeeper goes too
            db.add_relation("bad", pa.schema([("time", pa.int64())]), partition=2)
        assert db.relations() == []
        db.add_relation("bad", SCHEMA, partition=3)
        db.add_relation("dropped", SCHEMA, partition=0)
        db.append("dropped", rows([1]))
        with pytest.raises(DIED):  # the owner died: the drop is in its catalog, not in ZooKeeper
            db.drop_relation("dropped")
        doomed.wait()
        doomed = cluster.start_member(kill_at=KILLS)
        survivor = cluster.start_member()
        view = cluster.wait_assigned([doomed, survivor])
        assert "dropped" in db.relations()  # the half-done drop: listed, though no catalog holds it
        db.drop_relation("dropped")  # the retry removes the record (it failed UnknownRelation)
        assert "dropped" not in db.relations()
        db.add_relation("dropped", SCHEMA, partition=1)  # the name is free again
        db.append("dropped", rows([2]))
        assert keys_of(db, "dropped", 1) == [2]

        p = next(p for p, (m, _g) in view["assignment"].items() if m == doomed.member_id)
        elsewhere = next(q for q in range(4) if q != p)
        with pytest.raises(DIED):  # the owner died: "added" is recorded in ZooKeeper only
            db.add_relation("added", SCHEMA, partition=p)
        doomed.wait()
        cluster.wait_assigned([survivor])
        assert "added" in db.relations()
        with pytest.raises(UnknownRelation):
            db.schema("added")
        with pytest.raises(RelationExists):  # recorded in partition p: no second partition takes it
            db.add_relation("added", SCHEMA, partition=elsewhere)
        db.add_relation("added", SCHEMA, partition=p)  # the same add again completes it
        db.append("added", rows([3]))
        assert keys_of(db, "added", 1) == [3] and db.describe("added")["partition"] == p
        db.drop_relation("added")
        assert "added" not in db.relations()
        db.add_relation("added", pa.schema([("k", pa.int64())]), partition=elsewhere)
        assert db.describe("added")["partition"] == elsewhere
