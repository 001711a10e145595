"""Remote subscriptions in the client, unshared (``client.subscribe(..., shared=False)``)
and shared alike: ``max_lag`` counts every live event queued for one from the first,
whether or not an initial progress came (the server marks its initial events on the wire);
the overrun names a resume point that loses nothing; ``Client.close()`` ends every read
waiting on them with EngineClosed. Real SedimentFlightServer, real engine, real gRPC on
127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from support.event_loops import async_keys, in_loop
from support.served import served_engine
from support.waiting import poll_until

from sediment.engine.feed import FeedEvent
from sediment.errors import EngineClosed, FeedOverrun
from sediment.net.messages import Get, encode
from sediment.net.protocol import event_batches
from sediment.net.remote_subscription import CHECK_EVERY

SCHEMA = pa.schema([("k", pa.int64())])
TOKEN = "lag-" + uuid.uuid4().hex


def row(k: int, t: int) -> pa.Table:
    return pa.table({"k": pa.array([k], pa.int64()), "time": pa.array([t], pa.int64()),
                     "diff": pa.array([1], pa.int64())})


@pytest.fixture
def served(tmp_path):
    with served_engine(tmp_path / "data", TOKEN, SCHEMA) as got:
        yield got


def read_until_dropped(sub, most: int) -> int:
    """Events read from ``sub`` before it raises FeedOverrun (at most ``most``)."""
    read = 0
    with pytest.raises(FeedOverrun) as dropped:
        while read <= most:
            assert sub.next(timeout=5) is not None, "the subscription waits on: it was never dropped"
            read += 1
    return read, str(dropped.value)


def start(engine, client, how: str, shared: bool):
    """A subscription of max_lag 100 whose events are queued in the client (an unshared
    one's pump runs), past its initial events; the first time its live updates may take,
    and what its overrun must say to resume with nothing lost."""
    if how == "frontier":  # as_of=None: a snapshot at the sealed frontier, no initial progress
        sub = client.subscribe("r", max_lag=100, shared=shared)
        assert sub.next(timeout=10).kind == "snapshot"
        return sub, 1, "as_of=0 (the time this subscription started at) and resume=True"
    if how == "resume":  # resume=True at the frontier: no initial event at all
        sub = client.subscribe("r", max_lag=100, resume=True, shared=shared)
        assert sub.next(timeout=0.2) is None
        return sub, 1, "resume=True and as_of = the time this subscription started at"
    engine.seal("r", 1)  # the initial progress, read directly by a thread before the pump starts
    sub = client.subscribe("r", 0, max_lag=100, shared=shared)
    kinds: list[str] = []
    reader = threading.Thread(target=lambda: kinds.extend([sub.next().kind, sub.next().kind]))
    reader.start()
    reader.join(timeout=10)
    assert kinds == ["snapshot", "progress"]
    assert sub.next(timeout=0) is None
    return sub, 2, "as_of=1 and resume=True after dropping the updates received since that progress"


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("how", ["frontier", "resume", "direct"])
def test_a_subscription_is_dropped_past_its_max_lag_before_any_seal_naming_where_to_resume(served, how, shared):
    engine, _server, client = served
    sub, t0, advice = start(engine, client, how, shared)
    n = 2 * CHECK_EVERY + 8
    for k in range(n):  # distinct times: the server sends each as an event of its own
        engine.append("r", row(k, t0 + k))
    # nothing was read meanwhile: once the client has queued the first CHECK_EVERY live
    # events, it must drop the subscription (a reader reading as they arrive never lags)
    poll_until(lambda: sub._overrun, 60, "the client to queue the live events and drop the subscription")
    read, message = read_until_dropped(sub, n)
    assert read <= CHECK_EVERY  # dropped at the first check: nothing past it was queued
    assert "in the client" in message and advice in message
    sub.close()


def test_a_subscriber_behind_catches_up_in_one_event_that_counts_the_entries_it_merges(served):
    engine, _server, _client = served
    sub = engine.subscribe("r", max_lag=10_000)
    assert sub.next(timeout=10).kind == "snapshot"
    for k in range(50):
        engine.append("r", row(k, 1 + k))
    event = sub.next(timeout=10)
    assert (event.kind, event.records, event.table.column("k").to_pylist()) == ("updates", 50, list(range(50)))
    sub.close()


def live_updates(reader, appended: int) -> list[dict]:
    """The app metadata of each whole live updates event read from a raw subscribe stream,
    until they hold ``appended`` rows (one per append)."""
    metas: list[dict] = []
    rows = 0
    while rows < appended:
        chunk = reader.read_chunk()
        meta = json.loads(chunk.app_metadata.to_pybytes())
        if meta["kind"] == "updates" and not meta["initial"]:
            rows += chunk.data.num_rows
            if meta["last"]:
                metas.append(meta)
    return metas


def test_the_wire_counts_each_event_as_the_feed_entries_it_merges(served):
    """A server stream that falls behind its engine subscription (its client reads nothing
    while the appends run) sends merged events; their ``records`` add up to the appends, so
    a client's max_lag counts what the engine's feed counts."""
    engine, server, _client = served
    flight_client = flight.FlightClient(server.uri)
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())], timeout=60)
    reader = flight_client.do_get(flight.Ticket(encode(Get.SUBSCRIBE, relation="r", as_of=0, resume=False,
                                                       max_lag=None)), options)
    n = 3 * CHECK_EVERY
    for k in range(n):
        engine.append("r", row(k, 1 + k))
    metas = live_updates(reader, n)
    reader.cancel()
    flight_client.close()
    assert sum(m.get("records", 1) for m in metas) == n  # one entry per append, not one more
    assert all(m.get("records", 1) >= 1 for m in metas)
    assert [m["time"] for m in metas] == sorted(m["time"] for m in metas)


@pytest.mark.parametrize("shared", [False, True])
def test_a_client_event_carries_the_entries_it_merges(served, shared):
    engine, _server, client = served
    sub = client.subscribe("r", shared=shared)
    assert sub.next(timeout=10).kind == "snapshot"
    n = 3 * CHECK_EVERY
    for k in range(n):
        engine.append("r", row(k, 1 + k))
    got, records = [], 0
    while records < n:
        event = sub.next(timeout=30)
        assert event is not None and event.kind == "updates"
        assert event.records == event.table.num_rows  # one row per append
        got += event.table.column("k").to_pylist()
        records += event.records
    assert got == list(range(n))
    sub.close()


def test_the_engine_names_the_snapshot_time_for_a_subscriber_dropped_before_any_progress(served):
    engine, _server, _client = served
    engine.seal("r", 3)
    sub = engine.subscribe("r", max_lag=10)
    assert sub.next(timeout=10).kind == "snapshot"
    for k in range(2 * CHECK_EVERY):
        engine.append("r", row(k, 4 + k))
    with pytest.raises(FeedOverrun, match=r"no progress was read: subscribe again with as_of=3 \(the time"):
        while sub.next(timeout=5) is not None:
            pass
    sub.close()


def test_the_server_marks_initial_events_and_leaves_live_ones_unmarked(served):
    engine, server, _client = served
    engine.append("r", row(7, 5))  # a stored update past the frontier: initial
    engine.seal("r", 1)
    flight_client = flight.FlightClient(server.uri)
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    ticket = flight.Ticket(encode(Get.SUBSCRIBE, relation="r", as_of=0, resume=False, max_lag=None))
    reader = flight_client.do_get(ticket, options)
    engine.append("r", row(8, 6))  # live
    metas = []
    while len(metas) < 4:
        chunk = reader.read_chunk()
        metas.append(json.loads(chunk.app_metadata.to_pybytes()))
    reader.cancel()
    flight_client.close()
    assert [(m["kind"], m["time"], m["initial"]) for m in metas] == [
        ("snapshot", 0, True), ("updates", 5, True), ("progress", 1, True), ("updates", 6, False)]


def test_the_worked_example_in_formats_md_is_what_the_server_sends():
    text = Path(__file__).resolve().parents[2].joinpath("docs", "formats.md").read_text()
    section = text[text.index("  - `subscribe {relation"):]
    example = section.split("app metadata:\n    `", 1)[1].split("`", 1)[0]
    meta = json.loads(example)
    assert (meta["kind"], meta["time"], meta["last"], meta["initial"]) == ("updates", 5, True, True)
    event = FeedEvent("updates", 5, row(7, 5))
    assert event_batches(event, SCHEMA.append(pa.field("time", pa.int64())).append(pa.field("diff", pa.int64())),
                         initial=True)[-1][1] == example.encode()


def ends_with(out: dict, th: threading.Thread, began: float) -> BaseException:
    th.join(timeout=10)
    assert not th.is_alive(), "a read waits on after client.close()"
    assert time.monotonic() - began < 10
    return out.get("error") or out.get("result")


@pytest.mark.parametrize("shared", [False, True])
def test_closing_the_client_ends_tasks_waiting_on_its_subscriptions(served, shared):
    _engine, _server, client = served
    subs = [client.subscribe("r", shared=shared) for _ in range(3)]
    waiting = threading.Event()

    async def wait_all() -> list:
        for s in subs:
            assert (await s.next_async(timeout=10)).kind == "snapshot"
        tasks = [asyncio.ensure_future(async_keys(s, 1)) for s in subs]
        loop = asyncio.get_running_loop()
        loop.call_soon(waiting.set)  # after every task has started waiting
        return await asyncio.gather(*tasks, return_exceptions=True)

    th, out = in_loop(wait_all())
    assert waiting.wait(30)
    began = time.monotonic()
    client.close()
    got = ends_with(out, th, began)
    assert [type(e) for e in got] == [EngineClosed] * 3, got
    assert all("was closed" in str(e) for e in got)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("timeout", [60.0, None])
def test_closing_the_client_ends_a_thread_waiting_on_its_subscription(served, shared, timeout):
    _engine, _server, client = served
    sub = client.subscribe("r", shared=shared)
    out: dict = {}
    waiting = threading.Event()

    def read() -> None:
        try:
            assert sub.next(timeout=timeout).kind == "snapshot"  # an unshared one without a timeout ...
            waiting.set()
            out["result"] = sub.next(timeout=timeout)  # ... reads the stream itself, in this thread
        except BaseException as e:  # handed to the test's thread
            out["error"] = e

    th = threading.Thread(target=read, daemon=True)
    th.start()
    assert waiting.wait(30)
    began = time.monotonic()
    client.close()
    got = ends_with(out, th, began)
    assert isinstance(got, EngineClosed), got
    with pytest.raises(EngineClosed, match="was closed"):
        sub.next(timeout=1)
