"""The wait of a caught-up shared stream (sediment/net/shared_feeds.py ``_sleep_on_feeds``):
its reader sleeps on one bell hung on its carriers' feeds, which an event on any of its
carriers, a join, a subscription the server closed or the poll interval ends. Driven
round by round on a real engine; and over a real server, an update's message batches made
once for every stream that sends it."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pyarrow as pa
import pytest
from support.served import served_engine
from support.waiting import poll_until

import sediment
from sediment.client import Client
from sediment.engine.feed_bells import Bell
from sediment.errors import EngineClosed
from sediment.net import shared_feeds
from sediment.net.wire_errors import error_from_detail

SCHEMA = pa.schema([("k", pa.int64())])
TOKEN = "wait-" + uuid.uuid4().hex


def row(k: int) -> pa.Table:
    return pa.table({"k": pa.array([k], pa.int64()), "time": pa.array([k + 1], pa.int64()),
                     "diff": pa.array([1], pa.int64())})


class _Held:
    """The server's record of engine subscriptions: releasing one closes it."""

    def track(self, sub, where: str) -> None:
        pass

    def release(self, sub) -> None:
        sub.close()


def _messages(feeds: shared_feeds.SharedFeeds, share) -> list[dict]:
    return [json.loads(meta) for _batch, meta in feeds._round(share)]


def _until_idle(feeds, share) -> None:
    """Take the carriers' initial events until each has none left (without a round's wait,
    which nothing would end before the poll interval)."""
    for _ in range(20):
        if not feeds._take_each(share, list(share.carriers)) and all(c.idle for c in share.carriers):
            return
    raise AssertionError("the stream never caught up")


@pytest.fixture
def stream(tmp_path):
    engine = sediment.open(str(tmp_path / "data"))
    engine.add_relation("r", SCHEMA)
    subscribe = lambda name, args: engine.subscribe(name, args.get("as_of"), max_lag=args.get("max_lag"))  # noqa: E731
    feeds = shared_feeds.SharedFeeds(_Held(), subscribe, lambda: False, poll=5.0)
    feeds.open("r", {"version": shared_feeds.SHARE_VERSION, "stream": "s", "sub": "a"}, None, "here")
    feeds.join({"stream": "s", "sub": "b", "max_lag": 500})  # another max_lag: never merged with "a"
    share = feeds._shares["s"]
    _until_idle(feeds, share)
    assert len(share.carriers) == 2
    yield engine, feeds, share
    feeds._end("s", share)
    engine.close()


def _once_asleep(share, action) -> threading.Thread:
    """Run ``action`` on a thread once the stream's round sleeps on its feeds (its bell is
    set only during that wait), so the wake-up is what the test sees."""
    thread = threading.Thread(target=lambda: (poll_until(lambda: share.bell is not None, 10, "the round to sleep"),
                                              action()), daemon=True)
    thread.start()
    return thread


def test_an_event_ends_the_wait_at_once_and_goes_to_every_carrier(stream):
    engine, feeds, share = stream
    began = time.monotonic()
    appender = _once_asleep(share, lambda: engine.append("r", row(7)))
    got = _messages(feeds, share)
    appender.join()
    assert time.monotonic() - began < 2.5, "the wait ran to its 5 s poll interval"
    updates = [m for m in got if m["kind"] == "updates"]
    assert sorted(sid for m in updates for sid in m["subs"]) == ["a", "b"]


def test_a_caught_up_stream_sleeps_on_its_bell_not_in_its_event_loop(stream):
    engine, feeds, share = stream
    seen = []
    appender = _once_asleep(share, lambda: (seen.append((share.bell, share.loop.is_running())),
                                            engine.append("r", row(7))))
    _messages(feeds, share)
    appender.join()
    bell, loop_running = seen[0]
    assert isinstance(bell, Bell) and bell is share.ringer and not loop_running


def test_a_join_ends_the_wait_and_its_snapshot_follows(stream):
    _engine, feeds, share = stream
    began = time.monotonic()
    joiner = _once_asleep(share, lambda: feeds.join({"stream": "s", "sub": "c"}))
    first = _messages(feeds, share)
    joiner.join()
    assert time.monotonic() - began < 2.5, "the join waited for the poll interval"
    got = first + _messages(feeds, share)
    assert [m["subs"] for m in got if m["kind"] == "snapshot"] == [["c"]]


def test_an_idle_stream_wakes_at_its_poll_interval_and_not_before(tmp_path):
    engine = sediment.open(str(tmp_path / "data"))
    engine.add_relation("r", SCHEMA)
    feeds = shared_feeds.SharedFeeds(_Held(), lambda name, args: engine.subscribe(name), lambda: False, poll=0.05)
    feeds.open("r", {"version": shared_feeds.SHARE_VERSION, "stream": "s", "sub": "a"}, None, "here")
    share = feeds._shares["s"]
    try:
        _until_idle(feeds, share)
        began = time.monotonic()
        for _ in range(10):
            assert _messages(feeds, share) == []
        assert time.monotonic() - began >= 0.45, "an idle round ended before its poll interval (a stale wake-up)"
        engine.append("r", row(1))  # the sleepers the idle rounds left behind do not hold it up
        assert [m["subs"] for m in _messages(feeds, share) if m["kind"] == "updates"] == [["a"]]
    finally:
        feeds._end("s", share)
        engine.close()


def test_a_subscription_the_server_closes_during_the_wait_ends_with_engine_closed(stream):
    _engine, feeds, share = stream
    carrier = share.by_sid["b"]
    began = time.monotonic()
    closer = _once_asleep(share, carrier.sub.close)  # what the stopping server does to every engine subscription
    got = _messages(feeds, share)
    closer.join()
    assert time.monotonic() - began < 2.5
    errors = [m for m in got if m["kind"] == "error"]
    assert [m["subs"] for m in errors] == [["b"]]
    assert isinstance(error_from_detail(errors[0]["error"]), EngineClosed)
    assert "b" not in share.by_sid and "a" in share.by_sid


def test_every_stream_sends_an_update_in_the_same_batches(tmp_path, monkeypatch):
    sent: list[tuple[str, pa.RecordBatch]] = []
    real = shared_feeds.share_message
    monkeypatch.setattr(shared_feeds, "share_message",
                        lambda meta, batch: sent.append((meta["kind"], batch)) or real(meta, batch))
    with served_engine(tmp_path / "data", TOKEN, SCHEMA) as (engine, server, client):
        other = Client(server.uri, TOKEN)  # a second client: a second stream
        try:
            subs = [client.subscribe("r"), other.subscribe("r")]
            for s in subs:
                assert s.next(timeout=10).kind == "snapshot"
            engine.append("r", row(3))
            for s in subs:
                event = s.next(timeout=10)
                while event.kind != "updates":
                    event = s.next(timeout=10)
                assert event.table.column("k").to_pylist() == [3]
        finally:
            other.close()
    batches = [batch for kind, batch in sent if kind == "updates"]
    assert len(batches) == 2 and batches[0] is batches[1], "each stream built the update's message again"
