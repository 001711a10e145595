"""Shared feed streams (sediment/net/shared_feeds.py, sediment/net/shared_subscription.py):
a client's subscriptions to one relation share one server stream, each event sent once for
all of them, each subscription still its own. Real server, real engine, real gRPC on
127.0.0.1; a real ``sediment serve`` process killed with SIGKILL for the cut connection."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from support.served import Served, served_engine
from support.waiting import until

import sediment
from sediment.client import Client
from sediment.errors import CoordinatorUnavailable, EngineClosed, FeedOverrun, InvalidArgument, SedimentError
from sediment.net import shared_feeds
from sediment.net.messages import Action, Get, encode
from sediment.net.remote_subscription import CHECK_EVERY, RemoteSubscription
from sediment.net.shared_subscription import SharedSubscription, decode_event
from sediment.net.wire_errors import typed_error
from sediment.server import SedimentFlightServer

SCHEMA = pa.schema([("k", pa.int64())])
TOKEN = "shared-" + uuid.uuid4().hex


def row(k: int, t: int | None = None) -> pa.Table:
    return pa.table({"k": pa.array([k], pa.int64()), "time": pa.array([k + 1 if t is None else t], pa.int64()),
                     "diff": pa.array([1], pa.int64())})


def snapshots_taken(client: Client, n: int, **options) -> list:
    """``n`` subscriptions to ``r``, each past its snapshot."""
    subs = [client.subscribe("r", **options) for _ in range(n)]
    for s in subs:
        assert s.next(timeout=10).kind == "snapshot"
    return subs


def keys_until(sub, n: int, timeout: float = 30) -> list[int]:
    """The keys of ``sub``'s updates until ``n`` have come (progress events skipped)."""
    keys: list[int] = []
    while len(keys) < n:
        event = sub.next(timeout=timeout)
        assert event is not None, f"the feed stalled after {keys}"
        if event.kind == "updates":
            keys.extend(event.table.column("k").to_pylist())
    return keys


@pytest.fixture
def served(tmp_path):
    with served_engine(tmp_path / "data", TOKEN, SCHEMA) as got:
        yield got


@pytest.fixture
def messages(monkeypatch):
    """The kinds and subscription ids of every message the server's shared streams send."""
    sent: list[tuple[str, list[str]]] = []
    real = shared_feeds.share_message
    monkeypatch.setattr(shared_feeds, "share_message",
                        lambda meta, batch: sent.append((meta["kind"], list(meta["subs"]))) or real(meta, batch))
    return sent


def test_many_subscriptions_on_one_connection_each_get_every_event_once_in_order(served, messages):
    engine, _server, client = served
    subs = [client.subscribe("r") for _ in range(10)]
    assert all(isinstance(s, SharedSubscription) for s in subs)
    assert [s.next(timeout=10).kind for s in subs] == ["snapshot"] * 10
    for k in range(30):
        engine.append("r", row(k))
    for s in subs:
        assert keys_until(s, 30) == list(range(30))
    updates = [ids for kind, ids in messages if kind == "updates"]
    # a stream each would send 300 (fewer only where a subscriber behind takes updates in bulk);
    # one shared stream sends about one per append, for all ten
    assert len(updates) < 60, f"{len(updates)} update messages for 30 appends to 10 subscriptions"
    assert sum(map(len, updates)) >= 10, "no update message named the subscriptions"
    snapshots = [ids for kind, ids in messages if kind == "snapshot"]
    assert sorted(len(ids) for ids in snapshots) == [1] * 10, "each subscription has its own snapshot"
    for s in subs:
        s.close()


