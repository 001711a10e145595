"""The membership protocol (cluster/membership.py) on both stores that implement it: a real
ZooKeeper, and S3 alone (moto on 127.0.0.1). The same calls give the same answers; the
S3 membership's leases are then checked on their own with a manual clock."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from support.faulty_proxy import FaultyProxy
from support.waiting import poll_until

from sediment.clock import ManualClock
from sediment.cluster import layout, s3_layout
from sediment.cluster.membership import CONNECTED, LOST, SUSPENDED, CallUnanswered, Membership
from sediment.cluster.read_confirm import ReadConfirmer
from sediment.cluster.s3_membership import IN_TOUCH, RENEWALS, S3Membership
from sediment.cluster.zk_membership import ZooKeeperMembership

KEY = "5e5e5e5e-0000-4000-8000-00000000c0de"


def s3_cluster(moto_server, bucket: str, lease_time: float) -> s3_layout.S3ClusterPath:
    where = s3_layout.S3ClusterPath.parse(f"s3://{bucket}/c-{uuid.uuid4().hex[:8]}?endpoint={moto_server.endpoint}")
    store = s3_layout.open_store(where)
    try:
        s3_layout.create(store, where, layout.ClusterConfig(
            partitions=2, replicas=[], cluster_key="", blob=f"s3://{bucket}/b", session_timeout=lease_time,
            wal=f"s3://{bucket}/w"))
    finally:
        store.close()
    return where


@pytest.fixture(params=[pytest.param("zk", marks=pytest.mark.zookeeper), pytest.param("s3", marks=pytest.mark.s3)])
def memberships(request) -> Iterator[tuple[Membership, Membership]]:
    """Two members' views of one new cluster, started; stopped at the end."""
    if request.param == "zk":
        zookeeper, zk_root = request.getfixturevalue("zookeeper"), request.getfixturevalue("zk_root")
        where = layout.ClusterPath.parse(f"zk://127.0.0.1:{zookeeper.port}{zk_root}")
        zk = layout.connect_zk(where)
        try:
            layout.create(zk, where, layout.ClusterConfig(partitions=2, replicas=["127.0.0.1:1"], cluster_key=KEY,
                                                          blob="file:///x", session_timeout=10.0))
        finally:
            zk.stop()
            zk.close()
        pair = (ZooKeeperMembership(where), ZooKeeperMembership(where))
    else:
        moto_server, (_endpoint, bucket) = request.getfixturevalue("moto_server"), request.getfixturevalue("s3_bucket")
        where = s3_cluster(moto_server, bucket, 30.0)
        pair = (S3Membership(where), S3Membership(where))
    for m in pair:
        m.start(lambda _state: None)
    try:
        yield pair
    finally:
        for m in pair:
            m.stop()


def nothing() -> None:
    pass


def test_members_are_ordered_by_age_and_the_oldest_manages(memberships):
    a, b = memberships
    first = a.register("grpc://127.0.0.1:1")
    second = b.register("grpc://127.0.0.1:2")
    assert first < second
    assert sorted(a.members(nothing)) == sorted(b.members(nothing)) == [first, second]
    view = b.read_view()
    assert view["manager"] == first
    assert view["members"] == {first: "grpc://127.0.0.1:1", second: "grpc://127.0.0.1:2"}
    b.announce_leaving(second)
    assert a.leaving(nothing) == [second]
    a.remove(second)
    assert a.members(nothing) == [first]


def test_the_assignment_is_written_by_compare_and_set(memberships):
    a, b = memberships
    a.register("grpc://127.0.0.1:1")
    assert a.read_assignment(nothing) == (b"", None)
    one = layout.encode_assignment({0: ("m-1", 1), 1: ("m-1", 1)})
    assert a.write_assignment(one, None)
    assert not b.write_assignment(one, None)  # another manager's write came first
    data, version = b.read_assignment(nothing)
    assert layout.decode_assignment(data) == {0: ("m-1", 1), 1: ("m-1", 1)}
    two = layout.encode_assignment({0: ("m-1", 1), 1: ("m-2", 2)})
    assert b.write_assignment(two, version)
    assert not a.write_assignment(one, version)  # read before b's write: refused
    assert layout.decode_assignment(a.read_assignment(nothing)[0]) == {0: ("m-1", 1), 1: ("m-2", 2)}


def test_the_assignment_now_is_the_stores_not_the_last_pass(memberships):
    a, b = memberships
    a.register("grpc://127.0.0.1:1")
    assert a.assignment_now() == {}
    assert a.write_assignment(layout.encode_assignment({0: ("m-1", 1), 1: ("m-1", 1)}), None)
    _data, version = b.read_assignment(nothing)  # b's pass
    assert b.assignment_now() == {0: ("m-1", 1), 1: ("m-1", 1)}
    assert a.write_assignment(layout.encode_assignment({0: ("m-1", 1), 1: ("m-2", 2)}), version)
    assert b.assignment_now() == {0: ("m-1", 1), 1: ("m-2", 2)}  # written after b's pass: read now
    assert layout.decode_assignment(b.read_assignment(nothing)[0]) == b.assignment_now()


