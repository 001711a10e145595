"""Subscriptions read from asyncio (``async for event in sub``, ``await sub.next_async(t)``):
many subscriptions in one event loop, each getting every update exactly once and in the
feed's order, beside thread subscribers of the same relation; overrun, engine close, close
from another thread, timeouts and cancellation end or leave a waiting task as the thread
API does; and a loop that ends without closing its subscriptions holds up no one."""

from __future__ import annotations

import asyncio
import threading

import pyarrow as pa
import pytest
from support.event_loops import async_keys, cancel_reads, in_loop, thread_keys

from sediment import errors
from sediment.clock import ManualClock

pytestmark = pytest.mark.embedded_only  # the async reads are the engine's own Subscription

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])


def rows(keys: list[int]) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.int64()), "v": pa.array(["v"] * len(keys), pa.string()),
                     "time": pa.array([1 + k for k in keys], pa.int64()),
                     "diff": pa.array([1] * len(keys), pa.int64())})


def _relation(eng) -> None:
    eng.add_relation("r", SCHEMA)
    eng.seal("r", 0)


def test_many_async_and_thread_subscribers_get_every_update_once_in_the_same_order(open_engine):
    eng = open_engine()
    _relation(eng)
    writers, per_writer, n = 4, 60, 4 * 60
    async_subs = [eng.subscribe("r") for _ in range(150)]
    thread_subs = [eng.subscribe("r") for _ in range(4)]
    for sub in thread_subs:
        assert sub.next(timeout=5).kind == "snapshot"

    async def read_all() -> list[list[int]]:
        firsts = [await sub.next_async(timeout=5) for sub in async_subs]
        assert all(e.kind == "snapshot" for e in firsts)
        return await asyncio.gather(*(async_keys(sub, n) for sub in async_subs))

    loop_thread, result = in_loop(read_all())
    threads_got: list[list[int]] = [[] for _ in thread_subs]
    readers = [threading.Thread(target=thread_keys, args=(s, n, out)) for s, out in zip(thread_subs, threads_got, strict=True)]
    appenders = [threading.Thread(target=lambda w=w: [eng.append("r", rows([w * per_writer + i]))
                                                      for i in range(per_writer)]) for w in range(writers)]
    for th in readers + appenders:
        th.start()
    for th in readers + appenders + [loop_thread]:
        th.join(timeout=120)
    assert "error" not in result, result.get("error")
    order = threads_got[0]
    assert sorted(order) == list(range(n)), "an update missing or repeated"
    assert all(got == order for got in threads_got)
    assert len(result["result"]) == len(async_subs)
    assert all(got == order for got in result["result"]), "an async subscriber saw another order"
    for sub in async_subs + thread_subs:
        sub.close()


def test_a_change_reaches_every_async_subscriber_as_one_shared_event(open_engine):
    eng = open_engine()
    _relation(eng)
    subs = [eng.subscribe("r") for _ in range(20)]

    async def read() -> list:
        for sub in subs:
            assert (await sub.next_async(timeout=5)).kind == "snapshot"
        waiting = [asyncio.ensure_future(sub.next_async(timeout=30)) for sub in subs]
        await asyncio.sleep(0)  # every task reaches its wait before the append
        ready.set()
        return await asyncio.gather(*waiting)

    ready = threading.Event()
    th, result = in_loop(read())
    assert ready.wait(30)
    eng.append("r", rows([7]))
    th.join(timeout=30)
    events = result["result"]
    assert events[0].table.column("k").to_pylist() == [7]
    assert all(e is events[0] for e in events)
    for sub in subs:
        sub.close()


def test_an_async_subscriber_past_its_bound_gets_feed_overrun(open_engine):
    eng = open_engine(clock=ManualClock())
    _relation(eng)
    stalled = eng.subscribe("r", max_lag=500)

    async def first() -> str:
        return (await stalled.next_async(timeout=5)).kind

    assert asyncio.run(first()) == "snapshot"
    for i in range(0, 3000, 1):
        eng.append("r", rows([i]))

    async def drain() -> None:
        while await stalled.next_async(timeout=1) is not None:
            pass

    with pytest.raises(errors.FeedOverrun, match="dropped this subscriber"):
        asyncio.run(drain())
    stalled.close()


