"""gRPC's inline polling (sediment/net/grpc_setup.py): a client process that waits for each
append's acknowledgement blocks about once per append instead of handing every message
between gRPC's threads, and a GRPC_EXPERIMENTS the user set is left alone. Real server,
real client processes on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pyarrow as pa
import pytest

import sediment
from sediment.net import grpc_setup
from sediment.server import SedimentFlightServer

TOKEN = "grpc-" + uuid.uuid4().hex
APPENDS = 300

# A client process: connect (gRPC's first use there), append APPENDS 1,000-row tables one
# after the other, print its voluntary context switches per append and GRPC_EXPERIMENTS.
_CLIENT = """
import json, os, resource, sys
import pyarrow as pa
import sediment
uri, token, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = 1000
table = pa.table({"id": pa.array(range(rows), pa.int64()), "payload": pa.array([b"x" * 76] * rows),
                  "time": pa.array([1] * rows, pa.int64()), "diff": pa.array([1] * rows, pa.int64())})
with sediment.connect(uri, token) as client:
    client.append("r", table)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
    for _ in range(n):
        client.append("r", table)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
print(json.dumps({"switches": (after - before) / n, "experiments": os.environ.get("GRPC_EXPERIMENTS")}))
"""


@pytest.fixture
def server(tmp_path):
    engine = sediment.open(str(tmp_path / "data"))
    engine.add_relation("r", pa.schema([("id", pa.int64()), ("payload", pa.binary())]))
    srv = SedimentFlightServer(engine, "grpc://127.0.0.1:0", TOKEN, close_engine=True)
    yield srv
    srv.stop(grace=30)


def _client_run(uri: str, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", _CLIENT, uri, TOKEN, str(APPENDS)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_waiting_client_blocks_about_once_per_append(server):
    env = {k: v for k, v in os.environ.items() if k != grpc_setup.EXPERIMENTS_ENV}
    inline = _client_run(server.uri, env)
    assert inline["experiments"] == grpc_setup.INLINE_POLLING
    # the wait for the acknowledgement, and at times the send: gRPC's event engine took 5-6
    assert inline["switches"] < 3.0, inline
    handed = _client_run(server.uri, {**env, grpc_setup.EXPERIMENTS_ENV: ""})  # the user's choice: gRPC's defaults
    assert handed["experiments"] == ""
    assert handed["switches"] > inline["switches"] + 1.0, (inline, handed)


def test_a_setting_the_user_made_is_kept(monkeypatch):
    monkeypatch.setenv(grpc_setup.EXPERIMENTS_ENV, "-event_engine_dns")
    assert grpc_setup.apply() is False
    assert os.environ[grpc_setup.EXPERIMENTS_ENV] == "-event_engine_dns"
    monkeypatch.delenv(grpc_setup.EXPERIMENTS_ENV)
    assert grpc_setup.apply() is True
    assert os.environ[grpc_setup.EXPERIMENTS_ENV] == grpc_setup.INLINE_POLLING
