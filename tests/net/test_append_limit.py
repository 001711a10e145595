"""The server's bound on one append (``max_append_bytes``, ``serve --max-append-bytes``): it
holds a whole append before applying it, all or nothing, so without a bound one client's append
could take all of its memory. A larger append is refused as InvalidArgument, nothing of it
applied, and the stream it came on goes on serving the client's next appends."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pytest

import sediment
from sediment import errors
from sediment.client import Client
from sediment.server import SedimentFlightServer

SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.binary())])
LIMIT = 64 << 10
TOKEN = "t-limit"


def table(first: int, n: int, payload: int = 100) -> pa.Table:
    return pa.table({"id": pa.array(range(first, first + n), pa.int64()),
                     "payload": pa.array([os.urandom(payload)] * n, pa.binary()),
                     "time": pa.array([1] * n, pa.int64()), "diff": pa.array([1] * n, pa.int64())})


@pytest.fixture
def limited(tmp_path):
    engine = sediment.open(str(tmp_path / "d"))
    engine.add_relation("r", SCHEMA)
    server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", TOKEN, close_engine=True, max_append_bytes=LIMIT)
    client = Client(server.uri, TOKEN)
    yield engine, client
    client.close()
    server.stop(grace=30)


def ids(engine) -> list[int]:
    if engine.sealed("r") < 1:
        engine.seal("r", 1)
    return sorted(engine.snapshot("r", 1).column("id").to_pylist())


def test_an_append_over_the_bound_is_refused_and_the_stream_goes_on(limited):
    engine, client = limited
    client.append("r", table(0, 10))
    for big in (table(100, 2_000), table(100, 120_000)):  # one batch over the bound, then several (4 MiB each)
        with pytest.raises(errors.InvalidArgument, match=f"more than {LIMIT} bytes") as err:
            client.append("r", big)
        assert "\n" not in str(err.value) and "--max-append-bytes" in str(err.value)
    client.append("r", table(10, 10))  # the same stream, still served
    with client.pipelined("r") as pipe:
        pipe.append(table(20, 5))
        pipe.append(table(1_000, 2_000))
        with pytest.raises(errors.InvalidArgument, match="more than"):
            pipe.flush()
    assert ids(engine) == list(range(25))


def test_a_staged_table_over_the_bound_is_refused_and_nothing_is_applied(limited):
    engine, client = limited
    with pytest.raises(errors.InvalidArgument, match=f"more than {LIMIT} bytes"):
        client.append_many({"r": table(0, 2_000)})
    client.append_many({"r": table(0, 3)})
    assert ids(engine) == [0, 1, 2]


def test_the_bound_must_be_a_positive_int(tmp_path):
    with sediment.open(str(tmp_path / "d")) as engine:
        for bad in (0, -1, 1.5, True, "1"):
            with pytest.raises(errors.InvalidArgument, match="max_append_bytes"):
                SedimentFlightServer(engine, "grpc://127.0.0.1:0", TOKEN, max_append_bytes=bad)
    done = subprocess.run([sys.executable, "-m", "sediment", "serve", "--data-dir", str(tmp_path / "new"),
                           "--max-append-bytes", "0"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SEDIMENT_TOKEN": TOKEN})
    assert done.returncode == 2 and "invalid size '0'" in done.stderr
    assert not (tmp_path / "new").exists()
