"""An append stream that breaks is not one the server ended (sediment/net/append_stream.py):
Flight's read gives the same end for both, and only the call's status tells them apart. A
broken connection or a passed deadline leaves the appends sent in doubt (``OutcomeUnknown``,
nothing sent again), where a clean end means they were not applied (sent again). And a
queued stream acknowledges a durable append without waiting for a later one. Real server,
real engine, real gRPC through a TCP proxy on 127.0.0.1 that the tests cut."""

from __future__ import annotations

import threading
import uuid

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from support.cut_proxy import CutProxy
from support.waiting import Progress

import sediment
from sediment import errors
from sediment.client import Client
from sediment.net.append_stream import PLAIN
from sediment.server import SedimentFlightServer

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])
TOKEN = "breaks-" + uuid.uuid4().hex


def ups(i: int) -> pa.Table:
    return pa.table({"id": pa.array([i], pa.int64()), "name": pa.array(["x"], pa.string()),
                     "time": pa.array([1], pa.int64()), "diff": pa.array([1], pa.int64())})


@pytest.fixture
def node(tmp_path):
    engine = sediment.open(str(tmp_path / "data"), segment_bytes=1 << 20)
    engine.add_relation("r", SCHEMA)
    server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", TOKEN)
    yield engine, server
    server.stop(grace=30)
    engine.close()


class HeldQueue:
    """The engine's ``append_queued`` as the server calls it, each append's durability wait
    held until ``gate`` opens (all but the first ``free``); ``queued`` and ``durable`` count
    appends queued and waited for, signalled through ``progress``."""

    def __init__(self, engine, gate: threading.Event, free: int = 0) -> None:
        self.real, self.gate, self.free = engine.append_queued, gate, free
        self.queued = self.durable = 0
        self.progress = Progress()
        engine.append_queued = self

    def __call__(self, name: str, table: pa.Table) -> HeldQueue._Held:
        inner = self.real(name, table)
        self.queued += 1
        self.progress.changed()
        return self._Held(self, inner, self.queued <= self.free)

    class _Held:
        def __init__(self, owner: HeldQueue, inner, free: bool) -> None:
            self.owner, self.inner, self.free = owner, inner, free

        def settled(self) -> bool:
            return (self.free or self.owner.gate.is_set()) and self.inner.settled()

        def wait(self) -> None:
            if not self.free:
                self.owner.gate.wait(30)
            try:
                self.inner.wait()
            finally:
                self.owner.durable += 1
                self.owner.progress.changed()


def stored_ids(engine) -> list[int]:
    engine.seal("r", 1)
    snap = engine.snapshot("r", 1)
    return sorted(i for i, d in zip(snap.column("id").to_pylist(), snap.column("diff").to_pylist(), strict=True)
                  for _ in range(d))


def test_a_cut_connection_leaves_pipelined_appends_in_doubt_and_sends_none_again(node):
    """Three appends queued on the server, then the connection is cut: the server still makes
    them durable; the client raises OutcomeUnknown and does not send them again (it did, as
    if the server had ended the stream, and each row was stored twice)."""
    engine, server = node
    proxy = CutProxy()
    proxy.upstream = server.uri
    gate = threading.Event()
    held = HeldQueue(engine, gate)
    try:
        with Client(proxy.uri, TOKEN) as c:
            w = c.pipelined("r", window=8)
            for i in range(3):
                w.append(ups(i))
            held.progress.wait_for(lambda: held.queued == 3, 10, "the server to queue three appends")
            proxy.cut()
            with pytest.raises(errors.OutcomeUnknown):
                w.close()
            assert w.sent - w.acknowledged == 3
    finally:
        gate.set()
        proxy.close()
    held.progress.wait_for(lambda: held.durable == 3, 10, "the queued appends to be made durable")
    assert stored_ids(engine) == [0, 1, 2]