def test_reads_waiting_together_share_one_confirmation_that_began_after_they_arrived(memberships):
    """ReadIndex's rule (cluster/read_confirm.py): a read arriving while a round is in flight
    must not take that round's answer (it may predate a write completed before the read
    arrived); it waits for the next round, which every read waiting then shares."""
    a, b = memberships
    a.register("grpc://127.0.0.1:1")
    assert a.write_assignment(layout.encode_assignment({0: ("m-1", 1), 1: ("m-1", 1)}), None)
    first_read, release = threading.Event(), threading.Event()
    calls: list[dict] = []

    def read() -> dict:
        got = b.assignment_now()
        calls.append(got)
        if len(calls) == 1:  # the first round has read; it answers once released
            first_read.set()
            release.wait(30)
        return got

    confirmer = ReadConfirmer(read, timeout=30)
    answers: dict[int, object] = {}

    def confirm(i: int) -> None:
        answers[i] = confirmer.confirm()

    first = threading.Thread(target=confirm, args=(0,))
    first.start()
    assert first_read.wait(30)
    _data, version = a.read_assignment(nothing)
    assert a.write_assignment(layout.encode_assignment({0: ("m-1", 1), 1: ("m-2", 2)}), version)
    later = [threading.Thread(target=confirm, args=(i,)) for i in range(1, 9)]
    for t in later:
        t.start()
    poll_until(lambda: confirmer.waiting == 8, 30, "the later reads to wait")
    release.set()
    for t in (first, *later):
        t.join(30)
        assert not t.is_alive()
    assert answers[0] == {0: ("m-1", 1), 1: ("m-1", 1)}  # it arrived before the write
    assert all(answers[i] == {0: ("m-1", 1), 1: ("m-2", 2)} for i in range(1, 9)), answers  # arrived after it
    assert len(calls) == 2  # the eight later reads rode on one round


def test_a_read_waits_for_a_confirmation_at_most_the_timeout(memberships):
    _a, b = memberships
    began, release = threading.Event(), threading.Event()

    def read() -> dict:
        began.set()
        release.wait(30)
        return b.assignment_now()

    confirmer = ReadConfirmer(read, timeout=0.5)
    leader = threading.Thread(target=confirmer.confirm)
    leader.start()
    try:
        assert began.wait(30), "the first round never began"
        started = time.monotonic()
        with pytest.raises(CallUnanswered, match="within 0.5 s"):
            confirmer.confirm()
        assert time.monotonic() - started < 5
    finally:
        release.set()
        leader.join(30)
    assert confirmer.confirm() == {}  # a round begun after the slow one answers again


def test_a_relation_is_recorded_once_and_removed_only_as_the_record_read(memberships):
    a, b = memberships
    assert a.record_relation("orders", 1) == (1, True)
    assert b.record_relation("orders", 0) == (1, False)
    partition, record = b.relation("orders")
    assert partition == 1 and a.relation_names() == ["orders"]
    a.remove_relation("orders")
    assert a.record_relation("orders", 0) == (0, True)  # added again: a new record
    b.remove_relation("orders", record)  # the drop read the old record: the new one stays
    assert a.relation("orders")[0] == 0
    a.remove_relation("orders", a.relation("orders")[1])
    assert a.relation("orders") is None and b.relation_names() == []


@pytest.mark.s3
def test_an_s3_lease_unrenewed_for_the_lease_time_on_the_observers_clock_is_removed(moto_server, s3_bucket):
    lease = 1000.0  # the renewal thread (every 200 s) never runs: the test renews by hand
    where = s3_cluster(moto_server, s3_bucket[1], lease)
    clock_a, clock_b = ManualClock(0.0), ManualClock(5000.0)  # no clocks are compared
    states: list[str] = []
    a, b = S3Membership(where, clock_a), S3Membership(where, clock_b)
    a.start(states.append)
    b.start(lambda _state: None)
    try:
        def b_lives(seconds: float) -> None:  # b's clock moves on, b renewing as its thread would
            for _ in range(RENEWALS):
                clock_b.advance(seconds / RENEWALS)
                assert b.renew_now() == CONNECTED

        old = a.register("grpc://127.0.0.1:1")
        young = b.register("grpc://127.0.0.1:2")
        assert b.members(nothing) == [old, young]  # first look: counted from now
        b_lives(lease - 1)
        assert b.members(nothing) == [old, young]
        assert a.renew_now() == CONNECTED
        b_lives(2)
        assert b.members(nothing) == [old, young]  # renewed: counted again from this look
        b_lives(lease - 1)
        assert b.members(nothing) == [old, young]
        b_lives(1)
        assert b.members(nothing) == [young]  # unchanged for the lease time: deleted, dead for everyone
        assert a.members(nothing) == [young]
        assert a.fresh(0.0)
        assert a.renew_now() == LOST and states[-1] == LOST  # it learns so at its next renewal
        assert a.renew_now() == CONNECTED  # S3 answers: it may join again, as a new member
        again = a.register("grpc://127.0.0.1:1")
        assert again > young and b.members(nothing) == [young, again]
        assert b.read_view()["manager"] == young
        clock_a.advance(lease * IN_TOUCH)
        assert not a.fresh(0.0)  # not renewed for two thirds of the lease: it stops serving
    finally:
        a.stop()
        b.stop()


