"""Shared feed streams at their edges: a relation dropped and created again under an open
subscription, the initial events against max_lag, a join or subscribe the client gave up
on, idle streams, a client reader that fails."""

from __future__ import annotations

import threading
import time
import uuid

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from support.served import served_engine
from support.waiting import poll_until

from sediment.client import Client
from sediment.errors import EngineClosed, FeedOverrun, InvalidArgument, UnknownRelation
from sediment.net import shared_feeds, shared_subscription
from sediment.net.remote_subscription import CHECK_EVERY

SCHEMA = pa.schema([("k", pa.int64())])
TOKEN = "shared-edge-" + uuid.uuid4().hex


def row(k: int, t: int) -> pa.Table:
    return pa.table({"k": pa.array([k], pa.int64()), "time": pa.array([t], pa.int64()),
                     "diff": pa.array([1], pa.int64())})


def subscribers(engine) -> int:
    return engine.stats()["relations"]["r"]["subscribers"]


def slowed(real, seconds: float, done: threading.Event):
    """``real`` (a server's engine subscribe) taking ``seconds`` longer: a slow snapshot;
    ``done`` is set once it has subscribed."""
    def slow(name, args):
        threading.Event().wait(seconds)
        try:
            return real(name, args)
        finally:
            done.set()
    return slow


@pytest.fixture
def served(tmp_path):
    with served_engine(tmp_path / "data", TOKEN, SCHEMA) as got:
        yield got


def test_a_subscription_to_a_recreated_relation_gets_its_updates(served):
    """Two feeds can sit at the same cursor: the server must not carry a subscription of the
    new relation on the dropped one's engine subscription."""
    engine, _server, client = served
    old = client.subscribe("r")
    assert old.next(timeout=10).kind == "snapshot"
    engine.drop_relation("r")
    engine.add_relation("r", SCHEMA)
    engine.seal("r", 0)
    new = client.subscribe("r")
    assert new.next(timeout=10).kind == "snapshot"
    assert new.next(timeout=1.5) is None  # caught up, and idle past a server round: mergeable
    assert subscribers(engine) == 1, "the new relation's subscription was merged onto another feed"
    engine.append("r", row(1, 2))
    got = new.next(timeout=10)
    assert got is not None and got.kind == "updates", "the new relation's update never came"
    assert got.table.column("k").to_pylist() == [1]
    old.close()
    new.close()


def test_initial_events_do_not_count_against_max_lag(served):
    """As the engine's: snapshot, stored updates and progress come whatever max_lag is."""
    engine, _server, client = served
    engine.append("r", row(5, 10))  # a stored update
    engine.seal("r", 3)
    direct = engine.subscribe("r", 0, max_lag=2)
    expected = [direct.next(timeout=10).kind for _ in range(3)]
    direct.close()
    sub = client.subscribe("r", 0, max_lag=2)
    busy = client.subscribe("r")  # reads on while sub's initial events wait in the client
    assert busy.next(timeout=10).kind == "snapshot"
    assert busy.next(timeout=10).kind == "updates"
    for t in (20, 21):
        engine.append("r", row(t, t))
    live = []
    while len(live) < 2:
        event = busy.next(timeout=10)
        assert event is not None
        live += event.table.column("k").to_pylist() if event.kind == "updates" else []
    assert [sub.next(timeout=10).kind for _ in range(3)] == expected == ["snapshot", "updates", "progress"]
    keys = []
    while len(keys) < 2:
        event = sub.next(timeout=10)
        assert event is not None
        keys += event.table.column("k").to_pylist() if event.kind == "updates" else []
    assert keys == [20, 21]
    sub.close()
    busy.close()


def test_a_join_the_client_gave_up_on_is_undone_on_the_server(served):
    engine, server, client = served
    first = client.subscribe("r")
    assert first.next(timeout=10).kind == "snapshot"
    real, done = server._shared._subscribe, threading.Event()
    server._shared._subscribe = slowed(real, 2, done)  # the join's snapshot outlasts the client's deadline
    client._options = flight.FlightCallOptions(timeout=1, headers=client._options.headers)  # calls from now on
    with pytest.raises(Exception):  # noqa: B017 - whichever error the deadline gives
        client.subscribe("r", max_lag=1000)
    assert done.wait(10)
    server._shared._subscribe = real
    poll_until(lambda: subscribers(engine) == 1, 15, "the abandoned join's engine subscription to be released")
    engine.append("r", row(1, 2))
    event = first.next(timeout=10)
    assert event.kind == "updates" and event.table.column("k").to_pylist() == [1]
    first.close()


