"""The ``sediment`` data source over an S3-only cluster of coordinators: a real local SparkSession
against two ``sediment serve --cluster s3://...`` members (real processes, moto's S3, no
ZooKeeper, no storage nodes), reached by the cluster's ``s3://BUCKET/PREFIX?endpoint=URL``.

A batch write read back equal (through the URI and a SQL table), a stream
from a relation of one partition into one of the other (two owners), and bulk loads: an S3
member has no file blob store, so the tasks put the staged files into S3 themselves
(spark_jobs/bulk_s3.py); they read back as the row path's, a retried task attempt is committed
once, and a failed job leaves nothing staged."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest

pytest.importorskip("pyspark", reason="the Spark tests need PySpark (pip install -e '.[test]')")

from pyspark.sql import functions as F  # noqa: E402
from support.cluster_procs import TOKEN, S3Cluster  # noqa: E402
from support.fixtures_spark import ids_failing_at  # noqa: E402
from support.waiting import poll_until  # noqa: E402
from test_spark_bulk import updates_frame  # noqa: E402

import sediment  # noqa: E402
from sediment.arrow_codec import schema_to_text  # noqa: E402
from sediment.spark_jobs.bulk_s3 import STAGED_IN, STAGED_SCHEMA, StagedWriter  # noqa: E402
from sediment.spark_jobs.cluster_connect import connect_for  # noqa: E402
from sediment.spark_jobs.errors import sediment_errors  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.s3, pytest.mark.timeout(300)]
SCHEMA = pa.schema([("id", pa.int64()), ("item", pa.string())])
LEASE = 20.0  # no member is meant to lose its partitions here, however loaded the host


@pytest.fixture
def cluster(tmp_path, moto_server, s3_bucket):
    """An S3-only cluster of two partitions, each served by one of two members."""
    c = S3Cluster(tmp_path, moto_server.endpoint, s3_bucket[1], partitions=2, lease_time=LEASE)
    try:
        members = [c.start_member() for _ in range(2)]
        c.wait_assigned(members, timeout=60)
        yield c
    finally:
        c.close()


def opts(cluster: S3Cluster, relation: str, **extra: str) -> dict[str, str]:
    return {"uri": cluster.uri, "token": TOKEN, "relation": relation, **extra}


def write(df, cluster: S3Cluster, relation: str, **extra: str) -> None:
    with sediment_errors():
        df.write.format("sediment").options(**opts(cluster, relation, **extra)).mode("append").save()


def updates(db, name: str, as_of: int) -> Counter:
    """The relation's consolidated rows as of ``as_of``: (id, item) -> diff."""
    got = db.snapshot(name, as_of)
    return +Counter({(i, item): d for i, item, d in zip(*(got.column(n).to_pylist() for n in ("id", "item", "diff")),
                                                        strict=True)})


def staged_objects(cluster: S3Cluster, moto_server) -> list[str]:
    """Every object under the partitions' ``staging/`` prefixes (bulk loads not yet committed or aborted)."""
    s3 = moto_server.client()
    try:
        return [o["Key"] for p in range(2) for o in s3.list_objects_v2(
            Bucket=cluster.bucket, Prefix=f"{cluster.blob_prefix}/p{p}/staging/").get("Contents", [])]
    finally:
        s3.close()


def test_spark_writes_reads_and_streams_through_the_s3_cluster_uri(spark, cluster, tmp_path):
    with sediment.connect(cluster.uri, token=TOKEN) as db:
        db.add_relation("orders", SCHEMA, partition=0)
        db.add_relation("copy", SCHEMA, partition=1)
        assert cluster.owner_of(0) is not cluster.owner_of(1)
        rows = spark.createDataFrame([(i, f"item{i % 3}", 1) for i in range(60)], "id long, item string, time long")
        write(rows, cluster, "orders", seal="true")
        assert db.sealed("orders") == 1 and updates(db, "orders", 1) == Counter({(i, f"item{i % 3}"): 1
                                                                                  for i in range(60)})
        back = spark.read.format("sediment").options(**opts(cluster, "orders")).option("asOf", 1).load()
        assert Counter(tuple(r) for r in back.collect()) == Counter((i, f"item{i % 3}", 1) for i in range(60))

        spark.sql(f"CREATE TABLE orders_s3 USING sediment OPTIONS (uri '{cluster.uri}', token '{TOKEN}', "
                  "relation 'orders', seal 'true')")
        try:
            with sediment_errors():
                spark.sql("INSERT INTO orders_s3 SELECT 60, 'tea', 1")  # diff 1 at the next open time, 2
            assert spark.sql("SELECT count(*) AS n FROM orders_s3").collect()[0].n == 61
        finally:
            spark.sql("DROP TABLE orders_s3")

        query = (spark.readStream.format("sediment").options(**opts(cluster, "orders"))
                 .option("startingAsOf", "earliest").load().writeStream.format("sediment")
                 .options(**opts(cluster, "copy", seal="true")).option("checkpointLocation", str(tmp_path / "ck"))
                 .start())
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        assert updates(db, "copy", 2) == updates(db, "orders", 2)  # each update once, in the other partition
        progress = [n for n in db.relations(include_internal=True) if n.startswith("_spark_sink.")]
        assert [db.describe(n)["partition"] for n in progress] == [1]  # committed with the data


