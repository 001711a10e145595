"""A reader on the main thread is woken on its own and never runs the relay's hand-on:
Ctrl-C raises KeyboardInterrupt there between any two bytecodes, and a hand-on stopped half
way would leave other readers asleep. A feed's close ends every subscriber's wait, even one
a cut-short wake-up left outside the relay."""

from __future__ import annotations

import queue
import threading

import pyarrow as pa
import pytest
from support.waiting import until

import sediment
from sediment.engine.feed_relay import Relay, RelayQueue

SCHEMA = pa.schema([("k", pa.int64())])
EVENTS = 60
READERS = 12


def one_row(i: int) -> pa.Table:
    return pa.table({"k": [i], "time": [i + 1], "diff": [1]})


@pytest.fixture
def hand_ons(monkeypatch) -> list[threading.Thread]:
    """The thread of every hand-on that woke a reader."""
    seen: list[threading.Thread] = []
    original = Relay._hand_on

    def watched(self) -> bool:
        woke = original(self)
        if woke:
            seen.append(threading.current_thread())
        return woke

    monkeypatch.setattr(Relay, "_hand_on", watched)
    return seen


def _read(sub, out: list[int]) -> None:
    while len(out) < EVENTS:
        event = sub.next(timeout=30)
        assert event is not None, "a reader was left asleep"
        if event.kind == "updates":
            out.extend(event.table.column("k").to_pylist())


def test_a_main_thread_subscriber_is_woken_directly_and_wakes_no_one(tmp_path, hand_ons):
    with sediment.open(str(tmp_path / "d")) as eng:
        eng.add_relation("r", SCHEMA)
        subs = [eng.subscribe("r") for _ in range(READERS + 1)]
        assert all(sub.next(timeout=5).kind == "snapshot" for sub in subs)
        outs: list[list[int]] = [[] for _ in subs]
        readers = [threading.Thread(target=_read, args=(sub, out)) for sub, out in zip(subs[1:], outs[1:], strict=True)]
        for th in readers:
            th.start()

        def write() -> None:
            for i in range(EVENTS):
                eng.append("r", one_row(i))

        writer = threading.Thread(target=write)
        writer.start()
        _read(subs[0], outs[0])  # on the main thread, asleep between events
        writer.join(timeout=60)
        for th in readers:
            th.join(timeout=60)
        assert all(out == list(range(EVENTS)) for out in outs)
        assert hand_ons, "the other readers were woken through the relay"
        assert threading.main_thread() not in hand_ons, "the main thread ran a hand-on"
        assert subs[0].direct and not any(sub.direct for sub in subs[1:])


def test_a_main_thread_reader_of_a_relay_queue_is_woken_directly(hand_ons):
    relay = Relay()
    mine, theirs = RelayQueue(relay), [RelayQueue(relay) for _ in range(READERS)]
    got: list[list[int]] = [[] for _ in theirs]

    def read(q: RelayQueue, out: list[int]) -> None:
        while len(out) < EVENTS:
            out.append(q.get(timeout=30))

    readers = [threading.Thread(target=read, args=(q, out)) for q, out in zip(theirs, got, strict=True)]
    for th in readers:
        th.start()

    def write() -> None:
        everyone = [mine, *theirs]
        for i in range(EVENTS):
            assert until(lambda: all(q.sleeping for q in everyone), 30)  # each event wakes them all
            for q in everyone:
                q.put_quiet(i)
            relay.start()

    writer = threading.Thread(target=write)
    writer.start()
    assert [mine.get(timeout=30) for _ in range(EVENTS)] == list(range(EVENTS))
    writer.join(timeout=60)
    for th in readers:
        th.join(timeout=60)
    assert all(out == list(range(EVENTS)) for out in got)
    assert threading.main_thread() not in hand_ons
    with pytest.raises(queue.Empty):
        mine.get(timeout=0.01)
    assert mine not in relay.direct, "a timed-out direct reader stays among the sleepers"


def test_a_close_ends_the_wait_of_a_subscriber_left_outside_the_relay(tmp_path):
    eng = sediment.open(str(tmp_path / "d"))
    eng.add_relation("r", SCHEMA)
    sub = eng.subscribe("r")
    assert sub.next(timeout=5).kind == "snapshot"
    feed = eng.view.relations["r"].feed
    ended = threading.Event()

    def read() -> None:
        try:
            sub.next()  # no timeout: only an event or the close ends it
        except sediment.errors.EngineClosed:
            pass
        ended.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    until(lambda: sub in feed.relay.pending, 10)
    # what a hand-on stopped half way leaves: the flag cleared, the lock never released
    # and the sleeper in neither the relay's list nor its queue
    feed.relay.pending.remove(sub)
    sub.sleeping = False
    eng.close()
    assert ended.wait(10), "the close left the subscriber asleep"
    reader.join(timeout=5)
