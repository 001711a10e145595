"""A served feed across a relation's alters (issue 26): the client's subscription and
``sediment tail`` go on in the new schema after the schema event, in order, with nothing
lost and nothing twice, through a real server (in process and as a ``sediment serve``)."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from support.served import Served

import sediment
from sediment.errors import FeedOverrun
from sediment.net.messages import Get, encode
from sediment.net.wire_errors import typed_error
from sediment.server import SedimentFlightServer

TOKEN = "feed-alter-token"


@pytest.fixture
def served(tmp_path):
    with sediment.open(str(tmp_path / "data"), compact_interval=None) as engine:
        server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", TOKEN)
        with sediment.connect(server.uri, token=TOKEN) as client:
            yield engine, server, client
        server.stop()


def _updates(client, rows: list[dict]) -> None:
    client.append("r", pa.Table.from_pylist(rows))


def test_the_iterator_crosses_two_alters_in_order(served):
    engine, server, client = served
    client.add_relation("r", pa.schema([("k", pa.int64()), ("v", pa.string())]))
    sub = client.subscribe("r")
    assert sub.next(10).kind == "snapshot"
    _updates(client, [{"k": 1, "v": "a", "time": 1, "diff": 1}])
    client.seal("r", 1)
    client.alter_relation("r", add=[pa.field("n", pa.int64())], rename={"v": "w"})
    _updates(client, [{"k": 2, "w": "b", "n": 7, "time": 2, "diff": 1}])
    _updates(client, [{"k": 3, "w": "c", "n": 8, "time": 2, "diff": 1}])
    client.alter_relation("r", drop=["w"])
    _updates(client, [{"k": 4, "n": 9, "time": 3, "diff": 1}])
    client.seal("r", 3)
    got = []
    for event in sub:  # the caller's own iterator, never resubscribed
        got.append(event)
        if event.kind == "progress" and event.time == 3:
            break
    flat = [(e.kind, e.time, e.table.to_pylist() if e.kind == "updates" else None) for e in got]
    rows = [r for kind, _t, tab in flat if kind == "updates" for r in tab]
    assert rows == [{"k": 1, "v": "a", "time": 1, "diff": 1},
                    {"k": 2, "w": "b", "n": 7, "time": 2, "diff": 1},
                    {"k": 3, "w": "c", "n": 8, "time": 2, "diff": 1},
                    {"k": 4, "n": 9, "time": 3, "diff": 1}]  # each once, in order
    kinds = [(kind, t) for kind, t, _tab in flat if kind != "updates"]
    assert kinds == [("progress", 1), ("schema", 1), ("schema", 2), ("progress", 3)]
    schema_events = [e for e in got if e.kind == "schema"]
    assert schema_events[0].table.column_names == ["k", "w", "n", "time", "diff"]
    assert schema_events[1].table.column_names == ["k", "n", "time", "diff"]
    order = [e.kind if e.kind != "updates" else e.table.column("k").to_pylist()[0] for e in got]
    assert order.index(1) < order.index("schema") < order.index(2)  # the event between old and new rows
    sub.close()
    assert server.wait_feeds_released(10)  # no stream or parked subscription is left behind


def test_an_unknown_continuation_is_refused_typed(served):
    _engine, server, client = served
    client.add_relation("r", pa.schema([("k", pa.int64())]))
    raw = flight.FlightClient(server.uri)
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    ticket = flight.Ticket(encode(Get.SUBSCRIBE, relation="r", continuation="0" * 32))
    with pytest.raises(flight.FlightError) as refused:
        raw.do_get(ticket, options=options).read_all()
    raw.close()
    err = typed_error(refused.value)
    assert isinstance(err, FeedOverrun) and "resume=True" in str(err)


def _raw_feed(server) -> tuple[flight.FlightClient, flight.FlightStreamReader]:
    """A feed stream read with Flight alone: a client that will not take up the continuation."""
    raw = flight.FlightClient(server.uri)
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    return raw, raw.do_get(flight.Ticket(encode(Get.SUBSCRIBE, relation="r")), options=options)


def test_a_parked_feed_holds_its_subscription_until_the_server_stops(served):
    engine, server, client = served
    client.add_relation("r", pa.schema([("k", pa.int64())]))
    raw, reader = _raw_feed(server)
    client.alter_relation("r", add=[pa.field("n", pa.int64())])
    metas = [json.loads(chunk.app_metadata.to_pybytes()) for chunk in reader]  # the stream ends at the alter
    assert [m["kind"] for m in metas] == ["snapshot", "schema"] and len(metas[-1]["continuation"]) == 32
    assert engine.stats()["relations"]["r"]["subscribers"] == 1  # parked, waiting for its client
    assert not server.wait_feeds_released(0.2)
    server.stop()
    assert engine.stats()["relations"]["r"]["subscribers"] == 0
    assert server.wait_feeds_released(0)
    raw.close()


def test_sediment_tail_goes_on_across_an_alter(tmp_path):
    data = tmp_path / "data"
    with sediment.open(str(data)) as e:
        e.add_relation("r", pa.schema([("k", pa.int64()), ("v", pa.string())]))
    srv = Served(data)
    try:
        tail = subprocess.Popen([sys.executable, "-m", "sediment", "--connect", srv.uri, "--token", srv.token,
                                 "tail", "r", "--idle-timeout", "30"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x.rstrip("\n")) for x in tail.stdout], daemon=True).start()
        assert lines.get(timeout=60) == "event,time,k,v,diff"
        with sediment.connect(srv.uri, token=srv.token) as c:
            _updates(c, [{"k": 1, "v": "a", "time": 1, "diff": 1}])
            c.alter_relation("r", add=[pa.field("n", pa.int64())], rename={"v": "w"})
            _updates(c, [{"k": 2, "w": "b", "n": 5, "time": 2, "diff": 1}])
            c.seal("r", 2)
        out = []
        while not out or out[-1] != "progress,2,,,,":
            out.append(lines.get(timeout=60))
        assert out == ["update,1,1,a,1", "schema,1,k,w,n,diff", "update,2,2,b,5,1", "progress,2,,,,"], out
        tail.terminate()
        tail.wait(timeout=60)
    finally:
        assert srv.stop() == 0
