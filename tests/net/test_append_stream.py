"""Appends on a client's long-lived exchange streams (sediment/net/append_stream.py): one
stream carries many appends, a refused append leaves it usable, a stopping server ends it
without applying what it did not acknowledge, and idle streams close so a stop never
waits on them; pipelined appends (sediment/net/pipelined.py) keep several in flight on one
stream, applied in order, a refusal raised by a later call. Real server, real engine, real
gRPC on 127.0.0.1."""

from __future__ import annotations

import threading
import time
import uuid

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from support.waiting import Progress

import sediment
from sediment import errors
from sediment.client import Client
from sediment.clock import ManualClock
from sediment.net.append_stream import StreamPool, append_batches
from sediment.server import SedimentFlightServer

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])
TOKEN = "stream-" + uuid.uuid4().hex


def ups(rows):
    ids, names, times, diffs = zip(*rows, strict=True) if rows else ((), (), (), ())
    return pa.table({"id": pa.array(ids, pa.int64()), "name": pa.array(names, pa.string()),
                     "time": pa.array(times, pa.int64()), "diff": pa.array(diffs, pa.int64())})


@pytest.fixture
def node(tmp_path):
    engine = sediment.open(str(tmp_path / "data"), segment_bytes=1 << 20)
    server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", TOKEN)
    yield engine, server
    server.stop(grace=30)
    engine.close()


def calls(server: SedimentFlightServer, method: str = "do_exchange") -> list[int]:
    """Counts the server's calls of ``method`` (its own, wrapped; the calls still run)."""
    seen = [0]
    real = getattr(server, method)

    def counting(*args):
        seen[0] += 1
        return real(*args)

    setattr(server, method, counting)
    return seen


def test_many_appends_and_refusals_share_one_stream(node):
    engine, server = node
    seen, put = calls(server), calls(server, "do_put")
    with Client(server.uri, TOKEN) as c:
        c.add_relation("r", SCHEMA)
        for i in range(50):
            c.append("r", ups([(i, f"n{i}", 1 + i % 3, 1)]))
        with pytest.raises(errors.UnknownRelation):
            c.append("nope", ups([(1, "a", 1, 1)]))
        c.seal("r", 3)
        with pytest.raises(errors.TimeAlreadySealed, match="sealed through time 3"):
            c.append("r", ups([(99, "late", 2, 1)]))
        c.append("r", ups([(50, "n50", 4, 1)]))  # the stream carries on after refusals
        with c.transaction() as tx:
            tx.append("r", ups([(51, "n51", 5, 1)]))
        c.seal("r", 5)
        assert c.snapshot("r", 5).num_rows == 52
    assert seen[0] == 2, "one stream for relation r, one for the refused name; no call per append"
    assert put[0] == 0, "the append streams are exchanges (which close() can cancel), not do_puts"


class ServerBefore(SedimentFlightServer):
    """A server of the build before the append exchange: its ping lists no ``append_exchange``
    and it has no do_exchange (pyarrow's own answers: not implemented)."""

    def _action_table(self):
        table = super()._action_table()
        ping = table["ping"]
        table["ping"] = lambda a: {k: v for k, v in ping(a).items() if k != "append_exchange"}
        return table

    do_exchange = flight.FlightServerBase.do_exchange


def test_a_server_without_the_exchange_gets_its_appends_on_do_put_streams(tmp_path):
    """A client of this build appends to a server of the build before (no exchange) on the
    do_put append stream it serves: every append applied once, refusals typed, and the
    pipelined ones in order; the server's do_exchange is never called."""
    engine = sediment.open(str(tmp_path / "data"))
    server = ServerBefore(engine, "grpc://127.0.0.1:0", TOKEN)
    try:
        exchanges, put = calls(server), calls(server, "do_put")
        with Client(server.uri, TOKEN) as c:
            c.add_relation("r", SCHEMA)
            for i in range(5):
                c.append("r", ups([(i, "a", 1, 1)]))
            with pytest.raises(errors.UnknownRelation):
                c.append("nope", ups([(1, "a", 1, 1)]))
            with c.pipelined("r") as pipe:
                for i in range(5, 10):
                    pipe.append(ups([(i, "b", 2, 1)]))
            c.seal("r", 2)
            assert sorted(c.snapshot("r", 2).column("id").to_pylist()) == list(range(10))
        assert exchanges[0] == 0 and put[0] == 3, (exchanges, put)
    finally:
        server.stop(grace=30)
        engine.close()