@pytest.mark.parametrize("shared", [False, True])
def test_a_subscribe_the_client_gave_up_on_releases_its_engine_subscription(served, shared):
    """gRPC never starts the stream of a call cancelled before its handler returned."""
    engine, server, _client = served
    client = Client(server.uri, TOKEN, timeout=1)
    real, done = server._engine_subscription, threading.Event()
    server._engine_subscription = server._shared._subscribe = slowed(real, 2, done)
    with pytest.raises(Exception):  # noqa: B017 - whichever error the deadline gives
        client.subscribe("r", shared=shared)
    assert done.wait(10)
    poll_until(lambda: subscribers(engine) == 0, 20, "the abandoned subscribe's engine subscription to be released")
    assert not server._shared._shares, "the shared stream that never started is still listed"
    client.close()


def test_an_idle_stream_wakes_rarely_and_a_join_wakes_it_at_once(served, monkeypatch):
    _engine, _server, client = served
    rounds = []
    real = shared_feeds.SharedFeeds._round
    monkeypatch.setattr(shared_feeds.SharedFeeds, "_round",
                        lambda self, *args: rounds.append(time.monotonic()) or real(self, *args))
    subs = [client.subscribe("r") for _ in range(3)]
    for s in subs:
        assert s.next(timeout=10).kind == "snapshot"
    start = len(rounds)
    assert subs[0].next(timeout=3) is None
    assert len(rounds) - start <= 5, f"an idle stream woke {len(rounds) - start} times in 3 s"
    began = time.monotonic()
    late = client.subscribe("r")
    assert late.next(timeout=10).kind == "snapshot"
    assert time.monotonic() - began < 0.8, "the join waited for the stream's idle wake-up"
    for s in [*subs, late]:
        s.close()


def test_a_client_reader_that_fails_cancels_the_stream(served, monkeypatch):
    engine, server, client = served
    sub = client.subscribe("r")
    assert sub.next(timeout=10).kind == "snapshot"

    def broken(meta, data, *how):
        raise ValueError("cannot decode this event")
    monkeypatch.setattr(shared_subscription, "decode_event", broken)
    engine.append("r", row(1, 2))
    with pytest.raises(ValueError, match="cannot decode"):
        sub.next(timeout=10)
    assert server.wait_feeds_released(10), "the server still streams to a reader that failed"


def test_an_overrun_does_not_hold_up_the_other_subscriptions_of_its_stream(tmp_path, monkeypatch):
    """The overrun's feed_leave is a round trip (here a slow one): the stream's reader
    thread must not make it, or every other subscription on the stream waits for it."""
    real = shared_feeds.SharedFeeds.leave

    def slow_leave(self, args):
        threading.Event().wait(10)
        real(self, args)
    monkeypatch.setattr(shared_feeds.SharedFeeds, "leave", slow_leave)
    with served_engine(tmp_path / "data", TOKEN, SCHEMA) as (engine, _server, client):
        idle = client.subscribe("r", max_lag=3)
        busy = client.subscribe("r")
        for s in (idle, busy):
            assert s.next(timeout=10).kind == "snapshot"
        more = CHECK_EVERY + 8  # idle is dropped in the client on the way
        slowest = 0.0
        for k in range(more):  # one at a time: the server keeps up, idle lags in the client alone
            engine.append("r", row(k, k + 2))
            began = time.monotonic()
            assert keys_until(busy, 1) == [k]
            slowest = max(slowest, time.monotonic() - began)
        assert slowest < 5, f"busy waited {slowest:.1f} s for an event: the overrun's feed_leave held it up"
        with pytest.raises(FeedOverrun, match="in the client"):
            while True:
                assert idle.next(timeout=10) is not None
        busy.close()


def keys_until(sub, n: int) -> list[int]:
    """The keys of ``sub``'s next ``n`` updates (other events skipped)."""
    keys: list[int] = []
    while len(keys) < n:
        event = sub.next(timeout=30)
        assert event is not None, f"the feed stalled after {keys}"
        keys += event.table.column("k").to_pylist() if event.kind == "updates" else []
    return keys


