"""The ``sediment`` Spark data source, the Spark jobs and the Spark demo, against real parts:
a local[2] SparkSession, a Flight coordinator on 127.0.0.1, moto for S3."""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

import sediment

pytest.importorskip("pyspark", reason="the Spark tests need PySpark (pip install -e '.[test]')")

from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.types import LongType  # noqa: E402
from support.fixtures_spark import ids_failing_at  # noqa: E402

from sediment.spark_jobs import datasource as ds  # noqa: E402
from sediment.spark_jobs import ingest, read_trace  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("item", pa.string())])
ROOT = Path(__file__).resolve().parent.parent.parent


def write(df, c, relation="orders", **options):
    """``df.write.format("sediment")`` with the coordinator's options plus ``options``."""
    w = df.write.format("sediment").mode("append")
    for key, value in {**c.options(relation), **options}.items():
        w = w.option(key, value)
    w.save()


def rows_of(table: pa.Table, with_time: bool = False) -> Counter:
    """A table's rows as a multiset of (id, item[, time], diff)."""
    cols = ["id", "item", *(["time"] if with_time else []), "diff"]
    return Counter(zip(*(table.column(c).to_pylist() for c in cols), strict=True))


def rows_of_frame(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def model(updates: list[tuple[int, str, int, int]], as_of: int, from_t: int | None = None) -> Counter:
    """The consolidation, computed in plain Python: (id, item[, time]) -> summed diff, no zeros."""
    sums: Counter = Counter()
    for i, item, t, d in updates:
        if t <= as_of and (from_t is None or t > from_t):
            sums[(i, item) if from_t is None else (i, item, t)] += d
    return Counter({(*k, v): 1 for k, v in sums.items() if v})


def test_write_with_time_option_and_columns_then_read_back(spark, coordinator):
    c = coordinator()
    c.engine.add_relation("orders", SCHEMA)
    write(spark.createDataFrame([(1, "tea"), (2, "cake"), (3, "jam")], ["id", "item"]), c, time=1, seal=True)
    assert c.engine.sealed("orders") == 1  # option("seal") sealed the option's time after the commit
    changes = spark.createDataFrame([(1, "tea", 2, -1), (1, "milk", 2, 1), (4, "rice", 3, 1)],
                                    ["id", "item", "time", "diff"])
    write(changes, c, seal=True)
    assert c.engine.sealed("orders") == 3  # with a time column: the greatest time written
    for as_of in (1, 2, 3):
        got = rows_of_frame(ds.read_relation(spark, c.uri, "orders", as_of, token=c.token))
        assert got == rows_of(c.engine.snapshot("orders", as_of)), as_of
    assert rows_of_frame(ds.read_relation(spark, c.uri, "orders", 3, token=c.token)) == Counter(
        {(1, "milk", 1): 1, (2, "cake", 1): 1, (3, "jam", 1): 1, (4, "rice", 1): 1})
    assert c.server.open_transactions == []


def test_raw_load_gives_stored_updates_and_the_schema_follows_the_relation(spark, coordinator):
    c = coordinator()
    c.engine.add_relation("orders", SCHEMA)
    write(spark.createDataFrame([(1, "tea", 1), (1, "tea", 1)], ["id", "item", "time"]), c, seal=True)
    df = spark.read.format("sediment").options(**c.options("orders")).option("as_of", 1).option("raw", "true").load()
    assert df.columns == ["id", "item", "time", "diff"]
    assert df.schema["id"].dataType == LongType()
    assert sorted(tuple(r) for r in df.collect()) == [(1, "tea", 1, 1), (1, "tea", 1, 1)]  # not consolidated
    assert rows_of_frame(ds.consolidate(df)) == Counter({(1, "tea", 2): 1})


def test_a_job_failing_in_one_task_leaves_nothing_visible(spark, coordinator):
    c = coordinator()
    c.engine.add_relation("orders", SCHEMA)


    df = ids_failing_at(spark, 399).select("id", F.lit("tea").alias("item"))
    with pytest.raises(Exception, match="boom in one task"):
        write(df, c, time=5, seal=True, batch_rows=10)
    assert c.server.open_transactions == []  # abort() aborted the job's transaction
    assert c.engine.sealed("orders") == -1  # no commit, so no seal
    c.engine.seal("orders", 5)
    assert c.engine.snapshot("orders", 5).num_rows == 0


def test_a_retried_task_attempt_does_not_duplicate_rows(spark, coordinator):
    """The first attempt of one task fails after appending most of its rows (its last
    row has a sealed time, which the coordinator refuses); Spark retries it, and the
    retry's rows are all fine. Each attempt writes its own transaction, and commit takes
    only the winners'."""
    c = coordinator()
    c.engine.add_relation("orders", SCHEMA)
    c.engine.seal("orders", 4)

    @F.udf("long", useArrow=False)
    def time_of(i):
        from pyspark import TaskContext

        return 3 if i == 3_999 and TaskContext.get().attemptNumber() == 0 else 5

    df = spark.range(0, 4_000, numPartitions=2).select("id", F.lit("tea").alias("item"),
                                                      time_of("id").alias("time"))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        write(df, c, seal=True, batch_rows=100)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    got = c.engine.snapshot("orders", 5)
    assert sorted(got.column("id").to_pylist()) == list(range(4_000))
    assert set(got.column("diff").to_pylist()) == {1}
    assert c.server.open_transactions == []  # the failed attempt's transaction was aborted
    appended: dict[int, int] = {}
    for r in c.engine.wal.scan():
        if r.kind.name == "UPDATES" and r.txn_id:
            appended[r.txn_id] = appended.get(r.txn_id, 0) + r.count
    assert sorted(appended.values()) == [1_900, 2_000, 2_000]  # two tasks, one of them twice


def test_a_task_refused_after_appending_leaves_nothing_visible(spark, coordinator):
    c = coordinator()
    c.engine.add_relation("orders", SCHEMA)
    c.engine.seal("orders", 4)
    # one task: 100 rows at time 5 (appended 10 at a time), then rows at the sealed time 3
    df = spark.range(0, 200, numPartitions=1).select(
        "id", F.lit("tea").alias("item"), F.when(F.col("id") < 100, 5).otherwise(3).cast("long").alias("time"))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
    try:
        with pytest.raises(Exception, match="sealed through time 4"):
            write(df, c, batch_rows=10)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    appended = [r for r in c.engine.wal.scan() if r.kind.name == "UPDATES" and r.txn_id]
    assert sum(r.count for r in appended) >= 100  # the rows at time 5 went into the transaction...
    assert c.server.open_transactions == []
    c.engine.seal("orders", 5)
    assert c.engine.snapshot("orders", 5).num_rows == 0  # ...which was aborted, so none is visible


def test_writes_refuse_overwrite_and_mismatched_columns_clearly(spark, coordinator):
    c = coordinator()
    c.engine.add_relation("orders", SCHEMA)
    df = spark.createDataFrame([(1, "tea")], ["id", "item"])
    with pytest.raises(Exception, match="only appends"):
        df.write.format("sediment").options(**c.options("orders")).option("time", 1).mode("overwrite").save()
    with pytest.raises(Exception, match=r"missing \['item'\]"):
        write(df.select("id"), c, time=1)
    write(df, c, seal=True)  # no time column, no option: the next open time (sealed + 1), then sealed
    assert c.engine.sealed("orders") == 0 and rows_of(c.engine.snapshot("orders", 0)) == Counter({(1, "tea", 1): 1})
    assert c.server.open_transactions == []


def test_mismatched_types_fail_while_spark_plans_and_bad_values_in_one_line(spark, coordinator):
    """Issue 24, finding 9: a column whose type no safe cast takes fails at planning with
    SchemaMismatch (no job starts, nothing written); a value that fails a safe cast (-1
    into an unsigned column) fails the job with the same one-line error, not Arrow's."""
    from sediment.errors import SchemaMismatch
    from sediment.spark_jobs.errors import sediment_errors

    c = coordinator()
    c.engine.add_relation("orders", SCHEMA)
    c.engine.add_relation("small", pa.schema([("id", pa.uint8()), ("item", pa.string())]))
    sc = spark.sparkContext
    sc.setJobGroup("bad-types", "no job may start")
    try:
        wrong = spark.createDataFrame([("1", "tea", 1.5)], ["id", "item", "time"])
        with pytest.raises(SchemaMismatch) as info:
            with sediment_errors():
                write(wrong, c)
    finally:
        sc.setJobGroup("", "")
    assert sc.statusTracker().getJobIdsForGroup("bad-types") == []
    assert "'id' is string, the relation's is int64" in str(info.value) and "'time' is double" in str(info.value)
    narrow = spark.createDataFrame([(1, "tea")], "id int, item string")  # a narrower integer is fine
    write(narrow, c, time=1)
    with pytest.raises(SchemaMismatch, match="column 'id': a value of the DataFrame's int16 column does not fit"):
        with sediment_errors():
            write(spark.createDataFrame([(-1, "tea")], "id short, item string"), c, "small", time=1)
    c.engine.seal("orders", 1)
    c.engine.seal("small", 1)
    assert rows_of(c.engine.snapshot("orders", 1)) == Counter({(1, "tea", 1): 1})
    assert c.engine.snapshot("small", 1).num_rows == 0 and c.server.open_transactions == []


@pytest.mark.parametrize("given, column, takes", [
    ("bigint", pa.int32(), True), ("int", pa.uint64(), True), ("decimal(20,0)", pa.uint64(), True),
    ("double", pa.float32(), True), ("bigint", pa.float64(), True), ("int", pa.decimal128(12, 2), True),
    ("timestamp", pa.timestamp("ns"), True), ("timestamp_ntz", pa.timestamp("ms", "UTC"), True),
    ("void", pa.string(), True), ("string", pa.int64(), False), ("double", pa.int64(), False),
    ("bigint", pa.string(), False), ("string", pa.timestamp("us"), False), ("double", pa.decimal128(9, 2), False),
    ("boolean", pa.int8(), False), ("binary", pa.string(), False), ("date", pa.timestamp("us"), False)])
def test_which_spark_types_a_relation_column_takes(given, column, takes):
    """The kinds checked at planning (the README lists them); values are the tasks' cast."""
    from pyspark.sql import types as T

    from sediment.spark_jobs.options import writes_into

    spark_types = {"bigint": T.LongType(), "int": T.IntegerType(), "decimal(20,0)": T.DecimalType(20, 0),
                   "double": T.DoubleType(), "timestamp": T.TimestampType(), "timestamp_ntz": T.TimestampNTZType(),
                   "void": T.NullType(), "string": T.StringType(), "boolean": T.BooleanType(),
                   "binary": T.BinaryType(), "date": T.DateType()}
    assert writes_into(spark_types[given], column) is takes


def test_a_failed_job_is_described_in_one_line(spark, coordinator):
    from sediment.spark_jobs.session import describe_error

    c = coordinator()
    with pytest.raises(Exception) as info:
        write(spark.createDataFrame([(1, "tea")], ["id", "item"]), c, relation="nope", time=1)
    assert "Traceback" in str(info.value)  # Spark's text carries the worker's whole traceback...
    line = describe_error(info.value)
    assert line.startswith("sediment.errors.UnknownRelation: no relation named 'nope'"), line  # ...this, one line


def test_as_of_and_from_reads_match_a_python_model(spark, coordinator):
    c = coordinator(compact=False)
    c.engine.add_relation("orders", SCHEMA)
    rnd = random.Random(11)
    updates: list[tuple[int, str, int, int]] = []
    for t in range(1, 11):
        batch = [(rnd.randrange(30), rnd.choice(["tea", "jam"]), t, rnd.choice([1, 1, -1, 2])) for _ in range(40)]
        updates += batch
        write(spark.createDataFrame(batch, ["id", "item", "time", "diff"]), c, seal=True)
        if t == 6:  # times <= 6 go to batches (since 3 folds 1..3 together); 7..10 stay in the WAL tail
            c.engine.set_since("orders", 3)
            c.engine.compact()
    info = c.engine.trace_info("orders")
    assert info["batches"] >= 1 and info["tail_records"] >= 4  # reads combine batches and the tail
    for as_of in (3, 5, 6, 8, 10):
        got = rows_of_frame(ds.read_relation(spark, c.uri, "orders", as_of, token=c.token))
        assert got == model(updates, as_of), as_of
    for from_t, as_of in ((3, 10), (5, 7), (6, 6)):
        got = rows_of_frame(ds.read_relation(spark, c.uri, "orders", as_of, from_t, token=c.token))
        assert got == model(updates, as_of, from_t), (from_t, as_of)
    with pytest.raises(Exception, match="outside"):
        ds.read_relation(spark, c.uri, "orders", 2, token=c.token).collect()  # below since


def test_open_relation_releases_its_lease_and_load_leases_until_expiry(spark, coordinator):
    c = coordinator()
    c.engine.add_relation("orders", SCHEMA)
    write(spark.createDataFrame([(1, "tea"), (2, "jam")], ["id", "item"]), c, time=1, seal=True)
    c.engine.compact()
    with ds.open_relation(spark, c.uri, "orders", 1, token=c.token) as df:
        assert len(c.engine.collector.readers.leases) == 1
        assert df.count() == 2 and df.count() == 2  # actions inside the block reuse the plan
    assert c.engine.collector.readers.leases == {}
    df = ds.read_relation(spark, c.uri, "orders", 1, token=c.token, lease_seconds=120)
    assert df.count() == 2 and df.count() == 2
    assert len(c.engine.collector.readers.leases) == 1  # planned once per frame, left to expire


def test_a_large_batch_is_read_by_several_tasks(spark, coordinator):
    c = coordinator()
    c.engine.add_relation("orders", SCHEMA)
    df = spark.range(0, 150_000, numPartitions=2).select("id", (F.col("id") % 7).cast("string").alias("item"))
    write(df, c, time=1, seal=True)
    c.engine.compact()
    assert c.engine.trace_info("orders")["batches"] == 1  # one batch of three 64Ki-row groups
    raw = spark.read.format("sediment").options(**c.options("orders")).option("split_rows", 50_000).option("raw", True).load()
    assert raw.rdd.getNumPartitions() == 3
    assert raw.count() == 150_000 and raw.select("id").distinct().count() == 150_000  # each row exactly once


@pytest.mark.s3
def test_read_from_s3_batches(spark, coordinator, s3_bucket, moto_server):
    endpoint, bucket = s3_bucket
    c = coordinator(blob=f"s3://{bucket}/rel", s3_endpoint=endpoint, compact=False)
    c.engine.add_relation("orders", SCHEMA)
    rows = [(i, ["tea", "jam", "rice"][i % 3], 1 + i % 4, 1) for i in range(500)]
    write(spark.createDataFrame(rows, ["id", "item", "time", "diff"]), c, seal=True)
    c.engine.compact()
    assert c.engine.trace_info("orders")["tail_records"] == 0  # everything is read from S3
    keys = [o["Key"] for o in moto_server.client().list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert any(k.endswith(".parquet") for k in keys)
    for as_of in (2, 4):
        with ds.open_relation(spark, c.uri, "orders", as_of, token=c.token) as df:
            assert rows_of_frame(df) == rows_of(c.engine.snapshot("orders", as_of))


def test_ingest_csv_json_and_parquet(spark, coordinator, tmp_path):
    c = coordinator()
    c.engine.add_relation("orders", SCHEMA)
    (tmp_path / "in.csv").write_text("order,what\n1,tea\n2,jam\n")
    args = ingest.parse_args(["--uri", c.uri, "--token", c.token, "--relation", "orders",
                              "--input", str(tmp_path / "in.csv"), "--time", "3", "--seal",
                              "--map", "order=id", "--map", "what=item"])
    ingest.run(spark, args)
    assert c.engine.sealed("orders") == 3
    (tmp_path / "in.json").write_text('{"id": 1, "item": "tea", "time": 4, "diff": -1, "note": "x"}\n')
    ingest.run(spark, ingest.parse_args(["--uri", c.uri, "--token", c.token, "--relation", "orders",
                                         "--input", str(tmp_path / "in.json"), "--seal"]))
    pq.write_table(pa.table({"id": [5], "item": ["rice"]}), tmp_path / "in.parquet")
    ingest.run(spark, ingest.parse_args(["--uri", c.uri, "--token", c.token, "--relation", "orders",
                                         "--input", str(tmp_path / "in.parquet"), "--time", "5", "--seal"]))
    assert rows_of(c.engine.snapshot("orders", 5)) == Counter({(2, "jam", 1): 1, (5, "rice", 1): 1})
    with pytest.raises(SystemExit, match="lacks relation column"):
        ingest.run(spark, ingest.parse_args(["--uri", c.uri, "--token", c.token, "--relation", "orders",
                                             "--input", str(tmp_path / "in.csv"), "--time", "6"]))


def test_read_trace_writes_parquet_as_of_and_csv_changes(spark, coordinator, tmp_path):
    c = coordinator()
    c.engine.add_relation("orders", SCHEMA)
    write(spark.createDataFrame([(1, "tea", 1, 1), (2, "jam", 1, 1), (1, "tea", 2, -1), (3, "egg", 2, 1)],
                                ["id", "item", "time", "diff"]), c, seal=True)
    common = ["--uri", c.uri, "--token", c.token, "--relation", "orders"]
    out = tmp_path / "snap"
    args = read_trace.parse_args([*common, "--output", str(out)])
    assert read_trace.run(spark, args) == 2 and args.as_of == 2  # default: the sealed frontier
    assert rows_of(pq.read_table(out)) == rows_of(c.engine.snapshot("orders", 2))
    changes = tmp_path / "changes"
    read_trace.run(spark, read_trace.parse_args([*common, "--as-of", "2", "--from", "1", "--output",
                                                 str(changes), "--format", "csv", "--files", "1"]))
    [part] = list(changes.glob("part-*.csv"))
    assert rows_of(pcsv.read_csv(part), with_time=True) == Counter({(1, "tea", 2, -1): 1, (3, "egg", 2, 1): 1})
    assert c.engine.collector.readers.leases == {}


def _spark_env() -> dict[str, str]:
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1"}


@contextlib.contextmanager
def served(tmp_path, token: str):
    """A real ``sediment serve`` on a fresh data directory, its URI; stopped by its PID after."""
    serve = subprocess.Popen([sys.executable, "-m", "sediment", "serve", "--data-dir", str(tmp_path / "d"),
                              "--listen", "127.0.0.1:0", "--token", token],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = serve.stdout.readline()
        assert "serving" in ready, serve.stderr.read()
        yield ready.split()[-1]
    finally:
        serve.terminate()
        serve.communicate(timeout=60)


@pytest.mark.slow
def test_spark_submit_ingest_script_against_sediment_serve(tmp_path):
    token = "spark-submit-token"
    with served(tmp_path, token) as uri:
        with sediment.connect(uri, token) as db:
            db.add_relation("orders", SCHEMA)
        (tmp_path / "in.csv").write_text("id,item\n7,tea\n8,jam\n")
        submit = Path(sys.executable).parent / "spark-submit"
        out = subprocess.run([str(submit), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
                              str(ROOT / "spark_jobs" / "ingest.py"), "--uri", uri, "--relation", "orders",
                              "--input", str(tmp_path / "in.csv"), "--time", "2", "--seal"],
                             env={**_spark_env(), "SEDIMENT_TOKEN": token}, capture_output=True, text=True,
                             timeout=240)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "ingested" in out.stdout
        with sediment.connect(uri, token) as db:
            assert db.sealed("orders") == 2
            assert rows_of(db.snapshot("orders", 2)) == Counter({(7, "tea", 1): 1, (8, "jam", 1): 1})


@pytest.mark.slow
def test_a_failed_ingest_job_says_so_in_one_line_without_sparks_logs(tmp_path):
    """A CSV value that does not cast fails a task: the job's stderr is its one error line, not
    Spark's ERROR logs and Java stacks (about 120 lines before) nor the line the JVM prints at
    boot for the incubator module Spark's launcher adds, and nothing was appended."""
    token = "quiet-job-token"
    with served(tmp_path, token) as uri:
        with sediment.connect(uri, token) as db:
            db.add_relation("counts", pa.schema([("id", pa.int64()), ("n", pa.int64())]))
        (tmp_path / "bad.csv").write_text("id,n\n1,2\n3,many\n")
        env = {k: v for k, v in _spark_env().items() if k != "SEDIMENT_DEBUG"}
        out = subprocess.run([sys.executable, "-m", "sediment.spark_jobs.ingest", "--uri", uri, "--relation", "counts",
                              "--input", str(tmp_path / "bad.csv"), "--time", "1"],
                             env={**env, "SEDIMENT_TOKEN": token}, capture_output=True, text=True, timeout=240)
        assert out.returncode == 1, out.stderr[-3000:]
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert lines[-1].startswith("sediment.spark_jobs.ingest: error: [CAST_INVALID_INPUT]"), lines[-5:]
        assert lines[:-1] == [], lines[:10]  # not even the JVM's "WARNING: Using incubator modules" line
        with sediment.connect(uri, token) as db:
            db.seal("counts", 1)
            assert db.snapshot("counts", 1).num_rows == 0


@pytest.mark.parametrize("job,required", [(ingest, ["--input", "in.csv"]), (read_trace, ["--output", "out"])])
def test_a_jobs_command_line_mistake_is_one_line_before_spark_starts(capsys, monkeypatch, job, required):
    """A missing option printed argparse's usage block, and a missing token came as
    ``error: no token`` (no program, exit 1) after Spark had started, seconds later."""
    from sediment.spark_jobs.session import run_job

    for variable in ("SEDIMENT_TOKEN", "SEDIMENT_URI", "SEDIMENT_DEBUG"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(job, "local_spark", lambda *a, **k: pytest.fail("Spark was started"))
    prog = job.__name__
    assert run_job(prog, job.main, ["--relation", "r"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{prog}: error: the following arguments are required: --uri"), err
    assert f"(see `python -m {prog} --help`)" in err
    assert run_job(prog, job.main, ["--uri", "grpc://127.0.0.1:1", "--relation", "r", *required]) == 2
    err = capsys.readouterr().err
    assert err == f"{prog}: error: no token: pass --token T or set $SEDIMENT_TOKEN (the coordinator's)\n"


def test_a_job_whose_jvm_cannot_start_still_shows_why(tmp_path):
    """The driver's stderr passes through a filter (for the JVM's incubator-module line): what
    a launch that fails writes (here: no java at $JAVA_HOME) still reaches the user, before the
    job's one error line."""
    (tmp_path / "in.csv").write_text("id,n\n1,2\n")
    env = {k: v for k, v in _spark_env().items() if k != "SEDIMENT_DEBUG"}
    out = subprocess.run([sys.executable, "-m", "sediment.spark_jobs.ingest", "--uri", "grpc://127.0.0.1:1",
                          "--relation", "counts", "--input", str(tmp_path / "in.csv"), "--time", "1"],
                         env={**env, "SEDIMENT_TOKEN": "t", "JAVA_HOME": str(tmp_path / "no-java")},
                         capture_output=True, text=True, timeout=60)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 1 and lines[-1].startswith("sediment.spark_jobs.ingest: error: "), out.stderr
    assert any(f"{tmp_path / 'no-java'}/bin/java" in line for line in lines[:-1]), out.stderr


@pytest.mark.slow
def test_the_demo_runs_small_and_reports_ok():
    out = subprocess.run([sys.executable, "-m", "sediment", "demo", "--rows", "20000", "--progress"], env=_spark_env(),
                         capture_output=True, text=True, timeout=300, cwd=ROOT / "tests")
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "verdict: OK" in out.stdout and "Traceback" not in out.stderr
    assert "updates over 100 times" in out.stdout
    for phase in ("start Spark and a served engine", "feed", "compact (since 50)", "restart the engine (replay)",
                  "verify"):  # --progress, stderr no terminal: each phase says when it starts and ends
        assert f"{phase}: started" in out.stderr and f"{phase}: done" in out.stderr, (phase, out.stderr[-2000:])


def test_the_demo_comparison_catches_a_wrong_read(spark):
    from sediment import demo

    stream = demo.generate(spark, 3000, 10).cache()
    assert {r["diff"] for r in stream.select("diff").distinct().collect()} == {1, -1}  # inserts and retractions
    want = demo.expected(stream, 10)
    assert demo.differences(want, want) == 0
    assert demo.differences(want.limit(want.count() - 1), want) == 1
    wrong_diff = want.withColumn("diff", F.when(F.col("id") == want.first()["id"], 2).otherwise(F.col("diff")))
    assert demo.differences(wrong_diff, want) >= 1
