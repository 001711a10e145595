"""The Flight server and client: auth on every RPC, typed errors, transactions, read plans, and
``sediment serve`` as a real process.

The whole engine suite also runs through the server (``access="server"`` in
fixtures_engine.py); these tests cover what only the network path has.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from support.frontier_race import race_appends_and_seals

import sediment
from sediment import Locks, errors
from sediment.client import Client, RemoteTransaction
from sediment.clock import ManualClock
from sediment.errors import ServerError
from sediment.net.protocol import PLAN_METADATA_KEY
from sediment.net.wire_errors import error_detail, to_flight_error, typed_error
from sediment.server import SedimentFlightServer, serve_local

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])
TOKEN = "s3cret-" + uuid.uuid4().hex
READY = re.compile(r"^serving (?P<dir>.+) on (?P<uri>grpc://\S+)$")


def ups(rows):
    ids, names, times, diffs = zip(*rows, strict=True) if rows else ((), (), (), ())
    return pa.table({"id": pa.array(ids, pa.int64()), "name": pa.array(names, pa.string()),
                     "time": pa.array(times, pa.int64()), "diff": pa.array(diffs, pa.int64())})


def rows(table):
    return [tuple(r.values()) for r in table.to_pylist()]


class Served:
    """An engine on a data directory, a server in front of it, and clients of that server."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.engine = sediment.open(data_dir, segment_bytes=1 << 20)
        self.server = SedimentFlightServer(self.engine, "grpc://127.0.0.1:0", TOKEN)
        self.clients: list[Client] = []

    def client(self, token: str = TOKEN) -> Client:
        c = sediment.connect(self.server.uri, token=token)
        self.clients.append(c)
        return c

    def stop(self) -> None:
        for c in self.clients:
            c.close()
        self.server.stop()
        self.engine.close()


@pytest.fixture
def served(tmp_path) -> Iterator[Served]:
    s = Served(str(tmp_path / "data"))
    yield s
    s.stop()


# --- auth -----------------------------------------------------------------------------------


def _raw_calls(uri: str) -> dict[str, Callable[[flight.FlightCallOptions], object]]:
    """One call of every Flight RPC kind, each a valid request for sediment if authorized."""
    fc = flight.FlightClient(uri)
    table = ups([(1, "a", 1, 1)])

    def do_put(options):
        descriptor = flight.FlightDescriptor.for_command(json.dumps({"op": "append", "relation": "r"}))
        writer, _ = fc.do_put(descriptor, table.schema, options=options)
        try:
            writer.write_table(table)
            writer.done_writing()
        finally:
            writer.close()

    return {
        "do_action": lambda o: list(fc.do_action(flight.Action("relations", b"{}"), options=o)),
        "do_put": do_put,
        "do_get": lambda o: fc.do_get(flight.Ticket(json.dumps({"op": "snapshot", "relation": "r", "as_of": 0})),
                                      options=o).read_all(),
        "list_actions": lambda o: fc.list_actions(options=o),
        "list_flights": lambda o: list(fc.list_flights(options=o)),
        "get_flight_info": lambda o: fc.get_flight_info(flight.FlightDescriptor.for_command(b"{}"), options=o),
        "get_schema": lambda o: fc.get_schema(flight.FlightDescriptor.for_command(b"{}"), options=o),
        "do_exchange": lambda o: fc.do_exchange(flight.FlightDescriptor.for_command(b"{}"), options=o)[1].read_all(),
        "handshake": lambda o: fc.authenticate_basic_token("user", "password", options=o),
    }


RPC_KINDS = ["do_action", "do_put", "do_get", "list_actions", "list_flights", "get_flight_info", "get_schema",
             "do_exchange", "handshake"]
BAD_HEADERS = {
    "no header": [],
    "wrong token": [(b"authorization", b"Bearer nope")],
    "token prefix": [(b"authorization", f"Bearer {TOKEN[:-1]}".encode())],
    "no bearer": [(b"authorization", TOKEN.encode())],
}