class _HeldSubscriptions:
    """The server's holder of engine subscriptions, as SharedFeeds uses it: counts releases."""

    def __init__(self) -> None:
        self.released: list = []

    def track(self, sub, where: str) -> None:
        pass

    def release(self, sub) -> None:
        self.released.append(sub)


def test_leaves_remembered_for_joins_on_their_way_stay_bounded_and_still_undo_a_late_join():
    held = _HeldSubscriptions()

    def subscribe(name: str, args: dict):
        if args.get("as_of") == -5:
            raise InvalidArgument("as_of -5 is before any time")
        return object()

    feeds = shared_feeds.SharedFeeds(held, subscribe, lambda: False, 1.0)
    feeds.open("r", {"version": shared_feeds.SHARE_VERSION, "stream": "s", "sub": "a"}, None, "here")
    share = feeds._shares["s"]
    for i in range(3 * shared_feeds.LEFT_KEPT):  # refused joins, each followed by the client's leave
        with pytest.raises(InvalidArgument):
            feeds.join({"stream": "s", "sub": f"j{i}", "as_of": -5})
        feeds.leave({"stream": "s", "sub": f"j{i}"})
    assert len(share.left) <= shared_feeds.LEFT_KEPT
    feeds.leave({"stream": "s", "sub": "late"})  # the leave overtakes its join
    with pytest.raises(EngineClosed):
        feeds.join({"stream": "s", "sub": "late"})
    assert "late" not in share.by_sid and "late" not in share.left and len(held.released) == 1


@pytest.mark.parametrize("shared", [True, False])
def test_a_stream_whose_subscriptions_the_server_all_ended_is_let_go(served, shared):
    """When the server ends every subscription on a stream with an error (here the relation
    was dropped), the client gets it typed and the stream ends, rather than staying open
    with its reading thread (and the server's handler) until a later subscribe reuses it;
    a stream of its own (``shared=False``) the same."""
    engine, server, client = served
    sub = client.subscribe("r", shared=shared)
    assert sub.next(timeout=10).kind == "snapshot"
    engine.drop_relation("r")
    with pytest.raises(UnknownRelation, match="'r' was dropped"):
        while True:
            assert sub.next(timeout=10) is not None, "the dropped relation's subscription neither ended nor failed"
    assert server.wait_feeds_released(10), "the stream outlived every subscription on it"
    poll_until(lambda: not server._shared._shares, 10, "the server's shared stream to end")
    poll_until(lambda: client._feed_shares.streams == 0, 10, "the client to let its shared stream go")
    sub.close()
    engine.add_relation("r", SCHEMA)
    again = client.subscribe("r", shared=shared)  # on a new stream
    assert again.next(timeout=10).kind == "snapshot"
    engine.append("r", row(7, 1))
    assert keys_until(again, 1) == [7]
    again.close()


def test_subscriptions_to_relations_dropped_one_after_another_leave_no_stream_open(served):
    """A long-lived client subscribing to relations that are then dropped (each subscription
    closed after its error, as a reader does): every shared stream ends on both sides, so
    neither the server's handler threads nor the client's reading threads pile up. A stream
    that still has a live subscription stays."""
    engine, server, client = served
    kept = client.subscribe("r")
    assert kept.next(timeout=10).kind == "snapshot"
    for i in range(3):
        name = f"gone{i}"
        engine.add_relation(name, SCHEMA)
        pair = [client.subscribe(name), client.subscribe(name)]
        for sub in pair:
            assert sub.next(timeout=10).kind == "snapshot"
        engine.drop_relation(name)
        for sub in pair:
            with pytest.raises(UnknownRelation):
                while True:
                    assert sub.next(timeout=10) is not None
            sub.close()
        poll_until(lambda: len(server._shared._shares) == 1, 10, f"the server's stream of {name} to end")
        poll_until(lambda: client._feed_shares.streams == 1, 10, f"the client's stream of {name} to be let go")
    engine.append("r", row(3, 1))
    assert keys_until(kept, 1) == [3]
    kept.close()
    poll_until(lambda: not server._shared._shares and client._feed_shares.streams == 0, 10, "the last stream to end")
