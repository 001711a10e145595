"""The feed's relay: sleeping subscribers are woken a few at a time, each waking the next,
so no subscriber that times out, stops reading or closes may leave the others asleep; a feed
that ends (its relation dropped, the engine closed) wakes even a subscriber about to sleep; a
subscriber closed asleep leaves the sleepers; and subscribers that catch up over the same
events share one merged event. A record just made durable reaches every subscriber decoded
once, from the engine's memory (subscribers woken together neither read it back from the log
nor each decode their own copy); a record no longer in memory is read from the log, with the
same result."""

from __future__ import annotations

import queue
import threading

import pyarrow as pa
import pytest
from support.waiting import until

from sediment.engine import tail_decode
from sediment.net.remote_subscription import NOTHING, wait_item

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
UPDATES = 300
RECORDS = 40
SUBSCRIBERS = 8


def one_row(i: int) -> pa.Table:
    return pa.table({"k": pa.array([i], pa.int64()), "v": pa.array(["v"], pa.string()),
                     "time": pa.array([i + 1], pa.int64()), "diff": pa.array([1], pa.int64())})


def _subscribed(eng, n: int) -> list:
    """``n`` subscribers of a new sealed relation "r", past their snapshots."""
    eng.add_relation("r", SCHEMA)
    eng.seal("r", 0)
    subs = [eng.subscribe("r") for _ in range(n)]
    assert all(sub.next(timeout=5).kind == "snapshot" for sub in subs)
    return subs


def _read_all(sub, out: list[int], timeout: float | None) -> None:
    """Read every update, with ``next(timeout)`` timing out again and again when given."""
    while len(out) < UPDATES:
        event = sub.next(timeout=timeout)
        if event is not None and event.kind == "updates":
            out.extend(event.table.column("k").to_pylist())


def _read_until_closed(sub, out: list[int]) -> None:
    for event in sub:
        if event.kind == "updates":
            out.extend(event.table.column("k").to_pylist())


def _read_one_then_stop(sub, out: list[int]) -> None:
    """Take the first live update and never call ``next`` again (the subscription stays open)."""
    while not out:
        event = sub.next(timeout=30)
        if event is not None and event.kind == "updates":
            out.extend(event.table.column("k").to_pylist())


def test_subscribers_that_time_out_stop_or_close_never_leave_the_others_asleep(open_engine):
    eng = open_engine()
    subs = _subscribed(eng, 60)
    got: list[list[int]] = [[] for _ in subs]
    roles = ["blocking", "timing out", "stopping", "closing"]
    threads = []
    for n, (sub, out) in enumerate(zip(subs, got, strict=True)):
        role = roles[n % len(roles)]
        if role == "stopping":
            target, args = _read_one_then_stop, (sub, out)
        elif role == "closing":
            target, args = _read_until_closed, (sub, out)
        else:
            target, args = _read_all, (sub, out, 0.001 if role == "timing out" else 30)
        threads.append(threading.Thread(target=target, args=args, daemon=True))
    for th in threads:
        th.start()
    closers = [subs[n] for n in range(len(subs)) if roles[n % len(roles)] == "closing"]
    for i in range(UPDATES):
        eng.append("r", one_row(i))
        if i == UPDATES // 2:
            for sub in closers:  # closed from another thread while they may sleep in the relay
                sub.close()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads)
    for n, out in enumerate(got):
        role = roles[n % len(roles)]
        if role in ("blocking", "timing out"):
            assert out == list(range(UPDATES)), f"subscriber {n} ({role}) missed updates"
        elif role == "stopping":
            assert out and out[0] == 0
        else:
            assert out == list(range(len(out)))  # a prefix, in order, until it was closed
    for sub in subs:
        sub.close()