@pytest.mark.parametrize("headers", sorted(BAD_HEADERS))
def test_every_rpc_kind_is_refused_without_the_token(served, headers):
    c = served.client()
    c.add_relation("r", SCHEMA)
    c.seal("r", 0)
    end = served.engine.wal.end_lsn
    calls = _raw_calls(served.server.uri)
    bad = flight.FlightCallOptions(headers=BAD_HEADERS[headers])
    for kind in RPC_KINDS:
        with pytest.raises((flight.FlightUnauthenticatedError, OSError)) as err:
            calls[kind](bad)
        # pyarrow's get_schema wraps the status in a plain OSError; it is still the server's refusal
        assert isinstance(err.value, flight.FlightUnauthenticatedError) or "Unauthenticated" in str(err.value), kind
    assert served.engine.wal.end_lsn == end and c.trace_info("r")["tail_records"] == 0, "the refused put wrote"
    good = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    calls["do_put"](good)  # the same call with the token goes through
    assert c.trace_info("r")["tail_records"] == 1


def test_connect_with_a_wrong_or_missing_token_fails_at_connect(served, monkeypatch):
    with pytest.raises(errors.AuthenticationFailed, match="wrong token"):
        sediment.connect(served.server.uri, token="wrong")
    monkeypatch.delenv("SEDIMENT_TOKEN", raising=False)
    with pytest.raises(ValueError, match="SEDIMENT_TOKEN"):
        sediment.connect(served.server.uri)
    monkeypatch.setenv("SEDIMENT_TOKEN", TOKEN)
    with sediment.connect(served.server.uri) as c:
        assert c.relations() == [] and c.data_dir == served.engine.data_dir


@pytest.mark.parametrize("uri", ["served", "zk://127.0.0.1:1/nowhere"])
def test_connect_refuses_an_unknown_keyword_naming_it_and_the_known_ones(served, uri):
    uri = served.server.uri if uri == "served" else uri
    with pytest.raises(errors.InvalidArgument) as err:  # was a plain TypeError
        sediment.connect(uri, token=TOKEN, timout=5.0)
    text = str(err.value)
    assert "timout" in text and all(k in text for k in ("timeout", "tls_root_certs", "deadline"))
    with pytest.raises(errors.InvalidArgument, match="deadline"):
        sediment.connect(served.server.uri, token=TOKEN, deadline=-1)
    with sediment.connect(served.server.uri, token=TOKEN, timeout=5.0, deadline=10.0) as c:  # a cluster's option
        assert c.relations() == []


def test_a_server_needs_a_token(tmp_path, monkeypatch):
    monkeypatch.delenv("SEDIMENT_TOKEN", raising=False)
    with sediment.open(tmp_path / "d") as eng, pytest.raises(ValueError, match="token"):
        SedimentFlightServer(eng)


def test_a_port_in_use_is_a_clear_error(served, tmp_path):
    with sediment.open(tmp_path / "other") as eng, pytest.raises(errors.SedimentError, match="in use"):
        SedimentFlightServer(eng, f"grpc://127.0.0.1:{served.server.port}", TOKEN)


# --- typed errors ---------------------------------------------------------------------------


