"""``SedimentFlightServer.stop()`` given no grace is still bounded (its ``stop_grace``): a
client process that opens an append stream and then idles on it, never sending an append
nor ending the stream, cannot keep the stop waiting for ever."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pyarrow as pa

import sediment
from sediment.server import DEFAULT_STOP_GRACE, SedimentFlightServer

SCHEMA = pa.schema([("id", pa.int64())])

IDLE_CLIENT = """
import sys
import pyarrow as pa
import pyarrow.flight as flight
from sediment.net.append_stream import AppendStream, append_batches, append_metadata
fc = flight.FlightClient(sys.argv[1])
options = flight.FlightCallOptions(headers=[(b"authorization", b"Bearer token")])
rows = pa.table({"id": pa.array([1], pa.int64()), "time": pa.array([1], pa.int64()),
                 "diff": pa.array([1], pa.int64())})
stream = AppendStream(fc, "r", rows.schema, options)
assert stream.append(append_batches(rows, 1 << 20), append_metadata(None, None))
print("open", flush=True)  # the server's handler took an append on it: it now waits for the next
sys.stdin.read()
"""


def test_stop_without_grace_ends_within_the_default_bound_despite_an_idle_stream(tmp_path):
    assert 0 < DEFAULT_STOP_GRACE < 120
    engine = sediment.open(tmp_path / "d", segment_bytes=1 << 20)
    bound = 2.0
    server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", "token", stop_grace=bound)
    client = sediment.connect(server.uri, token="token")
    client.add_relation("r", SCHEMA)
    client.close()
    idle = subprocess.Popen([sys.executable, "-c", IDLE_CLIENT, server.uri], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    stopper = None
    try:
        assert idle.stdout.readline().strip() == "open"
        result: list[bool] = []
        stopper = threading.Thread(target=lambda: result.append(server.stop()), daemon=True)
        started = time.monotonic()
        stopper.start()
        stopper.join(bound + 30)
        assert not stopper.is_alive(), "stop() without grace waited on the idle stream past its bound"
        assert time.monotonic() - started >= bound * 0.9
        assert result == [False]  # the idle stream's call was still running: cut off, and said so
    finally:
        idle.kill()
        idle.wait(30)
        if stopper is not None:
            stopper.join(30)
        engine.close()
