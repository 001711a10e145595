"""Bulk loads into an engine whose batches are in S3 (moto on 127.0.0.1): the load is staged
under a key prefix (engine/staging_area.py), which writers fill with objects; the commit
copies each into a spill file, checks it, gives it its footer and puts it under a batch key,
with the same checks and outcomes as a file store's load, and leaves no spill file behind."""

from __future__ import annotations

import os
from collections import Counter
from urllib.parse import parse_qs, urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sediment
from sediment.clock import ManualClock
from sediment.engine import staged
from sediment.errors import StagedFileInvalid, TimeAlreadySealed

pytestmark = pytest.mark.s3
SCHEMA = pa.schema([("id", pa.int64()), ("item", pa.string())])


@pytest.fixture
def s3_engine(tmp_path, s3_bucket):
    endpoint, bucket = s3_bucket

    def open_it():
        eng = sediment.open(tmp_path / "data", blob=f"s3://{bucket}/bulk", s3_endpoint=endpoint, clock=ManualClock(0.0))
        if "bulk" not in eng.relations():
            eng.add_relation("bulk", SCHEMA)
        return eng

    return open_it


def parquet(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="snappy")
    return sink.getvalue().to_pybytes()


def put(moto_server, location: str, name: str, table: pa.Table) -> None:
    """A writer's object under the load's prefix, put as a Spark task would."""
    parts = urlsplit(location)
    s3 = moto_server.client()
    try:
        s3.put_object(Bucket=parts.netloc, Key=parts.path.lstrip("/") + name, Body=parquet(table))
    finally:
        s3.close()


def keys(moto_server, bucket: str, prefix: str) -> list[str]:
    s3 = moto_server.client()
    try:
        return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    finally:
        s3.close()


def snapshot(eng, t: int) -> Counter:
    got = eng.snapshot("bulk", t)
    return Counter(zip(*(got.column(n).to_pylist() for n in ("id", "item", "diff")), strict=True))


def test_a_load_staged_in_s3_commits_as_pending_runs_and_leaves_nothing_behind(s3_engine, s3_bucket, moto_server):
    endpoint, bucket = s3_bucket
    with s3_engine() as eng:
        rid = eng.view.relations["bulk"].entry.id
        location = staged.stage(eng, "bulk", "job-1")
        parts = urlsplit(location)
        assert (parts.netloc, parts.path) == (bucket, f"/bulk/staging/{rid:016x}/job-1/")
        assert parse_qs(parts.query)["endpoint"] == [endpoint]
        assert keys(moto_server, bucket, "bulk/staging/") == [f"bulk/staging/{rid:016x}/job-1/_sediment-staged"]
        updates = pa.table({"id": pa.array([1, 2], pa.int64()), "item": ["a", "b"], "time": pa.array([2, 3], pa.int64()),
                            "diff": pa.array([1, 1], pa.int64())})
        put(moto_server, location, "part-00000.parquet", updates)  # the relation's updates, sorted: a run
        put(moto_server, location, "part-00001.parquet", pa.table({"item": ["c", "c"], "id": [4, 3]}))  # as it is: raw
        result = staged.commit_staged(eng, "bulk", "job-1", time=3)
        assert (result["rows"], result["runs"], result["committed"]) == (4, 2, True)
        assert keys(moto_server, bucket, "bulk/staging/") == []
        assert not [n for n in os.listdir(eng.traces.spill_dir) if not n.startswith(".")]  # the copies are gone
        refs = eng.view.relations["bulk"].trace.pending
        assert sorted(r.raw for r in refs) == [False, True]
        assert {f"bulk/{r.key}" for r in refs} <= set(keys(moto_server, bucket, "bulk/trace/"))
        assert staged.commit_staged(eng, "bulk", "job-1", time=3)["committed"] is False  # a retry changes nothing
        eng.seal("bulk", 3)
        assert snapshot(eng, 3) == Counter({(1, "a", 1): 1, (2, "b", 1): 1, (3, "c", 1): 1, (4, "c", 1): 1})
    with s3_engine() as eng:  # the committed runs are read from S3 after a restart
        assert snapshot(eng, 3) == Counter({(1, "a", 1): 1, (2, "b", 1): 1, (3, "c", 1): 1, (4, "c", 1): 1})


def test_refused_aborted_and_swept_s3_loads_change_nothing(s3_engine, s3_bucket, moto_server):
    _endpoint, bucket = s3_bucket
    with s3_engine() as eng:
        eng.seal("bulk", 3)
        location = staged.stage(eng, "bulk", "job-2")
        put(moto_server, location, "part-00000.parquet", pa.table({"id": [1], "item": ["a"]}))
        with pytest.raises(TimeAlreadySealed, match="sealed through time 3"):
            staged.commit_staged(eng, "bulk", "job-2", time=3)
        assert eng.trace_info("bulk")["pending"] == 0 and len(keys(moto_server, bucket, "bulk/staging/")) == 2
        assert staged.abort_staged(eng, "bulk", "job-2") == 2  # the writer's object and the marker
        assert keys(moto_server, bucket, "bulk/staging/") == []

        location = staged.stage(eng, "bulk", "job-3")  # swept while its writer runs: what it puts back is refused
        assert staged.sweep_staging(eng.traces.blobs) == [f"{eng.view.relations['bulk'].entry.id:016x}"]
        put(moto_server, location, "part-00000.parquet", pa.table({"id": [2], "item": ["b"]}))
        with pytest.raises(StagedFileInvalid, match="not staged since the coordinator opened"):
            staged.commit_staged(eng, "bulk", "job-3", time=4)
        staged.stage(eng, "bulk", "job-4")
    with s3_engine() as eng:  # a restart collects every staged load, and none of them commits
        assert keys(moto_server, bucket, "bulk/staging/") == []
        with pytest.raises(StagedFileInvalid, match="not staged since the coordinator opened"):
            staged.commit_staged(eng, "bulk", "job-4", time=4)
        location = staged.stage(eng, "bulk", "job-5")
        put(moto_server, location, "part-00000.parquet", pa.table({"id": [5], "item": ["e"]}))
        eng.drop_relation("bulk")  # its loads' objects go with it
        assert keys(moto_server, bucket, "bulk/staging/") == []