FAILING_CALLS = {
    "sealed time": lambda e: e.append("orders", ups([(1, "a", 9, 1), (2, "b", 5, 1)])),
    "unknown relation": lambda e: e.snapshot("nope", 1),
    "unknown relation in replay": lambda e: e.replay("nope"),
    "relation exists": lambda e: e.add_relation("orders", SCHEMA),
    "bad name": lambda e: e.add_relation("../etc", SCHEMA),
    "reserved column": lambda e: e.add_relation("x", pa.schema([("time", pa.int64())])),
    "wrong type": lambda e: e.append("orders", pa.table({"id": ["1"], "name": ["a"], "time": [9], "diff": [1]})),
    "null diff": lambda e: e.append("orders", pa.table({"id": [1], "name": ["a"], "time": [9],
                                                        "diff": pa.array([None], pa.int64())})),
    "seal backwards": lambda e: e.seal("orders", 4),
    "since past sealed": lambda e: e.set_since("orders", 6),
    "as_of above sealed": lambda e: e.snapshot("orders", 6),
    "plan below since": lambda e: e.plan_read("orders", 5, from_t=0),
    "bad time type": lambda e: e.seal("orders", "7"),
    "many with unknown": lambda e: e.append_many({"orders": ups([(1, "a", 9, 1)]), "nope": ups([])}),
    "many with sealed": lambda e: e.append_many({"orders": ups([(1, "a", 3, 1)])}),
    "stale lock": lambda e: e.append("orders", ups([(1, "a", 9, 1)]), locks=Locks(0, write=[("orders", 1)])),
}


@pytest.mark.parametrize("case", sorted(FAILING_CALLS))
def test_errors_come_back_as_the_same_type_with_the_same_message(served, case):
    """Each call fails on the engine and on the client alike: same class, same text."""
    c = served.client()
    c.add_relation("orders", SCHEMA)
    c.append("orders", ups([(1, "a", 1, 1)]), locks=Locks(0, write=[("orders", 1)]))
    c.seal("orders", 5)
    c.set_since("orders", 1)
    end = served.engine.wal.end_lsn
    call = FAILING_CALLS[case]
    with pytest.raises(Exception) as local:
        call(served.engine)
    with pytest.raises(Exception) as remote:
        call(c)
    assert type(remote.value) is type(local.value)
    assert str(remote.value) == str(local.value) and str(remote.value)
    assert vars(remote.value) == {k: (tuple(v) if isinstance(v, list) else v) for k, v in vars(local.value).items()}
    assert served.engine.wal.end_lsn == end, "a refused call wrote nothing"


def test_error_detail_keeps_attributes_and_unknown_errors_become_server_errors():
    corrupt = errors.WalCorruption("bad crc at 17 in wal/0/1.seg", path="wal/0/1.seg", offset=17, reason="crc")
    back = typed_error(to_flight_error(corrupt))
    assert type(back) is errors.WalCorruption and str(back) == str(corrupt)
    assert (back.path, back.offset, back.reason) == ("wal/0/1.seg", 17, "crc")
    conflict = errors.LockConflict("stale", lock=("acct", "a"), time=3)
    assert typed_error(to_flight_error(conflict)).lock == ("acct", "a")
    oops = typed_error(to_flight_error(ZeroDivisionError("division by zero")))
    assert type(oops) is ServerError and "ZeroDivisionError: division by zero" in str(oops)
    forged = flight.FlightServerError("x", extra_info=json.dumps(
        {"error": "system", "module": "os", "message": "no"}).encode())
    assert type(typed_error(forged)) is ServerError, "only sediment.errors and a few builtins are rebuilt"
    assert json.loads(error_detail(KeyError("k")))["module"] == "builtins"


def test_an_error_with_a_long_message_comes_back_typed(served):
    """gRPC refuses trailers past 16 KiB, where the error travels: a longer message made the
    call fail with pyarrow's ArrowInvalid in place of the server's typed error."""
    c = served.client()
    for i in range(250):
        served.engine.add_relation(f"orders_by_region_and_customer_segment_{i:04d}_materialized_view_v2", SCHEMA)
    for call in (lambda: c.describe("missing"), lambda: c.snapshot("missing", 1),
                 lambda: c.append_many({"missing": ups([(1, "a", 1, 1)])})):
        with pytest.raises(errors.UnknownRelation, match="known: .* and 230 more"):
            call()
    with pytest.raises(errors.InvalidRelationName, match=r"more characters\)"):
        c.seal("a" * 20_000, 1)
    assert c.relations() == served.engine.relations()