def test_a_later_subscription_starts_at_its_own_position(served):
    engine, _server, client = served
    first = client.subscribe("r")
    assert first.next(timeout=10).kind == "snapshot"
    for k in range(5):
        engine.append("r", row(k))
    assert keys_until(first, 5) == list(range(5))
    later = client.subscribe("r")
    initial = later.next(timeout=10)
    assert initial.kind == "snapshot" and initial.table.num_rows == 0
    stored = later.next(timeout=10)  # appended at future times: stored updates after the snapshot
    assert stored.kind == "updates" and sorted(stored.table.column("k").to_pylist()) == list(range(5))
    engine.append("r", row(5))
    assert keys_until(later, 1) == [5]
    assert keys_until(first, 1) == [5]
    resumed = client.subscribe("r", as_of=0, resume=True)
    event = resumed.next(timeout=10)
    assert event.kind == "updates" and sorted(event.table.column("k").to_pylist()) == list(range(6))
    for s in (first, later, resumed):
        s.close()


def test_one_closed_leaves_the_others_running(served):
    engine, _server, client = served
    subs = snapshots_taken(client, 3)
    engine.append("r", row(0))
    subs[0].close()
    assert subs[0].next(timeout=0.1) is None
    engine.append("r", row(1))
    for s in subs[1:]:
        assert keys_until(s, 2) == [0, 1]
    subs[1].close()
    subs[2].close()
    again = client.subscribe("r")  # the last one closed the stream: a new one opens
    assert again.next(timeout=10).kind == "snapshot"
    engine.append("r", row(2))
    assert keys_until(again, 3) == [0, 1, 2]  # the stored updates after its snapshot, then the live one
    again.close()


def test_the_last_close_releases_every_server_subscription(served):
    _engine, server, client = served
    subs = snapshots_taken(client, 4)
    for s in subs:
        s.close()
    assert server.wait_feeds_released(30), "the server still holds subscriptions of a cancelled stream"


def test_a_subscription_past_its_max_lag_is_dropped_alone(served):
    """The engine's rule: a burst longer than max_lag between two checks keeps the reader;
    past max_lag at a check (every CHECK_EVERY live events) drops it alone, naming the last
    progress it read as the resume point."""
    engine, _server, client = served
    idle = client.subscribe("r", max_lag=3)
    busy = client.subscribe("r")
    for s in (idle, busy):
        assert s.next(timeout=10).kind == "snapshot"
    engine.seal("r", 1)
    for s in (idle, busy):
        assert s.next(timeout=10).kind == "progress"
    burst = CHECK_EVERY // 2  # fewer events than the check interval, many more than max_lag
    for k in range(burst):
        engine.append("r", row(k, k + 2))
    assert keys_until(busy, burst) == list(range(burst))
    first = keys_until(idle, 1)  # one event: a reader behind may get consecutive updates merged
    assert first == list(range(len(first))), "a burst shorter than the check interval dropped the reader"
    more = 4 * CHECK_EVERY  # at least one check, however the server batches them
    for k in range(burst, burst + more):
        engine.append("r", row(k, k + 2))
    assert keys_until(busy, more) == list(range(burst, burst + more))
    with pytest.raises(FeedOverrun, match="as_of=1 "):
        while True:
            assert idle.next(timeout=10) is not None
    engine.append("r", row(burst + more, burst + more + 2))
    assert keys_until(busy, 1) == [burst + more]
    busy.close()


def test_the_stream_goes_on_across_an_alter(served):
    engine, _server, client = served
    subs = snapshots_taken(client, 2)
    engine.append("r", row(0))
    engine.alter_relation("r", add=[pa.field("v", pa.string())])
    engine.append("r", pa.table({"k": [1], "v": ["one"], "time": [2], "diff": [1]},
                                schema=pa.schema([("k", pa.int64()), ("v", pa.string()),
                                                  ("time", pa.int64()), ("diff", pa.int64())])))
    for s in subs:
        kinds = []
        while "v" not in kinds:
            event = s.next(timeout=10)
            assert event is not None
            kinds.append(event.kind)
            if event.kind == "updates" and "v" in event.table.column_names:
                assert event.table.column("v").to_pylist() == ["one"]
                kinds.append("v")
        assert kinds[kinds.index("schema") - 1] == "updates" and kinds[-2] == "updates"
        s.close()


