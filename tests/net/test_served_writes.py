"""Served write paths under faults: a ``sediment serve`` process killed by its PID and
started again at its address between the calls of one write, a server that stops
answering (SIGSTOP) under a client's deadline, staged tables of a client that went away."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from urllib.parse import urlparse

import pyarrow as pa
import pytest
from support.cut_proxy import CutProxy
from support.served import Served, serve_again

import sediment
from sediment import errors
from sediment.client import Client
from sediment.clock import ManualClock
from sediment.net.messages import Action, Put, encode
from sediment.server import DEFAULT_TXN_IDLE_TIMEOUT, SedimentFlightServer

SCHEMA = pa.schema([("id", pa.int64())])


def ups(ids, t=1):
    return pa.table({"id": pa.array(ids, pa.int64()), "time": pa.array([t] * len(ids), pa.int64()),
                     "diff": pa.array([1] * len(ids), pa.int64())})


def test_append_many_after_a_restart_lost_its_stage_is_refused_not_acknowledged(tmp_path):
    """The tables of an append_many wait in the server's memory between the stage puts and
    the append_many action; a server killed and started again meanwhile has none of them,
    and the append_many must fail with nothing written instead of appending nothing and
    answering success."""
    data = tmp_path / "data"
    first = Served(data)
    port = urlparse(first.uri).port
    second = None
    try:
        with sediment.connect(first.uri, token=first.token) as client:
            client.add_relation("r", SCHEMA)
            stage = uuid.uuid4().hex
            client._put(encode(Put.STAGE, relation="r", stage=stage), ups([1, 2, 3]))
        first.kill()
        second = serve_again(data, port, first.token)
        with sediment.connect(second.uri, token=second.token) as client:  # the old channel saw the kill
            with pytest.raises(errors.NothingWritten, match=stage):
                client._action(Action.APPEND_MANY, stage=stage)
            client.seal("r", 1)
            assert client.snapshot("r", 1).num_rows == 0
            client.append_many({"r": ups([4], t=2)})  # a whole append_many after the restart works
            client.seal("r", 2)
            assert client.snapshot("r", 2).column("id").to_pylist() == [4]
    finally:
        first.kill()
        if second is not None:
            second.kill()


def test_a_call_past_its_deadline_is_outcome_unknown_not_a_raw_flight_error(tmp_path):
    """A client with a timeout whose server stops answering (SIGSTOP: the connection stays up,
    no reply comes) gets sediment's typed error for a call that may have been carried out,
    for actions (a seal, a commit) and reads alike, not pyarrow's FlightTimedOutError."""
    server = Served(tmp_path / "data")
    try:
        with sediment.connect(server.uri, token=server.token, timeout=2.0) as client:
            client.add_relation("r", SCHEMA)
            tx = client.transaction()
            tx.append("r", ups([1]))
            os.kill(server.proc.pid, signal.SIGSTOP)
            try:
                with pytest.raises(errors.CallTimedOut, match="deadline"):
                    client.seal("r", 5)
                with pytest.raises(errors.OutcomeUnknown, match="may or may not"):
                    tx.commit()
                assert tx.state == "open"  # not known to be committed, nor aborted
                with pytest.raises(errors.OutcomeUnknown):
                    client.snapshot("r", 0)
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            assert client.sealed("r") in (-1, 5)  # answered again; the seal sent before may have landed
    finally:
        server.kill()


@contextlib.contextmanager
def _commit_answer_lost(tmp_path):
    """A served process behind a proxy; a transaction with one row whose commit the server
    carried out and whose answer the proxy withheld, then the server SIGKILLed and started
    again on its port: yields (the transaction, the failure the commit raised, the ids a
    direct client reads once it seals); stops everything after."""
    data = tmp_path / "data"
    server = Served(data)
    proxy = CutProxy()
    proxy.upstream = server.uri
    client = sediment.connect(proxy.uri, token=server.token)
    client.add_relation("r", SCHEMA)
    tx = client.transaction()
    tx.append("r", ups([7]))
    failure: list[BaseException] = []

    def commit() -> None:
        try:
            tx.commit()
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            failure.append(exc)

    proxy.arm(b"commit")
    committer = threading.Thread(target=commit)
    committer.start()
    assert proxy.triggered.wait(30)
    with sediment.connect(server.uri, token=server.token) as direct:
        end = time.monotonic() + 30
        while direct._action(Action.TXN_STATE, txn=tx.id) != "committed":  # each check is a round trip
            assert time.monotonic() < end, "the server never committed"
    server.kill()
    committer.join(60)
    assert not committer.is_alive() and len(failure) == 1
    again = serve_again(data, urlparse(server.uri).port, server.token)

    def visible() -> list[int]:
        with sediment.connect(again.uri, token=server.token) as direct:
            direct.seal("r", 1)
            return direct.snapshot("r", 1).column("id").to_pylist()

    try:
        yield tx, failure[0], visible
    finally:
        client.close()
        proxy.close()
        again.kill()


def test_a_commit_retried_after_its_answer_was_lost_and_the_server_restarted_is_not_called_aborted(tmp_path):
    """The commit landed (the log has its COMMIT), the answer was lost, the server restarted
    and no longer knows the transaction: a retried commit must not report it aborted (the
    row is visible); its outcome is unknown to the client."""
    with _commit_answer_lost(tmp_path) as (tx, first, visible):
        assert isinstance(first, errors.CoordinatorUnavailable | errors.OutcomeUnknown)
        assert tx.state == "open"
        with pytest.raises(errors.OutcomeUnknown, match="may have"):
            tx.commit()
        assert tx.state != "aborted"
        assert visible() == [7]