@pytest.mark.parametrize("op, fields", [
    ("replay", {"batch_rows": 10**30}), ("replay", {"batch_rows": "5"}),
    ("subscribe", {"resume": "false"}), ("plan", {"as_of": 1, "lease_seconds": "Infinity"}),
    ("plan", {"as_of": 1, "hold_tail": {"part_rows": 1e300}}),
    ("plan", {"as_of": 1, "hold_tail": {"part_rows": 2, "max_parts": "many"}}),
])
def test_request_fields_of_the_wrong_type_or_range_are_invalid_argument(served, op, fields):
    """The server handed these to int()/float()/bool(): an OverflowError came back as the
    server's failure, "false" read as True, a string as a builtin error."""
    served.engine.add_relation("r", SCHEMA)
    served.engine.append("r", ups([(k, "a", 1, 1) for k in range(4)]))
    served.engine.seal("r", 2)
    fc = flight.FlightClient(served.server.uri)
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    body = json.dumps({"op": op, "relation": "r", **fields})
    with pytest.raises(flight.FlightError) as failed:
        fc.do_get(flight.Ticket(body.encode()), options=options).read_all()
    fc.close()
    assert type(typed_error(failed.value)) is errors.InvalidArgument, failed.value


def test_closed_client_raises_engine_closed(served):
    c = served.client()
    c.close()
    c.close()
    with pytest.raises(errors.EngineClosed, match="closed"):
        c.relations()


def test_every_action_is_served_and_listed_with_the_fields_of_its_message(served):
    from sediment.net.messages import FIELDS, Action

    fc = flight.FlightClient(served.server.uri)
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    listed = {a.type: a.description for a in fc.list_actions(options=options)}
    assert listed == {op.value: "{" + ", ".join(FIELDS[op]) + "}" for op in Action}
    for op in Action:  # an empty body: refused for a missing field, never as an unknown action
        try:
            list(fc.do_action(flight.Action(op.value, b"{}"), options=options))
        except flight.FlightError as exc:
            assert "unknown action" not in str(exc), op
    assert served.engine.relations() == []  # no action with an empty body created anything
    fc.close()


# --- writing and reading through the server -------------------------------------------------


def test_a_put_of_many_batches_is_one_all_or_nothing_append(served, monkeypatch):
    monkeypatch.setattr("sediment.client.PUT_CHUNK_BYTES", 1024)  # many record batches on the wire
    c = served.client()
    c.add_relation("r", SCHEMA)
    c.seal("r", 3)
    good = ups([(i, "n" * 20, 4 + i % 5, 1) for i in range(3000)])
    bad = pa.concat_tables([good, ups([(9, "late", 2, 1)])])  # the very last row is at a sealed time
    end = served.engine.wal.end_lsn
    with pytest.raises(errors.TimeAlreadySealed, match="include time 2"):
        c.append("r", bad)
    assert served.engine.wal.end_lsn == end
    c.append("r", good)
    c.seal("r", 8)
    assert c.snapshot("r", 8).num_rows == 3000
    replayed = pa.Table.from_batches(list(c.replay("r", batch_rows=500)))
    assert replayed.num_rows == 3000 and replayed.column("time").to_pylist() == sorted(good.column("time").to_pylist())


def test_concurrent_appends_and_seals_through_one_client(served):
    c = served.client()
    c.add_relation("r", SCHEMA)
    race_appends_and_seals(c, writers=5, last=40)


# --- transactions ---------------------------------------------------------------------------