def test_engine_close_ends_a_waiting_task_and_close_ends_another(open_engine):
    eng = open_engine()
    _relation(eng)
    closed_by_engine, closed_by_user = eng.subscribe("r"), eng.subscribe("r")
    waiting = threading.Event()

    async def wait_both() -> tuple:
        for sub in (closed_by_engine, closed_by_user):
            await sub.next_async(timeout=5)
        tasks = [asyncio.ensure_future(closed_by_engine.next_async()), asyncio.ensure_future(async_keys(closed_by_user, 1))]
        await asyncio.sleep(0)
        waiting.set()
        return tuple(await asyncio.gather(*tasks, return_exceptions=True))

    th, result = in_loop(wait_both())
    assert waiting.wait(30)
    closed_by_user.close()  # from another thread: its `async for` ends
    eng.close()
    th.join(timeout=30)
    assert not th.is_alive(), "a waiting task hung"
    engine_end, user_end = result["result"]
    assert isinstance(engine_end, errors.EngineClosed)
    assert user_end == []


def test_a_cancelled_wait_leaves_the_subscription_usable_and_a_timeout_returns_none(open_engine):
    eng = open_engine()
    _relation(eng)
    sub = eng.subscribe("r")
    started = threading.Event()

    async def cancel_then_read() -> tuple:
        assert (await sub.next_async(timeout=5)).kind == "snapshot"
        assert await sub.next_async(timeout=0.05) is None
        await cancel_reads(sub)
        again = asyncio.ensure_future(sub.next_async(timeout=30))
        await asyncio.sleep(0)
        started.set()
        return await again, sub.lag

    th, result = in_loop(cancel_then_read())
    assert started.wait(30)
    eng.append("r", rows([3]))
    th.join(timeout=30)
    event, lag = result["result"]
    assert event.table.column("k").to_pylist() == [3] and lag == 0
    sub.close()


def test_a_loop_that_ends_without_closing_its_subscriptions_holds_up_no_one(open_engine):
    eng = open_engine()
    _relation(eng)
    abandoned = [eng.subscribe("r") for _ in range(10)]
    live = eng.subscribe("r")
    assert live.next(timeout=5).kind == "snapshot"

    async def read_one() -> list[list[int]]:
        got = await asyncio.gather(*(async_keys(sub, 1) for sub in abandoned))
        for sub in abandoned:  # left waiting: asyncio.run cancels them and closes the loop
            asyncio.ensure_future(sub.next_async())
        await asyncio.sleep(0)
        return got

    th, result = in_loop(read_one())
    eng.append("r", rows([0]))
    th.join(timeout=30)
    assert result["result"] == [[0]] * 10  # the loop is now closed, its subscriptions open
    got: list[int] = []
    reader = threading.Thread(target=thread_keys, args=(live, 100, got))
    reader.start()
    for i in range(1, 100):
        eng.append("r", rows([i]))
    reader.join(timeout=60)
    assert got == list(range(100))
    assert len(eng.view.relations["r"].feed.loops) == 0, "the closed loop is still woken"
    for sub in abandoned + [live]:
        sub.close()


def test_the_writer_wakes_a_loop_at_most_once_per_append_whatever_its_subscribers(open_engine):
    eng = open_engine()
    _relation(eng)
    subs = [eng.subscribe("r") for _ in range(200)]
    appends, wakes, ready = 50, [], threading.Event()

    async def read_all() -> list[list[int]]:
        loop = asyncio.get_running_loop()
        real = loop.call_soon_threadsafe

        def counted(*args, **kwargs):  # counts the writer's wake-ups of this loop; each runs as before
            wakes.append(1)
            return real(*args, **kwargs)

        loop.call_soon_threadsafe = counted
        for sub in subs:
            await sub.next_async(timeout=5)
        tasks = [asyncio.ensure_future(async_keys(sub, appends)) for sub in subs]
        await asyncio.sleep(0)
        ready.set()
        return await asyncio.gather(*tasks)

    th, result = in_loop(read_all())
    assert ready.wait(30)
    for i in range(appends):
        eng.append("r", rows([i]))
    th.join(timeout=60)
    assert result["result"] == [list(range(appends))] * len(subs)
    assert 1 <= len(wakes) <= appends, f"{len(wakes)} wake-ups of the loop for {appends} appends"
    for sub in subs:
        sub.close()