@pytest.mark.embedded_only  # compares event objects
def test_subscribers_behind_by_the_same_updates_share_one_merged_event(open_engine):
    eng = open_engine()
    subs = _subscribed(eng, 3)
    for i in range(20):
        eng.append("r", one_row(i))
    events = [sub.next(timeout=5) for sub in subs]
    assert events[0].kind == "updates" and events[0].table.column("k").to_pylist() == list(range(20))
    assert all(e is events[0] for e in events)
    made = []
    assert [e.encoded("wire", lambda: made.append(1) or "batches") for e in events] == ["batches"] * 3
    assert made == [1]
    for sub in subs:
        sub.close()


def _decoded_together(monkeypatch) -> list[int]:
    """The records a subscriber catching up decoded together, one count a decoded run."""
    runs: list[int] = []
    real = tail_decode._run_each

    def counted(*args, **kwargs):
        got = real(*args, **kwargs)
        runs.append(len(got) if got is not None else 0)
        return got

    monkeypatch.setattr(tail_decode, "_run_each", counted)
    return runs


def _counting(obj, name: str, calls: list[int] | None = None) -> list[int]:
    """Count the calls of ``obj.name`` (the call itself runs as before) in ``calls``."""
    calls = [] if calls is None else calls
    real = getattr(obj, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    setattr(obj, name, counted)
    return calls


def _read_events(sub, out: list, rows: int = RECORDS) -> None:
    while sum(e.table.num_rows for e in out) < rows:
        event = sub.next(timeout=30)
        assert event is not None, "the feed stalled"
        if event.kind == "updates":
            out.append(event)


@pytest.mark.embedded_only  # counts the engine's log reads and decodes
def test_subscribers_woken_together_share_one_decode_from_memory(open_engine, monkeypatch):
    eng = open_engine()
    subs = _subscribed(eng, SUBSCRIBERS)
    log_reads = _counting(eng.reads.log, "read", _counting(eng.reads.log, "read_many"))
    decodes = _counting(eng.view.get("r"), "decode_body")
    joined = _decoded_together(monkeypatch)
    got: list[list] = [[] for _ in subs]
    threads = [threading.Thread(target=_read_events, args=(sub, out), daemon=True) for sub, out in zip(subs, got, strict=True)]
    for th in threads:
        th.start()
    for i in range(RECORDS):
        eng.append("r", one_row(i))
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads)
    for out in got:
        assert pa.concat_tables([e.table for e in out]).column("k").to_pylist() == list(range(RECORDS))
    assert log_reads == [], "a record just made durable was read back from the log"
    decoded = len(decodes) + sum(joined)
    assert decoded == RECORDS, f"{decoded} decodes of {RECORDS} records for {SUBSCRIBERS} subscribers"
    for sub in subs:
        sub.close()


@pytest.mark.embedded_only  # empties the engine's memory of record bodies
def test_a_record_no_longer_in_memory_is_read_from_the_log(open_engine):
    eng = open_engine()
    [sub] = _subscribed(eng, 1)
    log_reads = _counting(eng.reads.log, "read", _counting(eng.reads.log, "read_many"))
    for i in range(5):
        eng.append("r", one_row(i))
    eng.view.bodies.drop_below(1 << 62)
    out: list = []
    _read_events(sub, out, 5)
    assert pa.concat_tables([e.table for e in out]).to_pydict() == pa.concat_tables(
        [one_row(i) for i in range(5)]).to_pydict()
    assert log_reads, "the records were not read from the log"
    sub.close()



@pytest.mark.embedded_only
def test_readers_with_timeouts_on_an_idle_feed_do_not_pile_up_among_the_sleepers(open_engine):
    eng = open_engine()
    subs = _subscribed(eng, 4)
    for _ in range(50):
        for sub in subs:
            assert sub.next(timeout=0.001) is None
            assert sub.next(timeout=0) is None
    feed = eng.view.relations["r"].feed
    assert len(feed.waiting) <= len(subs), f"{len(feed.waiting)} sleeper entries after 400 timed-out reads"
    eng.append("r", one_row(7))  # and each still reads the next update
    assert [sub.next(timeout=10).table.column("k").to_pylist() for sub in subs] == [[7]] * 4
    for sub in subs:
        sub.close()