def test_transactions_commit_visible_abort_invisible(served):
    c = served.client()
    c.add_relation("a", SCHEMA)
    c.add_relation("b", SCHEMA)
    tx = c.transaction()
    assert isinstance(tx, RemoteTransaction) and served.server.open_transactions == [tx.id]
    tx.append("a", ups([(1, "a", 1, 1)]))
    tx.append("b", ups([(2, "b", 1, 1)]))
    c.seal("a", 0)
    assert c.snapshot("a", 0).num_rows == 0
    tx.commit()
    assert tx.state == "committed" and served.server.open_transactions == []
    c.seal("a", 1)
    c.seal("b", 1)
    assert rows(c.snapshot("a", 1)) == [(1, "a", 1)] and rows(c.snapshot("b", 1)) == [(2, "b", 1)]
    with pytest.raises(RuntimeError), c.transaction() as tx2:
        tx2.append("a", ups([(3, "c", 2, 1)]))
        raise RuntimeError("job failed")
    assert tx2.state == "aborted"
    with c.transaction() as tx3:
        tx3.append("b", ups([(4, "d", 2, 1)]))
    assert tx3.state == "committed"
    c.seal("a", 2)
    c.seal("b", 2)
    assert rows(c.snapshot("a", 2)) == [(1, "a", 1)]
    assert rows(c.snapshot("b", 2)) == [(2, "b", 1), (4, "d", 1)]
    with pytest.raises(errors.TransactionError, match="already committed"):
        tx.append("a", ups([(5, "e", 9, 1)]))
    with pytest.raises(errors.TransactionError, match="already committed"):
        RemoteTransaction(c, tx.id).commit()  # the server remembers, not only this client object


def test_commit_refused_because_sealed_meanwhile_leaves_it_aborted(served):
    c = served.client()
    c.add_relation("a", SCHEMA)
    tx = c.transaction()
    tx.append("a", ups([(1, "a", 3, 1)]))
    c.seal("a", 5)
    with pytest.raises(errors.TransactionError, match="aborted"):
        tx.commit()
    assert tx.state == "aborted"
    assert c.snapshot("a", 5).num_rows == 0


def test_commit_all_with_a_group_aborts_the_groups_other_transactions(served):
    c = served.client()
    c.add_relation("r", SCHEMA)
    winner, loser, other_job = c.transaction(group="job-1"), c.transaction(group="job-1"), c.transaction("job-2")
    winner.append("r", ups([(1, "winner", 1, 1)]))
    loser.append("r", ups([(2, "loser", 1, 1)]))
    other_job.append("r", ups([(3, "other", 1, 1)]))
    c.commit_all([winner], group="job-1")
    assert winner.state == "committed"
    assert served.server.open_transactions == [other_job.id]  # loser was aborted with its group
    assert c.abort_group("job-2") == 1 and c.abort_group("job-2") == 0
    assert served.server.open_transactions == []
    c.seal("r", 1)
    assert rows(c.snapshot("r", 1)) == [(1, "winner", 1)]
    with pytest.raises(errors.TransactionError, match="aborted"):
        loser.commit()


def test_idle_transactions_are_aborted_and_stop_holding_back_compaction(tmp_path):
    """A client that vanished mid-transaction must not pin the WAL for ever: after
    txn_idle_timeout without a call naming it, the server aborts it. Time is the test's."""
    clock = ManualClock(1000.0)
    engine = sediment.open(str(tmp_path / "data"), segment_bytes=1 << 20)
    server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", TOKEN, txn_idle_timeout=10.0,
                                  clock=clock)
    c = sediment.connect(server.uri, token=TOKEN)
    try:
        c.add_relation("r", SCHEMA)
        vanished, alive = c.transaction(), c.transaction()
        vanished.append("r", ups([(1, "never", 1, 1)]))
        clock.advance(6)
        alive.append("r", ups([(2, "kept", 1, 1)]))  # a call naming it keeps it alive
        assert server.reap_idle_transactions() == []
        clock.advance(6)  # vanished: idle 12 s > 10; alive: 6 s
        assert server.reap_idle_transactions() == [vanished.id]
        assert server.open_transactions == [alive.id]
        with pytest.raises(errors.TransactionError, match="txn_idle_timeout"):
            vanished.commit()
        assert vanished.state == "aborted"
        alive.commit()
        c.seal("r", 1)
        assert rows(c.snapshot("r", 1)) == [(2, "kept", 1)]
        c.compact("r")  # nothing open any more: the whole WAL can be compacted
        assert c.trace_info("r")["tail_records"] == 0
    finally:
        c.close()
        server.stop()
        engine.close()