def test_bulk_loads_into_s3_members_read_back_as_the_row_path(spark, cluster, moto_server):
    with sediment.connect(cluster.uri, token=TOKEN) as db:
        for p, name in enumerate(("rows", "bulk")):  # the two paths at two members
            db.add_relation(name, SCHEMA, partition=p)
            db.seal(name, 1)
        df, _data = updates_frame(spark, n=2_000)  # time and diff columns: staged as the relation's updates
        write(df, cluster, "rows")
        write(df, cluster, "bulk", bulk="true")
        plain = spark.range(0, 1_000, numPartitions=2).select("id", (F.col("id") % 5).cast("string").alias("item"))
        write(plain, cluster, "rows", time="6")  # written as it is (a raw run) at the load's time
        write(plain, cluster, "bulk", time="6", bulk="true")
        for name in ("rows", "bulk"):
            db.seal(name, 6)
        assert db.trace_info("bulk")["tail_records"] == 0  # its rows never went through the log
        assert staged_objects(cluster, moto_server) == []
        for t in range(2, 7):
            assert updates(db, "bulk", t) == updates(db, "rows", t), t
        assert updates(db, "bulk", 6)[(999, "4")] == 1
        read = spark.read.format("sediment").options(**opts(cluster, "bulk")).option("asOf", 5).load()
        assert Counter((r.id, r.item) for r in read.collect() for _ in range(r.diff)) == updates(db, "rows", 5)


def test_an_s3_bulk_load_commits_each_partition_once_and_a_failed_one_leaves_nothing(spark, cluster, moto_server):
    """Each task puts its partition's object under one name, so a second attempt of a partition
    replaces what the first one put (a job retried in Spark, and two attempts that both put
    theirs); a job that fails is aborted, which deletes what its tasks put, and a task that
    puts its object after the abort deletes it itself."""
    with sediment.connect(cluster.uri, token=TOKEN) as db:
        db.add_relation("bulk", SCHEMA, partition=1)

        @F.udf("long", useArrow=False)
        def flaky(i):
            from pyspark import TaskContext

            if i == 1_999 and TaskContext.get().attemptNumber() == 0:
                raise RuntimeError("first attempt fails")
            return i

        df = spark.range(0, 2_000, numPartitions=2).select(flaky("id").alias("id"), F.lit("tea").alias("item"))
        write(df, cluster, "bulk", bulk="true", time="5", seal="true")
        got = db.snapshot("bulk", 5)
        assert sorted(got.column("id").to_pylist()) == list(range(2_000)) and set(got.column("diff").to_pylist()) == {1}

        failing = ids_failing_at(spark, 399).select("id", F.lit("jam").alias("item"))
        with pytest.raises(Exception, match="boom in one task"):
            write(failing, cluster, "bulk", bulk="true", time="7", seal="true")
        assert db.sealed("bulk") == 5
        # a task still running when the job failed finds the load aborted after its PUT and deletes its object
        poll_until(lambda: staged_objects(cluster, moto_server) == [], 60, "the failed load's objects deleted")
        db.seal("bulk", 7)
        assert db.snapshot("bulk", 7).num_rows == 2_000

        with connect_for(cluster.uri, TOKEN, "bulk") as owner:
            where = owner.bulk_stage("bulk", "two-attempts")
            writer = StagedWriter({"relation": "bulk", STAGED_IN: where, STAGED_SCHEMA: schema_to_text(SCHEMA)})

            def attempt(ids: range, partition: int) -> None:
                batch = pa.record_batch({"id": pa.array(list(ids), pa.int64()), "item": ["x"] * len(ids)})
                writer.put_part(iter([batch]), partition)

            attempt(range(10_000, 10_100), 0)  # put, then lost (say its executor died): Spark runs it again
            attempt(range(20_000, 20_050), 0)
            attempt(range(30_000, 30_010), 1)
            assert owner.bulk_commit("bulk", "two-attempts", time=9)["rows"] == 60
            attempt(range(40_000, 40_005), 1)  # a late attempt: the load is done, so it deletes its object
        db.seal("bulk", 9)
        assert sorted(db.snapshot("bulk", 9).column("id").to_pylist()) == [
            *range(2_000), *range(20_000, 20_050), *range(30_000, 30_010)]
        assert staged_objects(cluster, moto_server) == []