def test_an_abort_after_a_commit_whose_answer_was_lost_does_not_claim_the_committed_rows_gone(tmp_path):
    """The same lost answer; the caller cleans up with abort(). The server (restarted) cannot
    say what became of it, and the rows are visible: abort must not leave the transaction
    reading ``aborted`` as if nothing was written; it raises OutcomeUnknown."""
    with _commit_answer_lost(tmp_path) as (tx, _first, visible):
        with pytest.raises(errors.OutcomeUnknown):
            tx.abort()
        assert tx.state != "aborted"
        assert visible() == [7]


STAGING_CLIENT = """
import sys
import pyarrow as pa
import sediment
from sediment.net.messages import Put, encode
c = sediment.connect(sys.argv[1], token=sys.argv[2])
n = 100_000
table = pa.table({"id": pa.array(range(n), pa.int64()), "time": pa.array([1] * n, pa.int64()),
                  "diff": pa.array([1] * n, pa.int64())})
c._put(encode(Put.STAGE, relation="r", stage="left-behind"), table)
print("staged", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("txn_idle_timeout", [10.0, None])
def test_tables_staged_by_a_client_that_was_killed_are_dropped_once_idle(tmp_path, txn_idle_timeout):
    """A client process SIGKILLed between its stage puts and its append_many leaves tables in
    the server's memory; they go after ``txn_idle_timeout`` without a call naming them (the
    server's clock), as an idle transaction does, instead of until the server stops; with
    transactions that never time out (None), after the default timeout."""
    clock = ManualClock(1000.0)
    token = "t-" + uuid.uuid4().hex
    engine = sediment.open(str(tmp_path / "data"), segment_bytes=1 << 20)
    server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", token, txn_idle_timeout=txn_idle_timeout, clock=clock)
    idle = txn_idle_timeout if txn_idle_timeout is not None else DEFAULT_TXN_IDLE_TIMEOUT
    proc = subprocess.Popen([sys.executable, "-c", STAGING_CLIENT, server.uri, token], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        engine.add_relation("r", SCHEMA)
        assert proc.stdout.readline().strip() == "staged"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        assert server.staged_rows == 100_000
        clock.advance(idle * 0.6)
        assert server.reap_idle_stages() == []
        assert server.staged_rows == 100_000  # not idle long enough
        clock.advance(idle * 0.6)
        assert server.reap_idle_stages() == ["left-behind"]
        assert server.staged_rows == 0
        with Client(server.uri, token) as client:
            with pytest.raises(errors.StageMissing, match="left-behind"):
                client._action(Action.APPEND_MANY, stage="left-behind")
            with pytest.raises(errors.StageMissing, match="dropped"):  # no part of it can come back
                client._put(encode(Put.STAGE, relation="r", stage="left-behind"), ups([1]))
            client.append_many({"r": ups([1])})
        engine.seal("r", 1)
        assert engine.snapshot("r", 1).column("id").to_pylist() == [1]
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
        server.stop()
        engine.close()


def test_malformed_alter_and_add_relation_bodies_are_refused_typed_and_change_nothing(tmp_path):
    """A client other than sediment's (any JSON can reach the server) sends ``drop`` as a
    string: it was taken letter by letter and dropped columns ``a`` and ``b`` of the
    relation; a schema that is not base64 Arrow IPC came back as ServerError."""
    token = "t-" + uuid.uuid4().hex
    engine = sediment.open(str(tmp_path / "data"))
    server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", token)
    try:
        with Client(server.uri, token) as client:
            client.add_relation("r", pa.schema([("a", pa.int64()), ("b", pa.int64()), ("c", pa.int64())]))
            with pytest.raises(errors.InvalidArgument, match="drop"):
                client._action(Action.ALTER_RELATION, name="r", drop="ab")
            with pytest.raises(errors.InvalidArgument, match="rename"):
                client._action(Action.ALTER_RELATION, name="r", rename=[["a", "z"]])
            with pytest.raises(errors.InvalidArgument, match="add"):
                client._action(Action.ALTER_RELATION, name="r", add="not base64 IPC")
            assert client.schema("r").names == ["a", "b", "c"] and client.schema_version("r") == 0
            with pytest.raises(errors.InvalidArgument, match="schema"):
                client._action(Action.ADD_RELATION, name="q", schema="AAAA")
            assert client.relations() == ["r"]
    finally:
        server.stop()
        engine.close()


def test_a_transaction_group_that_is_not_text_is_refused_before_anything_is_begun(tmp_path):
    """``begin`` with a group that is a list was taken as the group named "['x']" and opened a
    transaction; it is refused with InvalidArgument and no transaction is left open."""
    token = "t-" + uuid.uuid4().hex
    engine = sediment.open(str(tmp_path / "data"))
    server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", token)
    try:
        with Client(server.uri, token) as client:
            for group in (["x"], {"a": 1}, 5):
                with pytest.raises(errors.InvalidArgument, match="group"):
                    client._action(Action.BEGIN, group=group)
                with pytest.raises(errors.InvalidArgument, match="group"):
                    client._action(Action.ABORT_GROUP, group=group)
            assert server.open_transactions == []
            assert client.transaction(group="job-1").id in server.open_transactions
    finally:
        server.stop()
        engine.close()
