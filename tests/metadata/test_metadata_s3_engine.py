"""Engines whose metadata lives in S3 (``metadata="s3://bucket/prefix"``): the embedded
engine keeps its catalog there, and a replicated engine's coordinator can be replaced
by one on a fresh data directory that knows only the S3 spec."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from support.replication import KEY

import sediment
from sediment.metadata.names import STORAGE
from sediment.metadata.open_store import open_metadata_store

SCHEMA = pa.schema([("k", pa.int64())])
pytestmark = pytest.mark.s3


def ups(ks: list[int], t: int) -> pa.Table:
    return pa.table({"k": pa.array(ks, pa.int64()), "time": pa.array([t] * len(ks), pa.int64()),
                     "diff": pa.array([1] * len(ks), pa.int64())})



def test_embedded_engine_keeps_its_catalog_in_s3(tmp_path, s3_bucket, capsys):
    endpoint, bucket = s3_bucket
    spec = f"s3://{bucket}/meta?endpoint={endpoint}"
    options = {"metadata": spec, "blob": f"s3://{bucket}/blobs", "s3_endpoint": endpoint}
    with sediment.open(tmp_path / "d", **options) as eng:
        eng.add_relation("r", SCHEMA)
        for t in range(1, 4):
            eng.append("r", ups([t], t))
            eng.seal("r", t)
    assert not os.path.exists(tmp_path / "d" / "meta"), "no local metadata journal"
    store = open_metadata_store(spec)
    try:
        assert STORAGE in store.list("") and store.get(STORAGE) is not None
    finally:
        store.close()
    with sediment.open(tmp_path / "d", **options) as eng:
        assert eng.relations() == ["r"] and eng.sealed("r") == 3
        assert eng.snapshot("r", 3).column("k").to_pylist() == [1, 2, 3]

    from sediment.cli import main

    capsys.readouterr()
    assert main(["--data-dir", str(tmp_path / "d"), "--metadata", spec, "read", "r", "--as-of", "3"]) == 0
    assert capsys.readouterr().out.splitlines() == ['"k","diff"', "1,1", "2,1", "3,1"]


def test_replicated_engine_on_s3_metadata_moves_to_a_fresh_coordinator(tmp_path, s3_bucket, nodes):
    endpoint, bucket = s3_bucket
    spec = f"s3://{bucket}/meta?endpoint={endpoint}"
    with sediment.open(tmp_path / "first", replicas=[n.address for n in nodes], cluster_key=str(KEY),
                       metadata=spec, blob=f"s3://{bucket}/blobs", s3_endpoint=endpoint) as eng:
        eng.add_relation("r", SCHEMA)
        for t in range(1, 6):
            eng.append("r", ups([t, t + 100], t))
            eng.seal("r", t)
    with sediment.open(tmp_path / "second", metadata=spec) as eng:  # everything else from S3
        assert eng.relations() == ["r"] and eng.sealed("r") == 5
        assert sorted(eng.snapshot("r", 5).column("k").to_pylist()) == sorted(
            list(range(1, 6)) + [t + 100 for t in range(1, 6)])
        eng.append("r", ups([6], 6))
        eng.seal("r", 6)
    with sediment.open(tmp_path / "third", metadata=spec) as eng:
        assert eng.snapshot("r", 6).num_rows == 11


def test_coordinator_sigkilled_mid_stream_is_replaced_from_s3_metadata(tmp_path, s3_bucket, nodes):
    import json
    import signal
    import subprocess
    import sys

    from support.replication import COORDINATOR

    endpoint, bucket = s3_bucket
    spec = f"s3://{bucket}/meta?endpoint={endpoint}"
    options = {"replicas": [n.address for n in nodes], "cluster_key": str(KEY), "metadata": spec,
               "blob": f"s3://{bucket}/blobs", "s3_endpoint": endpoint}
    proc = subprocess.Popen([sys.executable, "-c", COORDINATOR, str(tmp_path / "first"), json.dumps(options)],
                            stdout=subprocess.PIPE, text=True)
    acked = 0
    try:
        for line in proc.stdout:
            acked = int(line)
            if acked >= 30:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert acked >= 30
    with sediment.open(tmp_path / "second", metadata=spec) as eng:
        sealed = eng.sealed("r")
        assert sealed >= acked
        assert eng.snapshot("r", sealed).column("k").to_pylist() == list(range(0, sealed + 1))
        eng.append("r", ups([sealed + 1], sealed + 1))
        eng.seal("r", sealed + 1)


def test_a_coordinator_taken_over_through_s3_metadata_is_fenced(tmp_path, s3_bucket, nodes):
    from sediment.errors import CoordinatorSuperseded, SessionFenced

    endpoint, bucket = s3_bucket
    spec = f"s3://{bucket}/meta?endpoint={endpoint}"
    old = sediment.open(tmp_path / "a", replicas=[n.address for n in nodes], cluster_key=str(KEY),
                        metadata=spec, blob=f"s3://{bucket}/blobs", s3_endpoint=endpoint)
    old.add_relation("r", SCHEMA)
    old.append("r", ups([1], 1))
    old.seal("r", 1)
    with sediment.open(tmp_path / "b", metadata=spec) as newer:
        # fenced at this write, or earlier by the ownership poll (a store without watches is
        # re-read every second): either way the write is refused and leaves nothing
        with pytest.raises((SessionFenced, CoordinatorSuperseded), match="superseded|took"):
            old.append("r", ups([99], 2))
        newer.append("r", ups([2], 2))
        newer.seal("r", 2)
        assert sorted(newer.snapshot("r", 2).column("k").to_pylist()) == [1, 2]
    old.close()
    with sediment.open(tmp_path / "c", metadata=spec) as third:
        assert 99 not in third.snapshot("r", 2).column("k").to_pylist(), "the fenced write left nothing"