@pytest.mark.parametrize("option", [{"txn_idle_timeout": 0}, {"txn_idle_timeout": "5"}, {"stop_grace": "x"},
                                    {"close_engine": "yes"}, {"token": 5}, {"location": 8815}])
def test_server_options_of_the_wrong_type_or_range_are_invalid_argument(tmp_path, option):
    engine = sediment.open(str(tmp_path / "data"))
    try:
        with pytest.raises(errors.InvalidArgument, match=next(iter(option))):
            SedimentFlightServer(engine, **{"location": "grpc://127.0.0.1:0", "token": TOKEN, **option})
    finally:
        engine.close()


def test_server_restart_with_an_open_transaction_leaves_nothing_visible(tmp_path):
    data = str(tmp_path / "data")
    first = Served(data)
    c = first.client()
    c.add_relation("r", SCHEMA)
    c.append("r", ups([(1, "kept", 1, 1)]))
    tx = c.transaction()
    tx.append("r", ups([(2, "lost", 2, 1)]))
    first.server.stop()  # aborts the open transaction
    assert first.server.open_transactions == []
    with pytest.raises(errors.CoordinatorUnavailable):
        tx.commit()
    first.stop()
    second = Served(data)
    try:
        c2 = second.client()
        with pytest.raises(errors.TransactionError, match="not open on this server"):
            RemoteTransaction(c2, tx.id).commit()
        c2.seal("r", 10)
        assert rows(c2.snapshot("r", 10)) == [(1, "kept", 1)]
    finally:
        second.stop()


# --- read plans -----------------------------------------------------------------------------


def test_plan_read_over_the_server_reproduces_the_snapshot(served):
    from sediment.blob.uri import open_blob_store
    from sediment.trace.consolidate import changes, snapshot
    from sediment.trace.state import BatchRef
    from sediment.trace.store import TraceStore

    c = served.client()
    c.add_relation("r", SCHEMA)
    for t in range(1, 9):
        c.append("r", ups([(t % 3, "a", t, 1), (t % 2, "b", t, -1 if t % 4 == 0 else 1)]))
        c.seal("r", t)
        if t in (3, 6):
            c.compact()
    plan = c.plan_read("r", 7)
    local = served.engine.plan_read("r", 7)
    served.engine.release_read(local.lease)
    assert plan.lease != local.lease and plan.batches == local.batches and plan.tail.equals(local.tail)
    assert (plan.relation, plan.relation_id, plan.key_columns, plan.since, plan.sealed, plan.as_of) == \
        (local.relation, local.relation_id, local.key_columns, local.since, local.sealed, local.as_of)
    assert plan.update_schema == local.update_schema and PLAN_METADATA_KEY not in (plan.tail.schema.metadata or {})
    assert plan.batches and plan.tail.num_rows > 0
    assert plan.lease in served.engine.collector.readers.leases
    store = TraceStore(None, open_blob_store(plan.blob_uri))
    parts = [t for ref in plan.batches for t in store.read_stream(plan.relation_id, BatchRef(**ref))]
    everything = pa.concat_tables([*parts, plan.tail.select(parts[0].column_names)])
    assert rows(snapshot(everything, plan.key_columns, 7)) == rows(c.snapshot("r", 7))
    c.release_read(plan.lease)
    assert plan.lease not in served.engine.collector.readers.leases
    delta = c.plan_read("r", 8, from_t=6)
    got = [t for ref in delta.batches for t in store.read_stream(delta.relation_id, BatchRef(**ref))]
    table = pa.concat_tables([*got, delta.tail.select(got[0].column_names)]) if got else delta.tail
    assert rows(changes(table, delta.key_columns, 6, 8)) == [(0, "b", 8, -1), (1, "a", 7, 1), (1, "b", 7, 1),
                                                             (2, "a", 8, 1)]
    c.release_read(delta.lease)
    assert served.engine.collector.readers.leases == {}


