"""Engines whose metadata lives in S3 (``metadata="s3://bucket/prefix"``): the embedded
engine keeps its catalog there, and a replicated engine's coordinator can be replaced
by one on a fresh data directory that knows only the S3 spec."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from test_replication import KEY, Node

import sediment
from sediment.engine.metadata.names import STORAGE
from sediment.engine.metadata.open_store import open_metadata_store

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


def test_replicated_engine_on_s3_metadata_moves_to_a_fresh_coordinator(tmp_path, s3_bucket):
    endpoint, bucket = s3_bucket
    spec = f"s3://{bucket}/meta?endpoint={endpoint}"
    nodes = [Node(tmp_path / f"node{i}") for i in range(3)]
    for n in nodes:
        n.start()
    try:
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
    finally:
        for n in nodes:
            if n.proc is not None:
                n.kill()