def test_an_exchange_of_another_version_is_refused_typed_with_nothing_read(node):
    """The descriptor's version is the stream's: one the server does not serve is refused
    with InvalidArgument before any append is read."""

    from sediment.net.append_stream import PLAIN
    from sediment.net.wire_errors import typed_error

    engine, server = node
    engine.add_relation("r", SCHEMA)
    client = flight.FlightClient(server.uri)
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    command = b'{"op": "append_exchange", "version": 2, "relation": "r"}'
    writer, reader = client.do_exchange(flight.FlightDescriptor.for_command(command), options=options)
    with pytest.raises(flight.FlightError) as refused:  # the refusal may come before the append is written
        writer.begin(ups([]).schema)
        writer.write_with_metadata(ups([(1, "a", 1, 1)]).to_batches()[0], pa.py_buffer(PLAIN))
        reader.read_chunk()
    assert isinstance(typed_error(refused.value), errors.InvalidArgument), refused.value
    assert "append_exchange version 2" in str(typed_error(refused.value))
    try:
        writer.close()
    except flight.FlightError:
        pass
    client.close()
    engine.seal("r", 1)
    assert engine.snapshot("r", 1).num_rows == 0


def test_large_tables_are_cut_below_the_chunk_size_and_small_ones_go_as_they_are():
    table = ups([(i, "x" * 100, 1, 1) for i in range(10_000)])
    batches = append_batches(table, 64 << 10)
    assert len(batches) > 10 and sum(b.num_rows for b in batches) == 10_000
    assert all(b.nbytes <= 64 << 10 for b in batches)  # what goes on the wire
    assert pa.Table.from_batches(batches).equals(table)
    small = ups([(1, "a", 1, 1)])
    assert append_batches(small, 64 << 10)[0].equals(small.to_batches()[0])
    empty = append_batches(ups([]), 64 << 10)
    assert len(empty) == 1 and empty[0].num_rows == 0


def test_a_stopping_server_ends_the_stream_without_applying_the_unacknowledged_append(node):
    engine, server = node
    c = Client(server.uri, TOKEN)
    try:
        c.add_relation("r", SCHEMA)
        c.append("r", ups([(1, "kept", 1, 1)]))  # leaves an idle stream open on the server
        stopped: list[bool] = []
        stopper = threading.Thread(target=lambda: stopped.append(server.stop(grace=30)))
        stopper.start()
        assert server.stopping.wait(10)
        # the resend on a new stream is refused; or, when gRPC's shutdown cancels that call
        # first, its outcome is unknown to the client: either way nothing was applied (below)
        with pytest.raises((errors.EngineClosed, errors.CoordinatorUnavailable, errors.OutcomeUnknown)):
            c.append("r", ups([(2, "refused", 1, 1)]))
        stopper.join(30)
        assert stopped == [True], "the stop finished once the stream ended, no call was cut off"
    finally:
        c.close()
    engine.seal("r", 1)
    assert engine.snapshot("r", 1).column("name").to_pylist() == ["kept"]


def test_idle_streams_close_so_a_stop_does_not_wait_for_the_client(node):
    engine, server = node
    c = Client(server.uri, TOKEN)
    try:
        c.add_relation("r", SCHEMA)
        c.append("r", ups([(1, "a", 1, 1)]))
        start = time.monotonic()
        assert server.stop(grace=30) is True
        assert time.monotonic() - start < 15, "the idle stream closed by itself, well within the grace"
    finally:
        c.close()


def test_the_pool_closes_streams_idle_too_long_and_those_given_back_after_close():
    closed = []

    class Stream:
        def __init__(self, key):
            self.key, self.last_used = key, time.monotonic()

        def close(self):
            closed.append(self)

    clock = ManualClock(100.0)
    pool = StreamPool(lambda relation, schema, queued: Stream((relation, schema, queued)), idle_seconds=3600, clock=clock)
    lent, fresh = pool.take("r", SCHEMA)
    assert fresh
    pool.give(lent)
    again, fresh = pool.take("r", SCHEMA)
    assert again is lent and not fresh
    other, fresh = pool.take("r", SCHEMA)  # the only stream is lent out: a new one
    assert fresh and other is not again
    pool.give(other)
    queued, fresh = pool.take("r", SCHEMA, queued=True)  # a pipelined stream is never a plain one
    assert fresh and queued.key == ("r", SCHEMA, True)
    clock.advance(3600)
    assert pool.close_idle() == 0, "idle exactly idle_seconds: kept"
    clock.advance(1)
    assert pool.close_idle() == 1 and closed == [other]
    closed.clear()
    pool.close()
    pool.give(again)
    assert closed == [again]


