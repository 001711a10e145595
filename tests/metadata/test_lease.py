"""The membership lease over a metadata store without sessions (metadata/lease.py): renewed
by its holder, taken over by another member only after it saw the same write unchanged for
the lease time on its own clock. On the memory store and on the S3 store through the proxy
that serializes conditional writes (race outcomes are asserted only there); a release and a
new holder's take, which start the key's versions again at 0, on every metadata store."""

from __future__ import annotations

import threading

import pytest

from sediment.clock import ManualClock
from sediment.errors import InvalidMetadataRequest
from sediment.metadata.lease import Lease
from sediment.metadata.memory import MemoryMetadataStore
from sediment.metadata.protocol import MetadataStore

KEY = "cluster/lease"


def test_the_holder_keeps_the_lease_while_it_renews_and_loses_it_once_it_stops():
    store = MemoryMetadataStore()
    a_clock, b_clock = ManualClock(), ManualClock(1000.0)  # clocks far apart: never compared
    a = Lease(store, KEY, "a", 10.0, a_clock)
    b = Lease(store, KEY, "b", 10.0, b_clock)
    assert a.try_acquire() and a.held
    assert not b.try_acquire()  # first look: the lease is alive
    for _ in range(5):  # a renews every 4 s of its clock; b never sees one version for 10 s
        a_clock.advance(4.0)
        b_clock.advance(4.0)
        assert a.try_acquire()
        assert not b.try_acquire()
    b_clock.advance(9.9)  # a stopped renewing: b waits the whole lease time on its own clock
    assert not b.try_acquire()
    b_clock.advance(0.2)
    assert b.try_acquire() and b.held and store.get(KEY) is not None
    assert Lease(store, KEY, "c", 10.0, ManualClock()).current_holder() == "b"
    assert not a.try_acquire() and not a.held  # a's renewal finds b's version: a lost it
    b.release()
    assert a.try_acquire() and a.current_holder() == "a"


def test_a_lease_taken_anew_after_a_release_is_not_taken_over_at_once(store: MetadataStore):
    """A release deletes the key, so the next holder's first write is version 0 again: a
    member that saw the previous holder's version 0 a lease time ago must not count that as
    the same lease unrenewed, and the previous holder must not renew the new one as its own."""
    a_clock, b_clock = ManualClock(), ManualClock(50.0)
    a = Lease(store, KEY, "a", 10.0, a_clock)
    b = Lease(store, KEY, "b", 10.0, b_clock)
    assert a.try_acquire()
    assert not b.try_acquire()  # b sees a's version 0 at its time 50
    a.release()
    c = Lease(store, KEY, "c", 10.0, ManualClock())
    assert c.try_acquire()  # version 0 again, a moment before b looks
    b_clock.advance(10.0)
    assert not b.try_acquire() and c.current_holder() == "c"  # c's lease is new: b waits a lease time from now
    b_clock.advance(9.9)
    assert not b.try_acquire()
    b_clock.advance(0.2)  # c stopped renewing a whole lease time ago on b's clock
    assert b.try_acquire() and c.current_holder() == "b"


def test_a_stale_holder_does_not_renew_a_lease_that_reached_its_version_again(store: MetadataStore):
    """``a`` stalls holding version 0; ``b`` takes the lease over and releases it, and ``c``
    takes it at version 0: ``a``, resumed, finds version 0 but not its own write."""
    a = Lease(store, KEY, "a", 10.0, ManualClock())
    b_clock = ManualClock()
    b = Lease(store, KEY, "b", 10.0, b_clock)
    assert a.try_acquire()
    assert not b.try_acquire()
    b_clock.advance(10.0)
    assert b.try_acquire()
    b.release()
    c = Lease(store, KEY, "c", 10.0, ManualClock())
    assert c.try_acquire()
    assert not a.try_acquire() and not a.held
    assert c.current_holder() == "c" and c.try_acquire() and c.held


def test_a_lease_needs_a_holder_and_a_positive_time():
    with pytest.raises(InvalidMetadataRequest):
        Lease(MemoryMetadataStore(), KEY, "", 1.0, ManualClock())
    with pytest.raises(InvalidMetadataRequest):
        Lease(MemoryMetadataStore(), KEY, "a", 0.0, ManualClock())


@pytest.mark.s3
def test_members_racing_for_an_expired_lease_on_s3_leave_one_holder(serializing_proxy, s3_bucket):
    from sediment.metadata.s3 import S3MetadataStore

    _, bucket = s3_bucket
    stores = [S3MetadataStore(bucket, "meta", endpoint_url=serializing_proxy.endpoint) for _ in range(5)]
    try:
        old = Lease(stores[0], KEY, "old", 5.0, ManualClock())
        assert old.try_acquire()
        clock = ManualClock()
        members = [Lease(s, KEY, f"m{i}", 5.0, clock) for i, s in enumerate(stores[1:])]
        assert not any(m.try_acquire() for m in members)
        clock.advance(5.0)
        won: list[bool] = [False] * len(members)

        def take(i: int) -> None:
            won[i] = members[i].try_acquire()

        threads = [threading.Thread(target=take, args=(i,)) for i in range(len(members))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sum(won) == 1, won
        winner = members[won.index(True)]
        assert old.current_holder() == winner.holder and not old.try_acquire()
    finally:
        for s in stores:
            s.close()