def test_subscribe_over_the_server_streams_snapshot_updates_progress(tmp_path):
    s = Served(str(tmp_path / "data"))
    try:
        c = s.client()
        c.add_relation("r", SCHEMA)
        c.append("r", ups([(1, "a", 1, 1), (2, "b", 1, 1), (3, "later", 9, 1)]))
        c.seal("r", 1)
        with pytest.raises(errors.UnknownRelation):
            c.subscribe("nope")
        sub = c.subscribe("r")
        snap, later = sub.next(timeout=10), sub.next(timeout=10)
        assert (snap.kind, snap.time, rows(snap.table)) == ("snapshot", 1, [(1, "a", 1), (2, "b", 1)])
        assert (later.kind, rows(later.table)) == ("updates", [(3, "later", 9, 1)])
        c.append("r", ups([(1, "a", 2, -1)]))
        c.seal("r", 2)
        live = [sub.next(timeout=10) for _ in range(2)]
        assert [(e.kind, e.time) for e in live] == [("updates", 2), ("progress", 2)]
        assert rows(live[0].table) == [(1, "a", 2, -1)] and sub.last_progress == 2
        assert sub.next(timeout=0.05) is None
        sub.close()
        sub.close()
        assert sub.next(timeout=0.05) is None
        assert s.server.wait_feeds_released(timeout=10)  # it notices the cancelled stream, lets go
        again = c.subscribe("r", as_of=2, resume=True)
        s.server.stop()
        with pytest.raises(errors.EngineClosed, match="ended the feed"):
            while again.next(timeout=10) is not None:
                pass
        again.close()
    finally:
        s.stop()


def test_serve_local_client_close_stops_server_and_engine(tmp_path):
    eng = sediment.open(tmp_path / "d")
    c = serve_local(eng)
    c.add_relation("r", SCHEMA)
    uri = c.uri
    c.close()
    with pytest.raises(errors.EngineClosed):
        eng.relations()
    with pytest.raises(errors.CoordinatorUnavailable):
        sediment.connect(uri, token="whatever")


def _big(n: int = 200_000) -> pa.Table:
    """Enough bytes (about 20 MB) that a stream nobody reads fills gRPC's flow-control window."""
    return pa.table({"id": pa.array(range(n), pa.int64()), "name": pa.array(["x" * 100] * n),
                     "time": pa.array([1] * n, pa.int64()), "diff": pa.array([1] * n, pa.int64())})


def test_stop_with_a_grace_cuts_off_a_stream_nobody_reads(tmp_path):
    s = Served(str(tmp_path / "data"))
    c = s.client()
    c.add_relation("r", SCHEMA)
    c.append("r", _big())
    tx = c.transaction()
    tx.append("r", ups([(1, "open", 2, 1)]))
    stalled = c.replay("r", batch_rows=1000)
    next(stalled)  # the server is now blocked writing the rest
    started = time.monotonic()
    assert s.server.stop(grace=0.5) is False
    assert time.monotonic() - started < 10
    assert s.server.open_transactions == [], "open transactions are aborted even when calls are cut off"
    stalled.close()  # the client lets go: gRPC finishes its shutdown in the background
    del stalled
    s.stop()
    with sediment.open(tmp_path / "data") as eng:
        eng.seal("r", 3)
        assert eng.snapshot("r", 3).num_rows == 200_000


# --- `sediment serve` as a real process -----------------------------------------------------