def test_a_zero_timeout_on_the_main_thread_takes_what_is_queued():
    assert threading.current_thread() is threading.main_thread()
    events: queue.SimpleQueue = queue.SimpleQueue()
    events.put("event")
    assert wait_item(events, 0, lambda: False) == "event"
    assert wait_item(events, 0, lambda: False) is NOTHING


def _asleep_in_turn(subs: list, got: list[list]) -> list[threading.Thread]:
    """A thread per subscriber reading its next event into ``got`` (waiting for it with no
    timeout, which would end a stalled relay's wait), each started once the one before
    sleeps in the feed (so the relay wakes them in this order)."""
    threads = []
    for sub, out in zip(subs, got, strict=True):
        def read(sub=sub, out=out) -> None:
            try:
                out.append(sub.next())
            except Exception as exc:  # noqa: BLE001 - the test looks at what was raised
                out.append(exc)
        threads.append(threading.Thread(target=read, daemon=True))
        threads[-1].start()
        assert until(lambda sub=sub: sub.sleeping), "a subscriber never went to sleep"
    return threads




def _steps(feed, subs: list, monkeypatch) -> list[tuple[int, str]]:
    """(subscriber id, "take" or "hand on"), in the order the subscribers' threads did them."""
    steps: list[tuple[int, str]] = []
    real_settle = feed.settle

    def settle(sub, forget=False):
        steps.append((sub.id, "hand on"))
        return real_settle(sub, forget)

    monkeypatch.setattr(feed, "settle", settle)
    for sub in subs:
        def take(items, i, sub=sub, real=sub._take):
            steps.append((sub.id, "take"))
            return real(items, i)
        monkeypatch.setattr(sub, "_take", take)
    return steps


def _watched(open_engine, monkeypatch, n: int = 4) -> tuple:
    """An engine with ``n`` subscribers asleep in turn, each in a thread reading one event into
    its list of ``got``, and the ``steps`` their threads take: (engine, subs, feed, got,
    threads, steps)."""
    eng = open_engine()
    subs = _subscribed(eng, n)
    feed = eng.view.relations["r"].feed
    got: list[list] = [[] for _ in subs]
    threads = _asleep_in_turn(subs, got)
    return eng, subs, feed, got, threads, _steps(feed, subs, monkeypatch)


@pytest.mark.embedded_only  # watches the feed's relay from inside
@pytest.mark.parametrize("behind", ["near the head", "far behind"])
def test_a_woken_subscriber_takes_its_event_before_waking_the_next_unless_far_behind(open_engine, monkeypatch,
                                                                                      behind):
    from sediment.engine import feed as feed_mod

    if behind == "far behind":
        monkeypatch.setattr(feed_mod, "_TAKE_FIRST", 0)
    eng, subs, feed, got, threads, steps = _watched(open_engine, monkeypatch)
    eng.append("r", one_row(5))
    for th in threads:
        th.join(timeout=10)
    assert not any(th.is_alive() for th in threads), "the relay left a subscriber asleep"
    assert [out[0].table.column("k").to_pylist() for out in got] == [[5]] * 4
    for sub in subs:
        mine = [step for sub_id, step in steps if sub_id == sub.id]
        expected = ["take", "hand on"] if behind == "near the head" else ["hand on", "take"]
        assert mine == expected, f"subscriber {sub.id} ({behind}): {mine}"
    for sub in subs:
        sub.close()


