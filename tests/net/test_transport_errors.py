"""Flight's own errors (no sediment detail from the server) reach users as sediment's typed
errors, whose class says whether the call may have been carried out (OutcomeUnknown) or
not (NothingWritten): a cancelled stream, a server SIGKILLed in the middle of a call, and
each other kind of Flight error."""

from __future__ import annotations

import signal
import threading
import time

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from support.served import Served, served_engine

import sediment
from sediment import errors
from sediment.net.messages import Get
from sediment.net.wire_errors import transport_error, typed_error

SCHEMA = pa.schema([("id", pa.int64())])


def test_a_cancelled_stream_is_call_cancelled_an_outcome_unknown(tmp_path):
    with served_engine(tmp_path / "d", "token", SCHEMA) as (_engine, _server, client):
        with pytest.raises(errors.CallCancelled) as cancelled, client._remote():
            reader = client._get(Get.SUBSCRIBE, relation="r", as_of=0)
            reader.read_chunk()
            reader.cancel()
            reader.read_chunk()
        assert isinstance(cancelled.value, errors.OutcomeUnknown)
        assert "cancelled" in str(cancelled.value) and "\n" not in str(cancelled.value)


def test_a_server_killed_mid_call_is_a_typed_error(tmp_path):
    served = Served(tmp_path / "data")
    client = sediment.connect(served.uri, token=served.token)
    try:
        client.add_relation("r", SCHEMA)
        client.seal("r", 0)
        with pytest.raises(errors.SedimentError) as broken, client._remote():
            reader = client._get(Get.SUBSCRIBE, relation="r", as_of=0)
            reader.read_chunk()
            served.proc.send_signal(signal.SIGKILL)
            served.proc.wait(timeout=30)
            while True:
                reader.read_chunk()
        assert not isinstance(broken.value, flight.FlightError | errors.NothingWritten)
        assert isinstance(broken.value, errors.CoordinatorUnavailable | errors.OutcomeUnknown)
    finally:
        client.close()
        served.kill()


@pytest.mark.parametrize(("raised", "expected", "kind"), [
    (flight.FlightInternalError, errors.TransportFailed, errors.OutcomeUnknown),
    (flight.FlightServerError, errors.TransportFailed, errors.OutcomeUnknown),
    (flight.FlightCancelledError, errors.CallCancelled, errors.OutcomeUnknown),
    (flight.FlightUnauthorizedError, errors.CallRefused, errors.NothingWritten),
    (flight.FlightTimedOutError, errors.CallTimedOut, errors.OutcomeUnknown),
])
def test_every_flight_error_without_detail_is_typed_by_whether_it_may_have_run(raised, expected, kind):
    exc = raised("Received RST_STREAM with error code 2.\ngRPC client debug context: ...")
    typed = typed_error(exc)
    assert type(typed) is expected and isinstance(typed, kind)
    assert "RST_STREAM" in str(typed) and "\n" not in str(typed)
    assert type(transport_error(exc)) is expected


def _bytes_waiting_at(port: int) -> int:
    """Bytes the kernel holds unread for the sockets on local ``port`` (IPv4, or IPv6 with
    mapped addresses, as gRPC listens): a call sent to a stopped server waits there."""
    waiting = 0
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(path) as table:
            for line in table.readlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    waiting += int(fields[4].split(":")[1], 16)
    return waiting


CALLS = {
    "add_relation": lambda c: c.add_relation("s", SCHEMA),
    "seal": lambda c: c.seal("r", 5),
    "append": lambda c: c.append("r", pa.table({"id": [2], "time": [2], "diff": [1]})),
    "snapshot": lambda c: c.snapshot("r", 1),
    "compact": lambda c: c.compact("r"),
    "stats": lambda c: c.stats(),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_server_killed_while_a_call_waits_on_it_is_a_typed_error(tmp_path, call):
    """The call reached the server (its bytes wait in the stopped server's socket), then the
    server dies: the caller gets, in bounded time, an error that does not say the call was not
    carried out, because it may have been."""
    served = Served(tmp_path / "data")
    client = sediment.connect(served.uri, token=served.token)
    port = int(served.uri.rsplit(":", 1)[1])
    try:
        client.add_relation("r", SCHEMA)
        client.append("r", pa.table({"id": [1], "time": [1], "diff": [1]}))
        served.proc.send_signal(signal.SIGSTOP)
        before = _bytes_waiting_at(port)
        outcome: list[BaseException | None] = []

        def run() -> None:
            try:
                CALLS[call](client)
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - the test inspects it
                outcome.append(exc)

        caller = threading.Thread(target=run, daemon=True)
        caller.start()
        deadline = time.monotonic() + 20
        while _bytes_waiting_at(port) <= before and time.monotonic() < deadline:
            caller.join(0.01)
        assert _bytes_waiting_at(port) > before, "the call never reached the server's socket"
        served.kill()
        caller.join(30)
        assert not caller.is_alive(), f"{call} hung after the server died"
        [raised] = outcome
        assert isinstance(raised, errors.CoordinatorUnavailable | errors.OutcomeUnknown), repr(raised)
        assert not isinstance(raised, errors.NothingWritten)
    finally:
        client.close()
        served.kill()
