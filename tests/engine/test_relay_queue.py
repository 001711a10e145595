"""The relay's primitives on their own: a reader queue whose writer's quiet puts wake the
reader only through the relay, a few readers at a time, each waking the next once it has
its item; direct puts wake at once; timeouts leave nothing behind."""

from __future__ import annotations

import queue
import threading

import pytest
from support.waiting import until

from sediment.engine.feed_relay import Relay, RelayQueue


class CountingRelay(Relay):
    """A relay that counts the readers it woke that have yet to settle (the most at once)."""

    __slots__ = ("awake", "most")

    def __init__(self) -> None:
        super().__init__()
        self.awake = self.most = 0

    def _hand_on(self) -> bool:
        woke = super()._hand_on()
        if woke:
            self.awake += 1
            self.most = max(self.most, self.awake)
        return woke

    def settle(self, sleeper, forget: bool = False) -> None:
        with self._lock:
            if not sleeper.sleeping:
                self.awake -= 1
        super().settle(sleeper, forget)




def _reader(q: RelayQueue, out: list, timeout: float | None = None) -> threading.Thread:
    def read() -> None:
        try:
            out.append(q.get(timeout=timeout))
        except queue.Empty:
            out.append("empty")
    th = threading.Thread(target=read, daemon=True)
    th.start()
    return th


def _asleep(queues: list[RelayQueue], outs: list[list], timeout: float | None = None) -> list[threading.Thread]:
    threads = []
    for q, out in zip(queues, outs, strict=True):
        threads.append(_reader(q, out, timeout))
        assert until(lambda q=q: q.sleeping), "a reader never went to sleep"
    return threads


def test_a_quiet_put_wakes_a_sleeping_reader_only_when_the_relay_starts():
    relay = Relay()
    q = RelayQueue(relay)
    out: list = []
    [th] = _asleep([q], [out])
    q.put_quiet("event")
    assert q.wake.locked() and q.sleeping and out == [], "a quiet put woke the reader by itself"
    assert relay.pending == [q]
    relay.start()
    th.join(timeout=10)
    assert out == ["event"]
    assert not q.sleeping and relay.pending == []


@pytest.mark.parametrize("chains", [1, 2, 3])
def test_the_relay_wakes_every_reader_at_most_chains_at_a_time(chains):
    relay = CountingRelay()
    queues = [RelayQueue(relay) for _ in range(24)]
    outs: list[list] = [[] for _ in queues]
    threads = _asleep(queues, outs)
    for n, q in enumerate(queues):
        q.put_quiet(n)
    relay.start(chains)
    for th in threads:
        th.join(timeout=10)
    assert not any(th.is_alive() for th in threads), "the relay left a reader asleep"
    assert [out for out in outs] == [[n] for n in range(len(queues))]
    assert 1 <= relay.most <= chains, f"{relay.most} readers awake at once with {chains} chains"
    assert relay.awake == 0


def test_the_relay_goes_on_for_later_events_after_readers_of_earlier_ones_settled():
    relay = Relay()
    queues = [RelayQueue(relay) for _ in range(6)]
    for event in range(3):
        outs: list[list] = [[] for _ in queues]
        threads = _asleep(queues, outs)
        for q in queues:
            q.put_quiet(event)
        relay.start(1)
        for th in threads:
            th.join(timeout=10)
        assert outs == [[event]] * len(queues), f"event {event} did not reach every reader"


def test_a_direct_put_wakes_the_reader_at_once_and_leaves_the_relay_as_it_was():
    relay = CountingRelay()
    q, other = RelayQueue(relay), RelayQueue(relay)
    out: list = []
    [th] = _asleep([q], [out])
    q.put("error")
    th.join(timeout=10)
    assert out == ["error"] and relay.awake == 0 and relay.pending == []
    later: list = []
    [th] = _asleep([other], [later])  # one chain is still free: a direct wake took none
    other.put_quiet("event")
    relay.start(1)
    th.join(timeout=10)
    assert later == ["event"]


def test_a_reader_that_times_out_leaves_nothing_pending():
    relay = Relay()
    q = RelayQueue(relay)
    out: list = []
    [th] = _asleep([q], [out], timeout=0.05)
    th.join(timeout=10)
    assert out == ["empty"]
    assert not q.sleeping and relay.pending == []


def test_a_reader_made_pending_that_times_out_takes_its_item_and_the_relay_skips_it():
    relay = CountingRelay()
    q = RelayQueue(relay)
    out: list = []
    [th] = _asleep([q], [out], timeout=0.2)
    q.put_quiet("event")  # pending, but the relay is not started before the reader's timeout
    th.join(timeout=10)
    assert out == ["event"]
    assert relay.pending == []
    relay.start(1)
    assert relay.awake == 0, "the relay woke a reader that was no longer asleep"
    queues = [RelayQueue(relay) for _ in range(3)]
    outs: list[list] = [[] for _ in queues]
    threads = _asleep(queues, outs)
    for q2 in queues:
        q2.put_quiet("next")
    relay.start(1)
    for t in threads:
        t.join(timeout=10)
    assert outs == [["next"]] * 3


def test_a_reader_reads_what_was_queued_before_it_asked_without_sleeping():
    relay = Relay()
    q = RelayQueue(relay)
    q.put_quiet(1)
    q.put(2)
    assert not q.empty()
    assert [q.get(timeout=0), q.get_nowait()] == [1, 2]
    assert q.empty() and relay.pending == []
    with pytest.raises(queue.Empty):
        q.get_nowait()
    with pytest.raises(queue.Empty):
        q.get(timeout=0)
