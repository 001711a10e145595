"""A server's shared streams over the engine's feed: the bell a stream's thread sleeps on
(engine/feed_bells.py), rung by the feed's writer (which also drops laggards), a close or
the engine's close; and a stream that is behind sending the updates it takes at once (up
to RUN_PARTS) as one message of their records' own IPC parts, each made once for every
stream (``Subscription.next_run``, sediment/net/shared_feeds.py ``_Run``), a longer run as
one table. Real engine; the stream driven round by round."""

from __future__ import annotations

import json
import threading

import pyarrow as pa
import pytest

import sediment
from sediment.engine.feed_bells import Bell
from sediment.net import shared_feeds
from sediment.net.shared_subscription import decode_event

SCHEMA = pa.schema([("k", pa.int64())])


def row(k: int) -> pa.Table:
    return pa.table({"k": pa.array([k], pa.int64()), "time": pa.array([k + 1], pa.int64()),
                     "diff": pa.array([1], pa.int64())})


@pytest.fixture
def engine(tmp_path):
    eng = sediment.open(str(tmp_path / "data"))
    eng.add_relation("r", SCHEMA)
    eng.seal("r", 0)
    yield eng
    eng.close()


def _caught_up(sub) -> None:
    while sub.next(timeout=0) is not None:
        pass


def _rung_by(bell: Bell, action) -> bool:
    """Whether ``action``, run on another thread, ends a wait on ``bell`` (the wait is long
    enough that only a ring ends it within the test's run)."""
    bell.arm()
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    rung = bell.wait(30)
    thread.join()
    return rung


@pytest.mark.parametrize("what", ["append", "close", "engine close"])
def test_a_bell_hung_on_a_subscription_is_rung_by_its_feed(engine, what):
    sub = engine.subscribe("r")
    _caught_up(sub)
    bell = Bell()
    sub.hang(bell)
    action = {"append": lambda: engine.append("r", row(1)), "close": sub.close, "engine close": engine.close}[what]
    assert _rung_by(bell, action), f"a {what} did not ring the bell"


def test_a_bell_rung_before_the_wait_ends_it_at_once_and_arm_forgets_it():
    bell = Bell()
    bell.ring()
    bell.ring()  # twice: no error, one wake-up
    assert bell.wait(10)
    assert not bell.wait(0.01)
    bell.ring()
    bell.arm()
    assert not bell.wait(0.01), "arm kept a ring from before it"


def test_a_subscriber_behind_takes_its_records_own_events_shared_with_the_others(engine):
    a, b, merged = engine.subscribe("r"), engine.subscribe("r"), engine.subscribe("r")
    for sub in (a, b, merged):
        _caught_up(sub)
    for k in range(3):
        engine.append("r", row(k))
    run_a, run_b = a.next_run(), b.next_run()
    assert [e.table.column("k").to_pylist() for e in run_a] == [[0], [1], [2]]
    assert all(x is y for x, y in zip(run_a, run_b, strict=True)), "each took its own copy of a record"
    assert a.next_run() is None and a.lag == 0
    assert merged.next(timeout=0).records == 3, "next() no longer merges what next_run gives apart"


class _Held:
    def track(self, sub, where: str) -> None:
        pass

    def release(self, sub) -> None:
        sub.close()


def test_a_stream_behind_sends_the_updates_it_took_as_one_message_of_their_shared_parts(engine):
    subscribe = lambda name, args: engine.subscribe(name, args.get("as_of"))  # noqa: E731
    feeds = shared_feeds.SharedFeeds(_Held(), subscribe, lambda: False, poll=5.0)
    feeds.open("r", {"version": shared_feeds.SHARE_VERSION, "stream": "s", "sub": "a"}, None, "here")
    share = feeds._shares["s"]
    witness = engine.subscribe("r")
    try:
        _caught_up(witness)
        while feeds._take_each(share, list(share.carriers)):
            pass
        for k in range(3):
            engine.append("r", row(k))
        sent = list(feeds._round(share))
        assert len(sent) == 1, "a stream behind sent a message per update"
        batch, raw = sent[0]
        meta = json.loads(raw)
        assert (meta["kind"], meta["subs"], meta["records"]) == ("updates", ["a"], 3)
        assert batch.num_rows == 3
        records = witness.next_run()
        assert [bytes(p.as_py()) for p in batch.column(0)] == \
            [part for e in records for part in shared_feeds.event_ipc(e)], "the run's parts were encoded again"
        event = decode_event(meta, [batch])
        assert (event.kind, event.time, event.records) == ("updates", 1, 3)
        assert event.table.column("k").to_pylist() == [0, 1, 2]
    finally:
        feeds._end("s", share)


def test_a_longer_run_goes_as_one_table_each_client_decodes_once(engine):
    subscribe = lambda name, args: engine.subscribe(name, args.get("as_of"))  # noqa: E731
    feeds = shared_feeds.SharedFeeds(_Held(), subscribe, lambda: False, poll=5.0)
    feeds.open("r", {"version": shared_feeds.SHARE_VERSION, "stream": "s", "sub": "a"}, None, "here")
    share = feeds._shares["s"]
    try:
        while feeds._take_each(share, list(share.carriers)):
            pass
        n = shared_feeds.RUN_PARTS + 2
        for k in range(n):
            engine.append("r", row(k))
        (batch, raw), = list(feeds._round(share))
        meta = json.loads(raw)
        assert (batch.num_rows, meta["records"]) == (1, n), "a long catch-up went as a part per record"
        assert decode_event(meta, [batch]).table.column("k").to_pylist() == list(range(n))
    finally:
        feeds._end("s", share)


def test_parts_go_together_up_to_the_message_bound_and_a_larger_one_alone():
    small, big = b"x" * 100, b"y" * (shared_feeds.MESSAGE_BYTES + 1)
    batches = shared_feeds.share_batches([small, small, big, small])
    assert [b.num_rows for b in batches] == [2, 1, 1]
    assert [b.num_rows for b in shared_feeds.share_batches([])] == [0], "a progress event is one empty batch"