def test_timed_out_and_cancelled_reads_on_a_quiet_feed_leave_no_pile_of_waits(open_engine):
    eng = open_engine()
    _relation(eng)
    sub = eng.subscribe("r")

    async def idle_reads() -> list[int]:
        while await sub.next_async(timeout=0) is not None:  # the snapshot and what follows it
            pass
        for _ in range(2000):
            assert await sub.next_async(timeout=0) is None
        after_timeouts = len(sub.seat.current.asleep) if sub.seat.current is not None else 0
        for _ in range(300):
            assert await sub.next_async(timeout=0.0001) is None
        await cancel_reads(sub, 300)
        return [after_timeouts, len(sub.seat.current.asleep)]

    th, out = in_loop(idle_reads())
    th.join(timeout=60)
    assert "error" not in out, out.get("error")
    after_timeouts, after_all = out["result"]
    assert after_timeouts <= 1, f"{after_timeouts} waits kept after 2,000 reads that timed out at once"
    assert after_all <= 2 * 1 + 17, f"{after_all} waits kept after 600 timed-out or cancelled reads"
    eng.append("r", rows([1]))  # still readable after all that
    assert sub.next(timeout=10).table.column("k").to_pylist() == [1]
    sub.close()


def test_a_closed_loop_is_let_go_once_its_subscriber_is_dropped(open_engine):
    eng = open_engine()
    _relation(eng)
    sub = eng.subscribe("r", max_lag=50)

    async def one_update() -> str:
        await sub.next_async(timeout=5)  # the snapshot
        task = asyncio.ensure_future(sub.next_async())
        await asyncio.sleep(0)
        await asyncio.get_running_loop().run_in_executor(None, eng.append, "r", rows([1]))
        return (await task).kind

    th, out = in_loop(one_update())
    th.join(timeout=60)
    assert out.get("result") == "updates", out
    for k in range(2, 3000):  # the loop is closed, nothing sleeps in it; the subscriber falls behind and is dropped
        eng.append("r", rows([k]))
    assert sub.dropped_at is not None
    assert len(eng.view.relations["r"].feed.loops) == 0, "a closed loop is kept by the feed"
    sub.close()


def test_dropping_the_relation_ends_its_subscriptions_with_unknown_relation(open_engine):
    """A feed whose relation is dropped gets no more events: a thread already waiting, a task
    already waiting and a later read all raise UnknownRelation instead of waiting for ever,
    and a relation of the same name added after has a feed of its own."""
    eng = open_engine()
    _relation(eng)
    in_thread, in_task, later = eng.subscribe("r"), eng.subscribe("r"), eng.subscribe("r")
    for sub in (in_thread, later):
        assert sub.next(timeout=5).kind == "snapshot"
    waiting, thread_end = threading.Event(), {}

    def read_in_thread() -> None:
        waiting.set()
        try:
            thread_end["got"] = in_thread.next(timeout=30)
        except errors.SedimentError as exc:
            thread_end["got"] = exc

    async def read_in_task() -> object:
        await in_task.next_async(timeout=5)  # the snapshot
        task = asyncio.ensure_future(in_task.next_async(timeout=30))
        await asyncio.sleep(0)
        waiting_task.set()
        return await asyncio.gather(task, return_exceptions=True)

    waiting_task = threading.Event()
    reader = threading.Thread(target=read_in_thread)
    reader.start()
    th, result = in_loop(read_in_task())
    assert waiting.wait(30) and waiting_task.wait(30)
    eng.drop_relation("r")
    reader.join(timeout=30)
    th.join(timeout=30)
    assert not reader.is_alive() and not th.is_alive(), "a read of a dropped relation's feed hung"
    for end in (thread_end["got"], result["result"][0]):
        assert isinstance(end, errors.UnknownRelation) and "'r' was dropped" in str(end), end
    with pytest.raises(errors.UnknownRelation):
        later.next(timeout=30)
    _relation(eng)
    fresh = eng.subscribe("r")
    assert fresh.next(timeout=5).kind == "snapshot"
    eng.append("r", rows([4]))
    keys: list[int] = []
    thread_keys(fresh, 1, keys)
    assert keys == [4]
    for sub in (in_thread, in_task, later, fresh):
        sub.close()
