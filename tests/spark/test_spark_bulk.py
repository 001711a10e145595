"""Bulk loads from Spark (``option("bulk", "true")``, spark_jobs/bulk_write.py) in a real local
session against a Flight coordinator on 127.0.0.1: the same reads as the row-by-row path,
no WAL records, a retried task attempt committed once, a failed job leaving nothing."""

from __future__ import annotations

import os
import random
from collections import Counter

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest

pytest.importorskip("pyspark", reason="the Spark tests need PySpark (pip install -e '.[test]')")

from pyspark.sql import functions as F  # noqa: E402
from support.fixtures_spark import ids_failing_at  # noqa: E402

from sediment.client import Client  # noqa: E402
from sediment.errors import InvalidArgument, SchemaMismatch  # noqa: E402
from sediment.spark_jobs import bulk_write, ingest, options  # noqa: E402
from sediment.spark_jobs.batch_write import SedimentWriter  # noqa: E402
from sediment.spark_jobs.errors import sediment_errors  # noqa: E402
from sediment.spark_jobs.session import JobUsageError  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("item", pa.string())])


def write(df, c, relation, **options):
    w = df.write.format("sediment").mode("append")
    for key, value in {**c.options(relation), **options}.items():
        w = w.option(key, value)
    with sediment_errors():
        w.save()


def raw(c, relation, as_of) -> Counter:
    """The relation's consolidated updates at times <= as_of: (id, item, time) -> diff."""
    got = c.engine.snapshot(relation, as_of)
    return Counter(zip(got.column("id").to_pylist(), got.column("item").to_pylist(), got.column("diff").to_pylist(),
                       strict=True))


def staging_left(c) -> list[str]:
    root = os.path.join(c.engine.data_dir, "blobs", "staging")
    return [os.path.join(d, f) for d, _s, fs in os.walk(root) for f in fs] if os.path.isdir(root) else []