def test_a_stopping_server_ends_every_subscription_with_engine_closed(tmp_path):
    engine = sediment.open(str(tmp_path / "data"))
    engine.add_relation("r", SCHEMA)
    server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", TOKEN)
    client = Client(server.uri, TOKEN)
    try:
        subs = [client.subscribe("r") for _ in range(3)]
        for s in subs:
            assert s.next(timeout=10).kind == "snapshot"
        server.stop(grace=30)
        for s in subs:
            with pytest.raises(EngineClosed):
                s.next(timeout=30)
    finally:
        client.close()
        engine.close()


def test_a_cut_connection_ends_every_subscription_with_a_typed_error(tmp_path):
    served = Served(tmp_path / "data")
    try:
        client = Client(served.uri, served.token)
        client.add_relation("r", SCHEMA)
        subs = snapshots_taken(client, 3)
        client.append("r", row(0))
        for s in subs:
            assert keys_until(s, 1) == [0]
        served.kill()
        for s in subs:
            with pytest.raises(SedimentError) as failure:
                while True:
                    assert s.next(timeout=30) is not None, "a broken stream hung a subscription"
            assert isinstance(failure.value, CoordinatorUnavailable | EngineClosed)
        client.close()
    finally:
        if served.proc.poll() is None:
            served.kill()


class OlderServer(SedimentFlightServer):
    """A server of the release before shared streams: its do_get knows no ``feed_share``."""

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.FlightDataStream:
        if b'"feed_share"' in ticket.ticket:
            raise flight.FlightServerError(
                "ValueError: unknown do_get op", extra_info=b'{"error": "ValueError", "module": "builtins", '
                b'"message": "unknown do_get op \'feed_share\': use one of [\'snapshot\']", "attrs": {}}')
        return super().do_get(context, ticket)


def test_against_an_older_server_each_subscription_gets_its_own_stream(tmp_path):
    with served_engine(tmp_path / "data", TOKEN, SCHEMA, OlderServer) as (engine, _server, client):
        subs = snapshots_taken(client, 2)
        assert all(isinstance(s, RemoteSubscription) for s in subs)
        engine.append("r", row(0))
        for s in subs:
            assert keys_until(s, 1) == [0]
            s.close()


def refused(uri: str, call) -> None:
    """Run ``call(flight_client, options)`` against ``uri``, raising the server's typed error."""
    flight_client = flight.FlightClient(uri)
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    try:
        call(flight_client, options)
    except flight.FlightError as exc:
        raise typed_error(exc) from None
    finally:
        flight_client.close()


def test_an_unknown_version_or_stream_is_refused_typed(served):
    _engine, _server, client = served
    ticket = flight.Ticket(encode(Get.FEED_SHARE, relation="r", version=99, stream="s", sub="1"))
    with pytest.raises(InvalidArgument, match="version 99"):
        refused(client.uri, lambda c, o: c.do_get(ticket, options=o).read_all())
    join = flight.Action(Action.FEED_JOIN.value, encode(Action.FEED_JOIN, stream="no-such", sub="1"))
    with pytest.raises(EngineClosed, match="has ended"):
        refused(client.uri, lambda c, o: list(c.do_action(join, options=o)))


def test_subscriptions_from_many_threads_share_the_stream(served, messages):
    engine, _server, client = served
    with ThreadPoolExecutor(8) as pool:
        subs = list(pool.map(lambda _: client.subscribe("r"), range(8)))
    assert len({s.id for s in subs}) == 8
    engine.append("r", row(0))
    for s in subs:
        assert keys_until(s, 1) == [0]
        s.close()
    updates = [ids for kind, ids in messages if kind == "updates"]
    assert sorted(sid for ids in updates for sid in ids) == sorted(s.id for s in subs)
    assert len(updates) < 8, "the subscriptions made from other threads got a stream each"