@pytest.mark.embedded_only  # breaks one subscriber's take
def test_a_take_that_fails_still_wakes_the_next_sleeper(open_engine, monkeypatch):
    from sediment.engine import feed as feed_mod

    monkeypatch.setattr(feed_mod, "_CHAINS", 1)  # one chain: a lost hand-on would leave the rest asleep
    eng = open_engine()
    subs = _subscribed(eng, 4)

    def broken(items, i):
        raise RuntimeError("this take fails")

    monkeypatch.setattr(subs[0], "_take", broken)
    got: list[list] = [[] for _ in subs]
    threads = _asleep_in_turn(subs, got)  # the failing one sleeps first: the relay wakes it first
    eng.append("r", one_row(9))
    for th in threads:
        th.join(timeout=10)
    stalled = sum(th.is_alive() for th in threads)
    if stalled:
        for sub in subs:
            sub.close()
    assert not stalled, f"the relay stopped at the failed take: {stalled} subscribers still asleep"
    assert isinstance(got[0][0], RuntimeError)
    assert [out[0].table.column("k").to_pylist() for out in got[1:]] == [[9]] * 3
    for sub in subs:
        sub.close()


@pytest.mark.embedded_only  # holds a subscriber between its look and its sleep
@pytest.mark.parametrize("end", ["relation dropped", "engine closed"])
def test_a_feed_ended_between_a_look_and_the_sleep_wakes_the_subscriber(open_engine, monkeypatch, end):
    from sediment.errors import EngineClosed, UnknownRelation

    eng = open_engine()
    [sub] = _subscribed(eng, 1)
    looked, ended = threading.Event(), threading.Event()
    real_poll = sub._poll

    def poll(feed):
        got = real_poll(feed)
        if got is False and not looked.is_set():  # it saw no event: end the feed before it joins the sleepers
            looked.set()
            assert ended.wait(10)
        return got

    monkeypatch.setattr(sub, "_poll", poll)
    out: list = []

    def read() -> None:
        try:
            out.append(sub.next())  # no timeout: only the end of the feed can end this wait
        except Exception as exc:  # noqa: BLE001 - the test looks at what was raised
            out.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert looked.wait(10)
    if end == "relation dropped":
        eng.drop_relation("r")
    else:
        eng.close()
    ended.set()
    reader.join(timeout=10)
    stalled = reader.is_alive()
    if stalled:
        sub.close()
    assert not stalled, f"the subscriber slept on after the feed ended ({end})"
    assert isinstance(out[0], UnknownRelation if end == "relation dropped" else EngineClosed)


@pytest.mark.embedded_only
def test_subscribers_closed_while_asleep_on_an_idle_feed_do_not_pile_up_among_the_sleepers(open_engine):
    eng = open_engine()
    [keeper] = _subscribed(eng, 1)  # keeps the feed's sleepers alive between the others
    feed = eng.view.relations["r"].feed
    for _ in range(40):
        sub = eng.subscribe("r")
        assert sub.next(timeout=5).kind == "snapshot"
        [reader] = _asleep_in_turn([sub], [[]])
        sub.close()  # from another thread: its next() returns None
        reader.join(timeout=10)
        assert not reader.is_alive()
    assert len(feed.waiting) <= 1, f"{len(feed.waiting)} sleeper entries after 40 subscribers were closed asleep"
    eng.append("r", one_row(3))  # and the one left still reads the next update
    assert keeper.next(timeout=10).table.column("k").to_pylist() == [3]
    keeper.close()


@pytest.mark.embedded_only  # holds the feed's decode lock as a subscriber far behind would
def test_a_woken_subscriber_wakes_the_next_first_while_one_far_behind_decodes(open_engine, monkeypatch):
    eng, subs, feed, got, threads, steps = _watched(open_engine, monkeypatch)
    with feed._load_lock:  # a long decode under way: each woken subscriber will wait for it
        feed.long_decode = True
        eng.append("r", one_row(3))
        woke_all = until(lambda: sum(step == "take" for _id, step in steps) == len(subs))
        feed.long_decode = False
    for th in threads:
        th.join(timeout=10)
    assert woke_all, f"a subscriber held its chain while it waited for the decode: {steps}"
    assert [out[0].table.column("k").to_pylist() for out in got] == [[3]] * 4
    for sub in subs:
        assert [step for sub_id, step in steps if sub_id == sub.id] == ["hand on", "take"]
        sub.close()
