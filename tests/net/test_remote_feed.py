"""A feed read over the network (sediment/net/remote_subscription.py): a reader thread's
``next()`` reads the server's stream itself, with no pump thread in between; a ``next``
with a timeout switches the feed to the pump, in order; a close ends a read blocked in
another thread. Real server, real engine, real gRPC on 127.0.0.1."""

from __future__ import annotations

import threading
import uuid

import pyarrow as pa
import pytest
from support.served import served_engine

SCHEMA = pa.schema([("k", pa.int64())])
TOKEN = "feed-" + uuid.uuid4().hex


def row(k: int) -> pa.Table:
    return pa.table({"k": pa.array([k], pa.int64()), "time": pa.array([k + 1], pa.int64()),
                     "diff": pa.array([1], pa.int64())})


def pumps() -> int:
    return sum(t.name == "sediment-feed" for t in threading.enumerate())


@pytest.fixture
def served(tmp_path):
    with served_engine(tmp_path / "data", TOKEN, SCHEMA) as (engine, _server, client):
        yield engine, client


def test_a_reader_thread_reads_the_stream_itself_until_a_timeout_asks_for_the_pump(served):
    engine, client = served
    before = pumps()
    sub = client.subscribe("r", shared=False)
    keys: list[int] = []

    def read() -> None:
        for event in sub:
            if event.kind == "updates":
                keys.extend(event.table.column("k").to_pylist())
            if len(keys) >= 20:
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    for k in range(20):
        engine.append("r", row(k))
    reader.join(30)
    assert keys == list(range(20))
    assert pumps() == before, "a pump thread read the stream for a reader thread"
    engine.append("r", row(20))
    event = sub.next(timeout=10)  # with a timeout: the pump takes over, and nothing is lost
    assert event.kind == "updates" and event.table.column("k").to_pylist() == [20]
    assert pumps() == before + 1
    sub.close()
    assert pumps() == before


def test_a_close_ends_a_read_blocked_in_another_thread(served):
    _engine, client = served
    sub = client.subscribe("r", shared=False)
    got: list = []
    first = threading.Event()

    def read() -> None:
        got.append(sub.next())
        first.set()
        got.append(sub.next())  # nothing more comes: blocked in the stream until the close

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert first.wait(30)
    sub.close()
    reader.join(30)
    assert not reader.is_alive(), "the blocked read did not end with the close"
    assert got[0].kind == "snapshot" and got[1] is None