def through(where: s3_layout.S3ClusterPath, endpoint: str) -> s3_layout.S3ClusterPath:
    """The same cluster reached through another endpoint (a fault proxy in front of moto)."""
    return s3_layout.S3ClusterPath.parse(f"s3://{where.bucket}/{where.prefix}?endpoint={endpoint}")


@pytest.mark.s3
def test_an_s3_outage_longer_than_the_lease_ends_no_lease_once_s3_answers_again(moto_server, s3_bucket):
    lease = 1000.0  # renewals by hand, as in the test above
    where = s3_cluster(moto_server, s3_bucket[1], lease)
    clock_a, clock_b = ManualClock(0.0), ManualClock(7000.0)
    states: list[str] = []
    with FaultyProxy(moto_server.endpoint) as proxy:
        a, b = S3Membership(through(where, proxy.endpoint), clock_a), S3Membership(through(where, proxy.endpoint),
                                                                                   clock_b)
        a.start(states.append)
        b.start(lambda _state: None)
        try:
            old, young = a.register("grpc://127.0.0.1:1"), b.register("grpc://127.0.0.1:2")
            assert b.members(nothing) == [old, young]
            proxy.window("fail", 600.0)  # S3 answers nobody: nobody can renew
            for _ in range(3):  # over two lease times, a look at S3 every 0.7 of one
                clock_a.advance(lease * 0.7)
                clock_b.advance(lease * 0.7)
                assert a.renew_now() == SUSPENDED and b.renew_now() == SUSPENDED  # not LOST: its key may be intact
                assert not a.fresh(0.0) and not b.fresh(0.0)  # and it serves nothing meanwhile
            proxy.clear()
            assert b.members(nothing) == [old, young]  # b, not renewed since, judges no one
            assert b.renew_now() == CONNECTED
            assert b.members(nothing) == [old, young]  # renewed after a gap: b counts a's lease afresh
            assert a.renew_now() == CONNECTED  # a's key is intact: the same member, the same id
            assert LOST not in states and states[-1] == CONNECTED
            assert a.members(nothing) == [old, young] == b.members(nothing)
            for _ in range(RENEWALS):
                clock_b.advance(lease / RENEWALS * 0.99)
                assert b.renew_now() == CONNECTED
            assert b.members(nothing) == [old, young]
            clock_b.advance(lease * 0.02)
            assert b.members(nothing) == [young]  # a silent for a whole lease since b last saw it renew: dead
        finally:
            proxy.clear()
            a.stop()
            b.stop()


@pytest.mark.s3
def test_a_member_cut_off_from_s3_alone_is_removed_and_learns_it_once_s3_answers(moto_server, s3_bucket):
    lease = 1000.0
    where = s3_cluster(moto_server, s3_bucket[1], lease)
    clock_a, clock_b = ManualClock(0.0), ManualClock(7000.0)
    with FaultyProxy(moto_server.endpoint) as proxy:
        a, b = S3Membership(through(where, proxy.endpoint), clock_a), S3Membership(where, clock_b)
        a.start(lambda _state: None)
        b.start(lambda _state: None)
        try:
            old, young = a.register("grpc://127.0.0.1:1"), b.register("grpc://127.0.0.1:2")
            assert b.members(nothing) == [old, young]
            proxy.window("fail", 600.0)  # only a's requests fail
            clock_a.advance(lease * IN_TOUCH)
            assert a.renew_now() == SUSPENDED and not a.fresh(0.0)  # stopped serving before b can judge it
            for _ in range(RENEWALS):
                clock_b.advance(lease / RENEWALS)
                assert b.renew_now() == CONNECTED
            assert b.members(nothing) == [young]  # unchanged for a lease while b could see it: dead
            proxy.clear()
            assert a.renew_now() == LOST and not a.fresh(0.0)  # its key is gone: out, to join anew
        finally:
            proxy.clear()
            a.stop()
            b.stop()


@pytest.mark.s3
def test_s3_cluster_values_carry_their_format_and_version(moto_server, s3_bucket):
    where = s3_cluster(moto_server, s3_bucket[1], 30.0)
    store = s3_layout.open_store(where)
    try:
        with pytest.raises(Exception, match="already records a cluster"):
            s3_layout.create(store, where, s3_layout.read_config(store, where))
        store.compare_and_set("relations/bad", b'{"format": "sediment-relation", "version": 2}', None)
        with pytest.raises(Exception, match="sediment-relation record of version 1"):
            s3_layout.read_relations(store)
    finally:
        store.close()