def test_the_worked_example_in_formats_md_decodes():
    import json
    import pathlib
    import re

    from sediment.net.append_serving import durable_ack
    from sediment.net.append_stream import ACK_OK, append_metadata
    from sediment.net.protocol import json_arg
    from sediment.net.wire_errors import error_from_detail

    text = (pathlib.Path(__file__).resolve().parent.parent.parent / "docs" / "formats.md").read_text()
    section = text[text.index("### Append stream"):]
    blocks = re.findall(r"```\n([0-9a-f \n]+)\n```", section)
    meta, ack, counted, keyed = (bytes.fromhex(re.sub(r"\s+", "", b)) for b in blocks[:4])
    assert counted == durable_ack(12) and json.loads(counted) == {"ok": 12} and durable_ack(1) == ACK_OK
    assert json_arg(meta, "append stream metadata") == {"txn": None}
    assert append_metadata(None, None) == meta
    assert json_arg(keyed, "append stream metadata") == {"txn": None, "client": "c-1f2e-3", "seq": 12}
    assert append_metadata(None, None, ("c-1f2e-3", 12)) == keyed
    assert json_arg(append_metadata(7, {"high_water": 3}), "m") == {"txn": 7, "locks": {"high_water": 3}}
    assert ack == ACK_OK and len(ack) == 11
    refused = re.search(r"`(\{\"error\": \{.*?\}\})`", section).group(1)
    err = error_from_detail(json.loads(refused)["error"])
    assert isinstance(err, errors.TimeAlreadySealed) and str(err) == "..."


def test_the_pool_lends_no_stream_older_than_max_age():
    """A client with a call timeout opens streams with that deadline for their whole life:
    a stream past max_age is closed instead of lent, and a new one opened."""
    closed = []

    class Stream:
        def __init__(self, key):
            self.key, self.last_used = key, 0.0

        def close(self):
            closed.append(self)

    clock = ManualClock(100.0)
    pool = StreamPool(lambda relation, schema, queued: Stream((relation, schema, queued)), idle_seconds=3600, clock=clock,
                      max_age=5.0)
    first, _ = pool.take("r", SCHEMA)
    assert first.opened == 100.0
    pool.give(first)
    clock.advance(5)
    assert pool.take("r", SCHEMA) == (first, False), "exactly max_age old: still lent"
    pool.give(first)
    clock.advance(0.5)
    second, fresh = pool.take("r", SCHEMA)
    assert fresh and second is not first and closed == [first] and second.opened == 105.5
    pool.close()
    pool.give(second)


def test_a_client_with_a_timeout_keeps_appending_past_it(node):
    """The streams of a client with timeout=1 s are renewed before gRPC's deadline ends them:
    appends spread over more than the timeout all succeed on the first try."""
    engine, server = node
    with Client(server.uri, TOKEN, timeout=1.0) as c:
        c.add_relation("r", SCHEMA)
        deadline = time.monotonic() + 2.5
        n = 0
        while time.monotonic() < deadline:
            n += 1
            c.append("r", ups([(n, "a", 1, 1)]))
    engine.seal("r", 1)
    assert engine.snapshot("r", 1).num_rows == n


def test_appends_go_out_while_earlier_ones_are_made_durable_and_apply_in_order(node):
    engine, server = node
    engine.add_relation("r", SCHEMA)
    engine.seal("r", 0)
    feed = engine.subscribe("r")
    assert feed.next(timeout=5).kind == "snapshot"
    gate = threading.Event()
    hold(engine, gate)  # the server's appends wait until the test opens the gate
    sent = threading.Event()
    with Client(server.uri, TOKEN) as c:
        writer = c.pipelined("r", window=4)

        def send_four() -> None:
            for i in range(4):
                writer.append(ups([(i, f"n{i}", 1, 1)]))
            sent.set()

        th = threading.Thread(target=send_four, daemon=True)
        th.start()
        assert sent.wait(10), "append waited for an acknowledgement with room left in the window"
        assert writer.acknowledged == 0 and engine.sealed("r") == 0
        gate.set()
        th.join(10)
        for i in range(4, 200):
            writer.append(ups([(i, f"n{i}", 1, 1)]))
        writer.close()
        assert writer.acknowledged == writer.sent == 200
    got: list[int] = []
    while len(got) < 200:
        event = feed.next(timeout=10)
        assert event is not None, "the feed stalled"
        if event.kind == "updates":
            got.extend(event.table.column("id").to_pylist())
    assert got == list(range(200)), "the appends were not applied in the order sent"
    feed.close()