def test_a_passed_deadline_leaves_pipelined_appends_in_doubt(node):
    """A client with a call timeout: its pipelined stream reaches gRPC's deadline while three
    appends are queued and not durable; they are in doubt, not sent again."""
    engine, server = node
    gate = threading.Event()
    held = HeldQueue(engine, gate)
    try:
        with Client(server.uri, TOKEN, timeout=1.0) as c:
            w = c.pipelined("r", window=8)
            for i in range(3):
                w.append(ups(i))
            with pytest.raises(errors.OutcomeUnknown):
                w.close()
    finally:
        gate.set()
    held.progress.wait_for(lambda: held.durable == 3, 10, "the queued appends to be made durable")
    assert stored_ids(engine) == [0, 1, 2]


def test_a_cut_connection_during_a_plain_append_is_in_doubt(node):
    """``Client.append`` whose connection is cut while the server applies it: OutcomeUnknown,
    and it is not sent again (it was, and the row was stored twice)."""
    engine, server = node
    proxy = CutProxy()
    proxy.upstream = server.uri
    real, entered, gate, done = engine.append, threading.Event(), threading.Event(), threading.Event()

    def held(name, table, **kw):
        if table.column("id")[0].as_py() == 1:
            entered.set()
            gate.wait(30)
            try:
                return real(name, table, **kw)
            finally:
                done.set()
        return real(name, table, **kw)

    engine.append = held
    cutter = threading.Thread(target=lambda: entered.wait(10) and proxy.cut(), daemon=True)
    try:
        with Client(proxy.uri, TOKEN) as c:
            c.append("r", ups(0))
            cutter.start()
            with pytest.raises(errors.OutcomeUnknown):
                c.append("r", ups(1))
    finally:
        gate.set()
        cutter.join(10)
        proxy.close()
    assert done.wait(10)
    assert stored_ids(engine) == [0, 1]


def test_a_durable_append_is_acknowledged_before_a_later_one_is_durable(node):
    """On a queued stream the first append is durable and the second is held: the first's
    acknowledgement comes at once (it was held back until the second was durable, then both
    acknowledged by one message)."""
    engine, server = node
    gate = threading.Event()
    held = HeldQueue(engine, gate, free=1)
    client = flight.FlightClient(server.uri)
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    command = b'{"op": "append_stream", "relation": "r", "queue": true}'
    writer, acks = client.do_put(flight.FlightDescriptor.for_command(command), ups(0).schema, options=options)
    got: list[bytes] = []
    arrived = Progress()

    def read() -> None:
        for _ in range(2):
            got.append(acks.read().to_pybytes())
            arrived.changed()

    reader = threading.Thread(target=read, daemon=True)
    try:
        for i in range(2):
            writer.write_with_metadata(ups(i).to_batches()[0], pa.py_buffer(PLAIN))
        held.progress.wait_for(lambda: held.queued == 2, 10, "the server to queue both appends")
        reader.start()
        arrived.wait_for(lambda: got, 10, "the first append's acknowledgement while the second is held")
        assert got == [b'{"ok":true}'] and not gate.is_set()
    finally:
        gate.set()
    arrived.wait_for(lambda: len(got) == 2, 10, "the second acknowledgement")
    assert got == [b'{"ok":true}', b'{"ok":true}']
    reader.join(10)
    writer.done_writing()
    writer.close()
    client.close()


def test_a_token_refused_on_a_new_stream_is_an_authentication_error_not_in_doubt(node, monkeypatch):
    """The server's token check refuses the call before any handler runs: nothing was
    applied, so the append raises AuthenticationFailed (the status is read as a broken
    stream's would be: it raised OutcomeUnknown)."""
    from sediment import server as server_module

    engine, server = node
    with Client(server.uri, TOKEN) as c:
        def refuse(self, info, headers):
            raise flight.FlightUnauthenticatedError("sediment server: call with a wrong token")

        monkeypatch.setattr(server_module.BearerTokenMiddlewareFactory, "start_call", refuse)
        with pytest.raises(errors.AuthenticationFailed):
            c.append("r", ups(1))
        with pytest.raises(errors.AuthenticationFailed):
            with c.pipelined("r", window=4) as w:
                w.append(ups(2))
        monkeypatch.undo()
    assert stored_ids(engine) == []
