"""Served write paths under faults: a ``sediment serve`` process killed by its PID and
started again at its address between the calls of one write, a server that stops
answering (SIGSTOP) under a client's deadline, staged tables of a client that went away."""

from __future__ import annotations

import os
import signal
import uuid
from urllib.parse import urlparse

import pyarrow as pa
import pytest
from support.ports import ADDRESS_IN_USE, restart_on_port
from support.served import Served

import sediment
from sediment import errors
from sediment.net.messages import Action, Put, encode

SCHEMA = pa.schema([("id", pa.int64())])


def ups(ids, t=1):
    return pa.table({"id": pa.array(ids, pa.int64()), "time": pa.array([t] * len(ids), pa.int64()),
                     "diff": pa.array([1] * len(ids), pa.int64())})


def serve_again(data, port: int, token: str) -> Served:
    """``sediment serve`` on 127.0.0.1:PORT again (after a kill), waiting for the port."""

    def attempt() -> Served | None:
        try:
            return Served(data, "--listen", f"127.0.0.1:{port}", token=token)
        except AssertionError as exc:
            if ADDRESS_IN_USE in str(exc) or "port in use" in str(exc):
                return None
            raise

    return restart_on_port(port, attempt, "sediment serve")


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