class Held:
    """A queued append whose wait is held until ``gate`` opens (it is not settled before)."""

    def __init__(self, queued, gate: threading.Event) -> None:
        self.queued, self.gate = queued, gate

    def settled(self) -> bool:
        return self.gate.is_set() and self.queued.settled()

    def wait(self) -> None:
        self.gate.wait(30)
        self.queued.wait()


def hold(engine, gate: threading.Event, entered: threading.Event | None = None) -> None:
    """The engine's appends, as the server makes them (``append``, or ``append_queued`` for a
    stream's plain appends), wait until ``gate`` opens; ``entered`` is set when one waits."""
    for method in ("append", "append_queued"):
        real = getattr(engine, method)

        def held(name, table, _real=real, **kwargs):
            if entered is not None:
                entered.set()
            gate.wait(30)
            return _real(name, table, **kwargs)

        setattr(engine, method, held)


def test_a_stream_queues_its_plain_appends_while_the_first_is_made_durable(node):
    """The server reads and queues a pipelined stream's next appends while the first one's
    durability is held, then acknowledges them in order (the serial stream read the next
    one only after acknowledging the one before)."""
    engine, server = node
    engine.add_relation("r", SCHEMA)
    gate, progress = threading.Event(), Progress()
    queued: list[int] = []
    real = engine.append_queued

    def counted(name, table):
        durable = real(name, table)
        queued.append(table.column("id")[0].as_py())
        progress.changed()
        return durable if len(queued) > 1 else Held(durable, gate)  # the first: held until the gate opens

    engine.append_queued = counted
    with Client(server.uri, TOKEN) as c:
        writer = c.pipelined("r", window=8)
        for i in range(6):
            writer.append(ups([(i, f"n{i}", 1, 1)]))
        progress.wait_for(lambda: len(queued) == 6, 10, "the server to queue all six appends")
        assert writer.acknowledged == 0
        gate.set()
        writer.close()
        assert writer.acknowledged == writer.sent == 6
    assert queued == list(range(6))
    engine.seal("r", 1)
    assert sorted(engine.snapshot("r", 1).column("id").to_pylist()) == list(range(6))


def test_appends_durable_together_are_acknowledged_by_one_message(node):
    """On a queued stream, the appends one group commit made durable get one acknowledgement
    ``{"ok":N}`` (the raw messages, read with pyarrow's own Flight client)."""

    from sediment.net.append_stream import PLAIN

    engine, server = node
    engine.add_relation("r", SCHEMA)
    gate = threading.Event()
    progress, queued = Progress(), []
    real = engine.append_queued

    def counted(name, table):
        durable = real(name, table)
        queued.append(table)
        progress.changed()
        return Held(durable, gate)  # nothing is written until the gate opens: then one group takes all six

    engine.append_queued = counted
    client = flight.FlightClient(server.uri)
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    command = b'{"op": "append_stream", "relation": "r", "queue": true}'
    writer, acks = client.do_put(flight.FlightDescriptor.for_command(command), SCHEMA.append(
        pa.field("time", pa.int64())).append(pa.field("diff", pa.int64())), options=options)
    for i in range(6):
        writer.write_with_metadata(ups([(i, "x", 1, 1)]).to_batches()[0], pa.py_buffer(PLAIN))
    progress.wait_for(lambda: len(queued) == 6, 10, "the server to queue all six appends")
    gate.set()
    assert acks.read().to_pybytes() == b'{"ok":6}'
    writer.done_writing()
    writer.close()
    client.close()
    engine.seal("r", 1)
    assert engine.snapshot("r", 1).num_rows == 6


def test_only_a_pipelined_stream_has_its_appends_queued(node):
    """``Client.append`` waits for each acknowledgement, so its stream is served one append
    at a time in the stream's thread (no hand-off to a second one); ``pipelined`` asks for
    the queue (``"queue": true`` in the descriptor)."""
    engine, server = node
    engine.add_relation("r", SCHEMA)
    queued: list[int] = []
    real = engine.append_queued

    def counted(name, table):
        queued.append(table.num_rows)
        return real(name, table)

    engine.append_queued = counted
    with Client(server.uri, TOKEN) as c:
        for i in range(3):
            c.append("r", ups([(i, "plain", 1, 1)]))
        assert queued == []
        with c.pipelined("r", window=4) as writer:
            for i in range(3, 6):
                writer.append(ups([(i, "piped", 1, 1)]))
        assert queued == [1, 1, 1]
    engine.seal("r", 1)
    assert sorted(engine.snapshot("r", 1).column("id").to_pylist()) == list(range(6))