def _start_serve(data: str, *extra: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str, queue.Queue]:
    """Start ``python -m sediment serve`` and wait (with a deadline) for its ready line."""
    proc = subprocess.Popen([sys.executable, "-m", "sediment", "serve", "--data-dir", data,
                             "--listen", "127.0.0.1:0", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **(env or {})})
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + 30
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            proc.kill()
            raise AssertionError("sediment serve printed no ready line within 30 s") from None
        if line is None:
            proc.wait(timeout=10)
            raise AssertionError(f"sediment serve exited {proc.returncode}: {proc.stderr.read()}")
        match = READY.match(line)
        if match:
            assert match["dir"] == os.path.abspath(data)
            return proc, match["uri"], lines


def _rest(lines: queue.Queue) -> list[str]:
    out = []
    while (line := lines.get(timeout=10)) is not None:
        out.append(line)
    return out


def test_sediment_serve_process_serves_and_stops_cleanly_on_sigterm(tmp_path):
    data = str(tmp_path / "data")
    proc, uri, lines = _start_serve(data, env={"SEDIMENT_TOKEN": TOKEN})
    try:
        with sediment.connect(uri, token=TOKEN) as c:
            c.add_relation("r", SCHEMA)
            c.add_relation("s", SCHEMA)
            c.append("r", ups([(1, "a", 1, 1), (2, "b", 2, 1)]))
            c.append_many({"r": ups([(3, "c", 3, 1)]), "s": ups([(3, "c", 3, 1)])})
            c.seal("r", 3)
            open_tx = c.transaction()
            open_tx.append("s", ups([(9, "never", 4, 1)]))  # left open when the server stops
            expected = rows(c.snapshot("r", 3))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert _rest(lines) == [f"stopped serving {data}"]
    assert "1 open transaction will be aborted" in proc.stderr.read()
    with sediment.open(data) as eng:
        assert eng.sealed("r") == 3 and rows(eng.snapshot("r", 3)) == expected == [(1, "a", 1), (2, "b", 1),
                                                                                     (3, "c", 1)]
        eng.seal("s", 10)
        assert rows(eng.snapshot("s", 10)) == [(3, "c", 1)]


def test_sediment_serve_killed_with_an_open_transaction_leaves_nothing_visible(tmp_path):
    data = str(tmp_path / "data")
    proc, uri, _lines = _start_serve(data, "--token", TOKEN)
    try:
        with sediment.connect(uri, token=TOKEN) as c:
            c.add_relation("r", SCHEMA)
            c.append("r", ups([(1, "a", 1, 1)]))
            tx = c.transaction()
            tx.append("r", ups([(2, "half", 2, 1)]))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    with sediment.open(data) as eng:
        eng.seal("r", 5)
        assert rows(eng.snapshot("r", 5)) == [(1, "a", 1)]


def test_sediment_serve_stops_within_its_grace_when_a_client_stops_reading(tmp_path):
    data = str(tmp_path / "data")
    proc, uri, lines = _start_serve(data, "--token", TOKEN, "--shutdown-grace", "0.5")
    try:
        with sediment.connect(uri, token=TOKEN) as c:
            c.add_relation("r", SCHEMA)
            c.append("r", _big())
            stalled = c.replay("r", batch_rows=1000)
            next(stalled)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
            stalled.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert _rest(lines) == [f"stopped serving {data}"]
    assert "cut off" in proc.stderr.read()
    with sediment.open(data) as eng:
        eng.seal("r", 1)
        assert eng.snapshot("r", 1).num_rows == 200_000


def test_sediment_serve_without_a_token_is_a_usage_error(tmp_path, monkeypatch, capsys):
    from sediment.cli import main

    monkeypatch.delenv("SEDIMENT_TOKEN", raising=False)
    assert main(["serve", "--data-dir", str(tmp_path / "d")]) == 2
    assert "--token" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "d"), "a refused serve creates nothing"
    assert main(["serve", "--listen", "nope"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err
