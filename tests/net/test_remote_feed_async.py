"""Remote subscriptions read from asyncio (sediment/net/async_reads.py): ``async for event in
sub`` and ``await sub.next_async(timeout)`` on what ``sediment.connect(...).subscribe``
returns, shared streams and ``shared=False`` alike. Many tasks of one loop over several
relations get every update once and in the feed's order while writers append; the stream's
reading thread wakes the loop once per event, not once per subscription; overrun, timeouts,
cancellation, a close from another thread, a loop that ends with its subscriptions open, a
stopping server and a SIGKILLed ``sediment serve`` behave as the thread API does. Real
SedimentFlightServer, real engine, real gRPC on 127.0.0.1."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable

import pyarrow as pa
import pytest
from support.event_loops import async_keys, cancel_reads, in_loop, thread_keys
from support.served import Served, served_engine

from sediment.client import Client
from sediment.errors import CoordinatorUnavailable, EngineClosed, FeedOverrun
from sediment.net.remote_subscription import CHECK_EVERY, RemoteSubscription
from sediment.net.shared_subscription import SharedSubscription

SCHEMA = pa.schema([("k", pa.int64())])
TOKEN = "async-" + uuid.uuid4().hex
RELATIONS = ("r", "s", "u")


def row(k: int, t: int | None = None) -> pa.Table:
    return pa.table({"k": pa.array([k], pa.int64()), "time": pa.array([k + 1 if t is None else t], pa.int64()),
                     "diff": pa.array([1], pa.int64())})


@pytest.fixture
def served(tmp_path):
    with served_engine(tmp_path / "data", TOKEN, SCHEMA) as (engine, server, client):
        for name in RELATIONS[1:]:
            engine.add_relation(name, SCHEMA)
            engine.seal(name, 0)
        yield engine, server, client


def finished(th: threading.Thread, out: dict, timeout: float = 120) -> object:
    th.join(timeout=timeout)
    assert not th.is_alive(), "a task reading a remote subscription hung"
    assert "error" not in out, out.get("error")
    return out["result"]


async def past_snapshots(subs: list) -> None:
    for sub in subs:
        assert (await sub.next_async(timeout=10)).kind == "snapshot"


@pytest.mark.parametrize("shared", [True, False])
def test_many_async_subscriptions_over_several_relations_get_every_update_once_in_order(served, shared):
    engine, _server, client = served
    per_relation, writers, per_writer = (40, 2, 40) if shared else (6, 2, 40)
    n = writers * per_writer
    subs = {name: [client.subscribe(name, shared=shared) for _ in range(per_relation)] for name in RELATIONS}
    assert all(isinstance(s, SharedSubscription if shared else RemoteSubscription)
               for group in subs.values() for s in group)
    thread_subs = {name: client.subscribe(name, shared=shared) for name in RELATIONS}
    for sub in thread_subs.values():
        assert sub.next(timeout=10).kind == "snapshot"
    wakes: list[int] = []
    ready = threading.Event()

    async def read_all() -> dict[str, list[list[int]]]:
        loop = asyncio.get_running_loop()
        real = loop.call_soon_threadsafe

        def counted(*args, **kwargs):  # counts the reading threads' wake-ups of this loop; each runs as before
            wakes.append(1)
            return real(*args, **kwargs)

        loop.call_soon_threadsafe = counted
        for group in subs.values():
            await past_snapshots(group)
        tasks = {name: [asyncio.ensure_future(async_keys(s, n)) for s in group] for name, group in subs.items()}
        await asyncio.sleep(0)
        ready.set()
        return {name: list(await asyncio.gather(*group)) for name, group in tasks.items()}

    th, out = in_loop(read_all())
    assert ready.wait(60)
    by_threads = {name: [] for name in RELATIONS}
    readers = [threading.Thread(target=thread_keys, args=(thread_subs[name], n, by_threads[name]))
               for name in RELATIONS]
    appenders = [threading.Thread(target=lambda name=name, w=w: [engine.append(name, row(w * per_writer + i))
                                                                 for i in range(per_writer)])
                 for name in RELATIONS for w in range(writers)]
    for t in readers + appenders:
        t.start()
    got = finished(th, out)
    for t in readers + appenders:
        t.join(timeout=60)
    for name in RELATIONS:
        order = by_threads[name]
        assert sorted(order) == list(range(n)), f"{name}: an update missing or repeated"
        for w in range(writers):
            mine = [k for k in order if k // per_writer == w]
            assert mine == sorted(mine), f"{name}: a writer's updates out of its order"
        assert got[name] == [order] * per_relation, f"{name}: an async subscription saw other updates or order"
    if shared:  # a wake-up per subscription and event would be 40 per append
        assert len(wakes) <= 2 * len(RELATIONS) * n, f"{len(wakes)} wake-ups of the loop for {len(RELATIONS) * n} appends"
    for group in [*subs.values(), list(thread_subs.values())]:
        for sub in group:
            sub.close()


@pytest.mark.parametrize("shared", [True, False])
def test_an_async_subscription_past_its_max_lag_is_dropped_and_the_others_go_on(served, shared):
    engine, _server, client = served
    idle, busy = client.subscribe("r", max_lag=3, shared=shared), client.subscribe("r", shared=shared)
    # a progress after each update: a server behind merges consecutive updates only, so the
    # client sees at least CHECK_EVERY live events and checks idle's lag at least once
    more = CHECK_EVERY + 8

    def append_and_seal() -> None:
        for k in range(more):
            engine.append("r", row(k, k + 2))
            engine.seal("r", k + 2)

    async def read() -> list[int]:
        await past_snapshots([idle, busy])
        await asyncio.get_running_loop().run_in_executor(None, engine.seal, "r", 1)
        for sub in (idle, busy):
            assert (await sub.next_async(timeout=10)).kind == "progress"
        await asyncio.get_running_loop().run_in_executor(None, append_and_seal)
        got = await async_keys(busy, more)
        with pytest.raises(FeedOverrun, match="dropped this subscri"):
            while True:
                assert await idle.next_async(timeout=10) is not None
        with pytest.raises(FeedOverrun):  # it stays dropped
            await idle.next_async(timeout=1)
        await asyncio.get_running_loop().run_in_executor(None, engine.append, "r", row(more, more + 2))
        return got + await async_keys(busy, 1)

    assert finished(*in_loop(read())) == list(range(more + 1))
    idle.close()
    busy.close()


@pytest.mark.parametrize("shared", [True, False])
def test_a_timeout_returns_none_and_a_cancelled_wait_leaves_the_subscription_usable(served, shared):
    engine, _server, client = served
    sub = client.subscribe("r", shared=shared)
    started = threading.Event()

    async def timeouts_then_cancel() -> tuple:
        await past_snapshots([sub])
        while await sub.next_async(timeout=0.5) is not None:  # what follows the snapshot
            pass
        began = time.monotonic()
        assert await sub.next_async(timeout=0.05) is None
        waited = time.monotonic() - began
        assert await sub.next_async(timeout=0) is None
        await cancel_reads(sub, 50)
        again = asyncio.ensure_future(sub.next_async(timeout=30))
        await asyncio.sleep(0)
        started.set()
        return waited, await again

    th, out = in_loop(timeouts_then_cancel())
    assert started.wait(60)
    engine.append("r", row(3))
    waited, event = finished(th, out)
    assert 0.04 <= waited < 5
    assert event.kind == "updates" and event.table.column("k").to_pylist() == [3]
    engine.append("r", row(4))
    assert sub.next(timeout=10).table.column("k").to_pylist() == [4], "a thread cannot read it after the loop"
    sub.close()


@pytest.mark.parametrize("shared", [True, False])
def test_a_close_from_another_thread_ends_a_waiting_async_for(served, shared):
    engine, _server, client = served
    closed, other = client.subscribe("r", shared=shared), client.subscribe("r", shared=shared)
    waiting = threading.Event()

    async def wait_both() -> tuple:
        await past_snapshots([closed, other])
        ending = asyncio.ensure_future(async_keys(closed, 1))
        going = asyncio.ensure_future(async_keys(other, 1))
        await asyncio.sleep(0)
        waiting.set()
        return await ending, await going

    th, out = in_loop(wait_both())
    assert waiting.wait(60)
    closed.close()
    engine.append("r", row(0))
    ended, went = finished(th, out, timeout=60)
    assert ended == [], "the closed subscription's async for did not end empty"
    assert went == [0], "the close ended another subscription"
    assert closed.next(timeout=0.1) is None
    other.close()


@pytest.mark.parametrize("shared", [True, False])
def test_a_loop_that_ends_with_its_subscriptions_open_holds_up_no_one(served, shared):
    engine, _server, client = served
    abandoned = [client.subscribe("r", shared=shared) for _ in range(10)]
    live = client.subscribe("r")
    assert live.next(timeout=10).kind == "snapshot"

    async def read_one() -> list[list[int]]:
        await past_snapshots(abandoned)
        tasks = [asyncio.ensure_future(async_keys(sub, 1)) for sub in abandoned]
        await asyncio.get_running_loop().run_in_executor(None, engine.append, "r", row(0))
        got = await asyncio.gather(*tasks)
        for sub in abandoned:  # left waiting: asyncio.run cancels them and closes the loop
            asyncio.ensure_future(sub.next_async())
        await asyncio.sleep(0)
        return got

    assert finished(*in_loop(read_one())) == [[0]] * 10
    got: list[int] = []
    reader = threading.Thread(target=thread_keys, args=(live, 101, got))
    reader.start()
    for k in range(1, 101):
        engine.append("r", row(k))
    reader.join(timeout=60)
    assert got == list(range(101)), "the stream's reader was held up by a closed loop"
    if shared:
        assert len(live.stream.loops) == 0, "the closed loop is still woken"
    out: list[int] = []
    thread_keys(abandoned[0], 100, out)  # still readable, from a thread now
    assert out == list(range(1, 101))
    for sub in abandoned + [live]:
        sub.close()


def ends_of_waiting_tasks(client: Client, end: Callable[[], None],
                          first: int | None = None) -> tuple[list, float, list]:
    """20 shared and 3 unshared subscriptions of ``r`` read from one loop (past their snapshot
    and, with ``first``, past that key's update), each task waiting in ``async for`` when
    ``end()`` runs: what each task ended with, how long after ``end()`` the last one did, and
    the subscriptions."""
    subs = [client.subscribe("r") for _ in range(20)] + [client.subscribe("r", shared=False) for _ in range(3)]
    waiting = threading.Event()

    async def wait_all() -> list:
        await past_snapshots(subs)
        if first is not None:
            assert await asyncio.gather(*(async_keys(s, 1) for s in subs)) == [[first]] * len(subs)
        tasks = [asyncio.ensure_future(async_keys(s, 1)) for s in subs]
        await asyncio.sleep(0)
        waiting.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    th, out = in_loop(wait_all())
    assert waiting.wait(60)
    began = time.monotonic()
    end()
    return finished(th, out, timeout=60), time.monotonic() - began, subs


def raises_again(subs: list, error: type | tuple) -> None:
    """Every later read of an ended subscription raises its error again, from a thread or a loop."""
    for sub in subs:
        with pytest.raises(error):
            sub.next(timeout=1)
        with pytest.raises(error):
            asyncio.run(sub.next_async(timeout=1))


def test_a_stopping_server_ends_every_waiting_task_with_engine_closed(served):
    _engine, server, client = served
    ends, _, subs = ends_of_waiting_tasks(client, lambda: server.stop(grace=30))
    assert all(isinstance(e, EngineClosed) for e in ends), ends
    raises_again(subs, EngineClosed)


def test_a_killed_server_ends_every_waiting_task_with_a_typed_error_in_bounded_time(tmp_path):
    served = Served(tmp_path / "data")
    try:
        client = Client(served.uri, served.token)
        client.add_relation("r", SCHEMA)
        client.append("r", row(0))
        ends, took, subs = ends_of_waiting_tasks(client, served.kill, first=0)
        assert took < 30, f"the tasks ended {took:.1f} s after the kill"
        assert all(isinstance(e, CoordinatorUnavailable | EngineClosed) for e in ends), ends
        raises_again(subs, (CoordinatorUnavailable, EngineClosed))
        client.close()
    finally:
        if served.proc.poll() is None:
            served.kill()