def sealed_at_3(node):
    """The node's engine with relation ``r`` sealed at 3 (an append at time <= 3 is refused)."""
    engine, server = node
    engine.add_relation("r", SCHEMA)
    engine.seal("r", 3)
    return engine, server


def test_a_refused_append_is_raised_later_and_the_appends_after_it_still_apply(node):
    engine, server = sealed_at_3(node)
    with Client(server.uri, TOKEN) as c:
        writer = c.pipelined("r", window=8)
        writer.append(ups([(1, "n1", 4, 1)]))
        writer.append(ups([(2, "n2", 2, 1)]))  # sealed: refused
        writer.append(ups([(3, "n3", 5, 1)]))
        with pytest.raises(errors.TimeAlreadySealed):
            writer.flush()
        writer.flush()  # the rest was acknowledged
        writer.close()
        assert writer.acknowledged == writer.sent == 3
    engine.seal("r", 5)
    assert sorted(engine.snapshot("r", 5).column("id").to_pylist()) == [1, 3]


def test_a_bad_window_is_refused_and_nothing_is_sent(node):
    engine, server = node
    engine.add_relation("r", SCHEMA)
    with Client(server.uri, TOKEN) as c:
        for bad in (0, -1, 2.5, True, "4"):
            with pytest.raises(errors.InvalidArgument, match="window"):
                c.pipelined("r", window=bad)
    engine.seal("r", 1)
    assert engine.snapshot("r", 1).num_rows == 0


def test_a_stopping_server_applies_no_pipelined_append_it_did_not_acknowledge(node):
    engine, server = node
    engine.add_relation("r", SCHEMA)
    gate, entered = threading.Event(), threading.Event()
    hold(engine, gate, entered)  # the first append waits in the server until the stop has begun
    c = Client(server.uri, TOKEN)
    try:
        writer = c.pipelined("r", window=8)
        for i in range(5):
            writer.append(ups([(i, f"n{i}", 1, 1)]))
        assert entered.wait(10)
        stopped: list[bool] = []
        stopper = threading.Thread(target=lambda: stopped.append(server.stop(grace=30)))
        stopper.start()
        assert server.stopping.wait(10)
        gate.set()
        # the rest went again through append, which the stopping server refuses (or gRPC cancels the
        # new stream during the shutdown: to the client that is an outcome it cannot know)
        with pytest.raises((errors.EngineClosed, errors.CoordinatorUnavailable, errors.OutcomeUnknown)):
            writer.flush()
        stopper.join(30)
        assert stopped == [True]
        assert (writer.sent, writer.acknowledged) == (5, 1), "the append answered before the stop, no other"
    finally:
        c.close()
    engine.seal("r", 1)
    assert engine.snapshot("r", 1).column("id").to_pylist() == [0], "an unacknowledged append was applied"


def test_close_after_a_refusal_collects_the_appends_behind_it(node):
    """``close`` raises the refusal only once every later append is acknowledged, so
    ``sent - acknowledged`` never counts an applied append as unanswered."""
    engine, server = sealed_at_3(node)
    with Client(server.uri, TOKEN) as c:
        writer = c.pipelined("r", window=8)
        writer.append(ups([(1, "n1", 2, 1)]))  # at a sealed time: refused
        writer.append(ups([(2, "n2", 5, 1)]))
        with pytest.raises(errors.TimeAlreadySealed):
            writer.close()
        assert (writer.sent, writer.acknowledged) == (2, 2)
    engine.seal("r", 5)
    assert engine.snapshot("r", 5).column("id").to_pylist() == [2]


def test_the_append_that_raises_an_earlier_refusal_still_sends_its_own_table(node):
    engine, server = sealed_at_3(node)
    with Client(server.uri, TOKEN) as c:
        writer = c.pipelined("r", window=1)
        writer.append(ups([(1, "n1", 2, 1)]))  # refused
        with pytest.raises(errors.TimeAlreadySealed):
            writer.append(ups([(2, "n2", 5, 1)]))  # raises the first one's refusal, after sending
        writer.append(ups([(3, "n3", 6, 1)]))
        writer.close()
        assert (writer.sent, writer.acknowledged) == (3, 3)
    engine.seal("r", 6)
    assert sorted(engine.snapshot("r", 6).column("id").to_pylist()) == [2, 3]