def test_reader_threads_asleep_on_one_stream_are_woken_for_every_event(served):
    """Each subscription read by a thread of its own that waits with no timeout: the stream's
    reading thread queues an event for them all, then wakes them through its relay."""
    engine, _server, client = served
    subs = snapshots_taken(client, 12)
    got: list[list[int]] = [[] for _ in subs]

    def read(sub, out: list[int]) -> None:
        for event in sub:
            if event.kind == "updates":
                out.extend(event.table.column("k").to_pylist())
                if len(out) >= 40:
                    return

    threads = [threading.Thread(target=read, args=(s, out), daemon=True) for s, out in zip(subs, got, strict=True)]
    for th in threads:
        th.start()
    assert until(lambda: all(s._queue.sleeping for s in subs)), "a reader thread never went to sleep"
    for k in range(40):
        engine.append("r", row(k))
    for th in threads:
        th.join(timeout=30)
    stalled = sum(th.is_alive() for th in threads)
    for s in subs:
        s.close()
    assert not stalled, f"{stalled} reader threads were never woken"
    assert got == [list(range(40))] * len(subs)


def test_the_worked_example_in_formats_md_decodes_to_its_event():
    import base64
    import json
    from pathlib import Path

    text = Path(__file__).resolve().parents[2].joinpath("docs", "formats.md").read_text()
    section = text[text.index("### Shared feed stream"):]
    meta = json.loads(section.split("app metadata: ", 1)[1].splitlines()[0])
    raw = base64.b64decode(section.split("row 0 (504 bytes): ", 1)[1].splitlines()[0])
    assert len(raw) == 504
    event = decode_event(meta, [pa.record_batch([pa.array([raw], pa.large_binary())], schema=shared_feeds.SHARE_SCHEMA)])
    assert (event.kind, event.time, meta["subs"]) == ("updates", 6, ["1", "3"])
    assert event.table.to_pylist() == [{"k": 2, "time": 6, "diff": 1}]
    assert shared_feeds.table_ipc(event.table) == [raw], "the server encodes that event to those bytes"


def test_closing_the_client_ends_its_subscriptions_and_their_server_side(served):
    _engine, server, client = served
    subs = snapshots_taken(client, 3)
    client.close()
    for s in subs:
        with pytest.raises(EngineClosed, match="client .* was closed"):
            s.next(timeout=30)
    assert server.wait_feeds_released(30), "the server still holds the closed client's subscriptions"


def test_caught_up_subscriptions_are_carried_by_one_engine_subscription(served):
    engine, server, client = served
    subs = snapshots_taken(client, 10)
    for k in range(4):  # each read by all before the next: by the last, the server has merged them
        engine.append("r", row(k))
        for s in subs:
            assert keys_until(s, 1) == [k]
    assert engine.stats()["relations"]["r"]["subscribers"] == 1, "the server reads each subscription on its own"
    for s in subs[:9]:
        s.close()
    engine.append("r", row(4))
    assert keys_until(subs[9], 1) == [4], "closing the others stopped the one left"
    late = client.subscribe("r")  # a new one is read on its own until it has caught up, then merged
    assert late.next(timeout=10).kind == "snapshot"
    assert keys_until(late, 5) == list(range(5))  # the stored updates after its snapshot
    engine.append("r", row(5))
    assert keys_until(late, 1) == keys_until(subs[9], 1) == [5]
    subs[9].close()
    late.close()
    assert server.wait_feeds_released(30)
    assert engine.stats()["relations"]["r"]["subscribers"] == 0


def test_an_event_larger_than_a_part_comes_in_several_messages_whole(served, messages):
    engine, _server, client = served
    rows = shared_feeds.FEED_BATCH_ROWS + 10
    engine.append("r", pa.table({"k": pa.array(range(rows), pa.int64()), "time": pa.array([5] * rows, pa.int64()),
                                 "diff": pa.array([1] * rows, pa.int64())}))
    sub = client.subscribe("r")
    assert sub.next(timeout=10).kind == "snapshot"
    stored = sub.next(timeout=30)
    assert stored.kind == "updates" and stored.table.column("k").to_pylist() == list(range(rows))
    assert [kind for kind, _ in messages].count("updates") == 2, "the event went as one message"
    engine.append("r", row(rows))
    assert keys_until(sub, 1) == [rows]
    sub.close()