def updates_frame(spark, n=3_000, seed=27):
    rnd = random.Random(seed)
    data = [(rnd.randrange(n // 3), rnd.choice(["tea", "jam", None]), rnd.randrange(2, 6), rnd.choice([1, 1, -1, 2]))
            for _ in range(n)]
    return spark.createDataFrame(data, "id long, item string, time long, diff long").repartition(3), data


def test_bulk_and_row_by_row_writes_read_back_the_same(spark, coordinator):
    c = coordinator(compact_interval=None)
    for name in ("rows", "bulk"):
        c.engine.add_relation(name, SCHEMA)
        c.engine.seal(name, 1)
    df, data = updates_frame(spark)
    write(df, c, "rows")
    write(df, c, "bulk", bulk="true")
    bulk_id = c.engine.view.relations["bulk"].entry.id
    assert not [r for r in c.engine.wal.scan() if r.kind.name == "UPDATES" and r.relation_id == bulk_id]
    assert c.engine.trace_info("bulk")["pending"] >= 1 and staging_left(c) == []
    for t in range(2, 6):
        for name in ("rows", "bulk"):
            c.engine.seal(name, t)
        expected = Counter()
        for i, item, time, d in data:
            if time <= t:
                expected[(i, item)] += d
        assert raw(c, "bulk", t) == raw(c, "rows", t) == Counter({(*k, v): 1 for k, v in expected.items() if v})
    c.engine.compact()
    assert raw(c, "bulk", 5) == raw(c, "rows", 5)
    plain = spark.createDataFrame([(7, "x"), (8, None)], "id long, item string")
    write(plain, c, "bulk", bulk="true", seal="true")  # time: the next open time, then sealed
    assert c.engine.sealed("bulk") == 6 and raw(c, "bulk", 6)[(7, "x", 1)] == 1


def test_both_write_paths_refuse_option_diff_0_and_take_rows_of_diff_0_as_no_updates(spark, coordinator):
    """A diff of 0 is no update: Engine.append takes such a row and it consolidates away.
    ``option("diff", 0)`` makes every row of a write one, so the row path and the bulk path
    both refuse it, naming the option, before anything is written (the row path took it and
    wrote nothing visible; the bulk path refused only at its commit, after Spark had written
    the files). Rows of a ``diff`` column that are 0 are taken by both as no updates, and the
    two read back the same."""
    c = coordinator(compact_interval=None)
    for name in ("rows", "bulk"):
        c.engine.add_relation(name, SCHEMA)
        c.engine.seal(name, 1)
    df = spark.createDataFrame([(1, "a"), (2, "b")], "id long, item string")
    for name, extra in (("rows", {}), ("bulk", {"bulk": "true"})):
        before = c.engine.trace_info(name)
        with pytest.raises(InvalidArgument, match=r"^option 'diff' is 0: a diff of 0 is no update.*nothing was written$"):
            write(df, c, name, diff=0, time=2, **extra)
        assert c.engine.trace_info(name) == before and staging_left(c) == []
    with pytest.raises(JobUsageError, match=r"^--diff 0: a diff of 0 is no update"):
        ingest.parse_args(["--uri", c.uri, "--relation", "rows", "--input", "in.csv", "--diff", "0"])
    zeros = spark.createDataFrame([(1, "a", 2, 0), (2, "b", 2, 1), (3, "c", 2, 0), (3, "c", 3, 0), (4, "d", 3, -1)],
                                  "id long, item string, time long, diff long")
    write(zeros, c, "rows")
    write(zeros, c, "bulk", bulk="true")
    for name in ("rows", "bulk"):
        c.engine.seal(name, 3)
    assert raw(c, "rows", 3) == raw(c, "bulk", 3) == Counter({(2, "b", 1): 1, (4, "d", -1): 1})


def test_a_retried_task_attempt_is_committed_once(spark, coordinator):
    c = coordinator(compact_interval=None)
    c.engine.add_relation("bulk", SCHEMA)

    @F.udf("long", useArrow=False)
    def flaky(i):
        from pyspark import TaskContext

        if i == 3_999 and TaskContext.get().attemptNumber() == 0:
            raise RuntimeError("first attempt fails")
        return i

    df = spark.range(0, 4_000, numPartitions=2).select(flaky("id").alias("id"), F.lit("tea").alias("item"))
    write(df, c, "bulk", bulk="true", time=5, seal="true")
    got = c.engine.snapshot("bulk", 5)
    assert sorted(got.column("id").to_pylist()) == list(range(4_000))
    assert set(got.column("diff").to_pylist()) == {1}
    assert staging_left(c) == []


def test_a_failed_job_leaves_nothing_and_its_staged_files_are_collected(spark, coordinator):
    c = coordinator(compact_interval=None)
    c.engine.add_relation("bulk", SCHEMA)


    df = ids_failing_at(spark, 399).select("id", F.lit("tea").alias("item"))
    with pytest.raises(Exception, match="boom in one task"):
        write(df, c, "bulk", bulk="true", time=5, seal="true")
    assert c.engine.sealed("bulk") == -1 and c.engine.trace_info("bulk")["pending"] == 0
    assert staging_left(c) == []
    c.engine.seal("bulk", 5)
    assert c.engine.snapshot("bulk", 5).num_rows == 0


def first_reply_lost(monkeypatch) -> list[dict]:
    """The first bulk commit lands but its reply is lost (a reset connection); every reply the
    coordinator sent, in order."""
    plain, calls = Client.bulk_commit, []

    def losing(self, *args, **kwargs):
        calls.append(plain(self, *args, **kwargs))
        if len(calls) == 1:
            raise flight.FlightUnavailableError("Connection reset by peer")
        return calls[-1]

    monkeypatch.setattr(Client, "bulk_commit", losing)
    return calls


def test_a_bulk_commit_whose_reply_is_lost_is_asked_again_and_the_save_succeeds(spark, coordinator, monkeypatch):
    """The coordinator commits, the reply is lost on its way to the driver: the driver asks
    again with the same job (spark_jobs/bulk_commit.py) instead of aborting and failing, so
    the rows are there once and the save reports success."""
    c = coordinator(compact_interval=None)
    c.engine.add_relation("bulk", SCHEMA)
    calls = first_reply_lost(monkeypatch)
    write(spark.createDataFrame([(1, "a"), (2, "b")], "id long, item string"), c, "bulk", bulk="true", time=5,
          seal="true")
    assert [r["committed"] for r in calls] == [True, False]
    assert sorted(c.engine.snapshot("bulk", 5).column("id").to_pylist()) == [1, 2]
    assert staging_left(c) == []


def test_a_retry_that_finds_the_load_committed_still_seals_at_the_frame_s_last_time(spark, coordinator, monkeypatch):
    """The frame carries its own times and the save asks for a seal; the first commit's reply
    is lost and the retry finds the load committed: it reports the rows and last time the
    first commit kept, and the save seals there instead of silently skipping the seal."""
    c = coordinator(compact_interval=None)
    c.engine.add_relation("bulk", SCHEMA)
    calls = first_reply_lost(monkeypatch)
    df = spark.createDataFrame([(1, "a", 4, 1), (2, "b", 7, 1)], "id long, item string, time long, diff long")
    write(df, c, "bulk", bulk="true", seal="true")
    assert [(r["committed"], r["rows"], r["max_time"]) for r in calls] == [(True, 2, 7), (False, 2, 7)]
    assert c.engine.sealed("bulk") == 7


def test_bulk_refusals_are_typed_and_change_nothing(spark, coordinator):
    c = coordinator(compact_interval=None)
    c.engine.add_relation("bulk", pa.schema([("id", pa.uint32()), ("item", pa.string())]))
    df = spark.createDataFrame([(1, "a")], "id long, item string")
    with pytest.raises(SchemaMismatch, match="staged file"):  # Spark writes no unsigned type
        write(df, c, "bulk", bulk="true", time=3)
    assert c.engine.trace_info("bulk")["pending"] == 0 and staging_left(c) == []
    with pytest.raises(InvalidArgument, match="register"):  # a session without the hook: the source refuses
        SedimentWriter({**c.options("bulk"), "bulk": "true"}, df.schema, False)
    assert bulk_write.BULK in options.BATCH_WRITE


def spark_read(spark, c, relation, as_of) -> list:
    df = spark.read.format("sediment").options(**c.options(relation)).option("asOf", as_of).load()
    return Counter(tuple(r) for r in df.collect())


def replayed(c, relation) -> tuple[list, Counter]:
    """The time-ordered replay's times in order, and its updates summed by (row, time) (the row
    path's WAL tail holds a repeated update twice, a raw run once with the diffs summed)."""
    times, sums = [], Counter()
    for b in c.engine.replay(relation):
        for i, item, t, d in zip(*b.to_pydict().values(), strict=True):
            times.append(t)
            sums[(i, item, t)] += d
    return sorted(times) == times, +sums


def test_a_frame_is_written_as_df_write_parquet_writes_it_and_reads_the_same(spark, coordinator):
    """Frames with the relation's columns and types (and time, or a load time) are written by
    Spark as they are: no projection, no sort, no diff column; their files are kept as raw
    runs. An ordered frame, one whose (row, time) repeat and a shuffled one read back as the
    row path's (snapshots, time-ordered replay, Spark reads) before background compaction
    rewrites the raw runs and after; a frame with a diff column still goes as updates."""
    c = coordinator(compact_interval=None)
    ranged = spark.range(0, 3_000, numPartitions=2).select(
        "id", F.concat(F.lit("i"), (F.col("id") % 7).cast("string")).alias("item"), (4 - F.col("id") % 3).alias("time"))
    twice = ranged.union(ranged).coalesce(1).sortWithinPartitions("id")
    with_diff, _data = updates_frame(spark)
    frames = {"ranged": ranged, "twice": twice, "shuffled": with_diff.drop("diff"), "no_time": ranged.drop("time"),
              "with_diff": with_diff}
    assert bulk_write.written_as_is(ranged.schema, SCHEMA) and not bulk_write.written_as_is(with_diff.schema, SCHEMA)
    for name, df in frames.items():
        for side in ("rows", "bulk"):
            c.engine.add_relation(f"{name}_{side}", SCHEMA)
            c.engine.seal(f"{name}_{side}", 1)
        extra = {"time": 3} if name == "no_time" else {}
        write(df, c, f"{name}_rows", **extra)
        write(df, c, f"{name}_bulk", bulk="true", **extra)
        runs = c.engine.view.relations[f"{name}_bulk"].trace.pending
        files = [pq.ParquetFile(c.engine.traces.blobs.local_path(run.key)) for run in runs]
        assert {f.metadata.row_group(0).column(0).compression for f in files} == {"SNAPPY"}  # Spark's pages kept
        if name != "with_diff":
            assert all(run.raw for run in runs) and not any("diff" in f.schema_arrow.names for f in files)
        assert {run.time for run in runs} == ({3} if name == "no_time" else {None})
    for name in frames:
        for side in ("rows", "bulk"):
            c.engine.seal(f"{name}_{side}", 5)
    before = {name: [raw(c, f"{name}_bulk", t) for t in (2, 3, 4, 5)] for name in frames}
    for name in frames:
        assert before[name] == [raw(c, f"{name}_rows", t) for t in (2, 3, 4, 5)], name
        assert replayed(c, f"{name}_bulk") == replayed(c, f"{name}_rows"), name
    assert spark_read(spark, c, "shuffled_bulk", 4) == spark_read(spark, c, "shuffled_rows", 4)
    c.engine.compaction.merge_pass()  # raw runs rewritten sorted; no pass folds them yet
    for name in frames:
        assert not any(run.raw for run in c.engine.view.relations[f"{name}_bulk"].trace.pending)
        assert [raw(c, f"{name}_bulk", t) for t in (2, 3, 4, 5)] == before[name], name
    assert spark_read(spark, c, "shuffled_bulk", 4) == spark_read(spark, c, "shuffled_rows", 4)


def test_staged_files_are_flushed_while_spark_still_writes_and_again_after_a_move(tmp_path):
    """The driver's early writeback fdatasyncs each Parquet file that appears or grows under the
    staging directory (a file moved by Spark's task commit is found under its new name); other
    files are left alone."""
    import threading
    import time

    root = tmp_path / "stage"
    (root / "_temporary" / "0").mkdir(parents=True)

    def flushed_as(flushed, path, size):
        deadline = time.monotonic() + 30
        while flushed.get(str(path)) != size:
            assert time.monotonic() < deadline, f"{path} not flushed at {size} bytes: {flushed}"
            threading.Event().wait(0.005)

    with bulk_write.early_writeback(str(root), every=0.01) as flushed:
        part = root / "_temporary" / "0" / "part-0.parquet"
        part.write_bytes(b"x" * 1000)
        flushed_as(flushed, part, 1000)
        with open(part, "ab") as f:
            f.write(b"y" * 24)
        flushed_as(flushed, part, 1024)
        part.rename(root / "part-0.parquet")
        flushed_as(flushed, root / "part-0.parquet", 1024)
        (root / "_SUCCESS").write_bytes(b"")
    assert str(root / "_SUCCESS") not in flushed
