"""The ``sediment`` data source over a cluster of coordinators (issue 29): a real local
SparkSession against three ``sediment serve --cluster`` members (real processes, a real
ZooKeeper, moto's S3, three storage nodes), reached by the cluster's ``zk://`` URI or by one
member's address. A batch write, a read back, a SQL table, a stream from a relation of one
partition into a relation of another (so two owners), and a write and read after the
owner of the written partition is SIGKILLed."""

from __future__ import annotations

import signal

import pyarrow as pa
import pytest

pytest.importorskip("pyspark", reason="the Spark tests need PySpark (pip install -e '.[test]')")

from support.cluster_procs import TOKEN, running_cluster  # noqa: E402

import sediment  # noqa: E402
from sediment.spark_jobs.errors import sediment_errors  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.zookeeper, pytest.mark.s3, pytest.mark.timeout(400)]
SCHEMA = pa.schema([("id", pa.int64()), ("item", pa.string())])


def ids_of(db, name: str, as_of: int) -> list[int]:
    """The relation's ids as of ``as_of`` (sealed by then), once per unit of diff."""
    table = db.snapshot(name, as_of)
    return sorted(i for i, d in zip(table.column("id").to_pylist(), table.column("diff").to_pylist(), strict=True)
                  for _ in range(d))


@pytest.fixture
def cluster(tmp_path, zookeeper, zk_root, moto_server, s3_bucket):
    with running_cluster(tmp_path, zookeeper, zk_root, moto_server, s3_bucket) as c:
        yield c


def test_spark_writes_reads_and_streams_through_the_cluster_uri(spark, cluster, tmp_path):
    members = [cluster.start_member() for _ in range(3)]
    view = cluster.wait_assigned(members)
    src_p = 1
    dst_p = next(p for p, (m, _g) in view["assignment"].items() if m != view["assignment"][src_p][0])
    with sediment.connect(cluster.uri, token=TOKEN) as db:
        db.add_relation("orders", SCHEMA, partition=src_p)
        db.add_relation("copy", SCHEMA, partition=dst_p)

        def opts(relation: str, uri: str = cluster.uri) -> dict[str, str]:
            return {"uri": uri, "token": TOKEN, "relation": relation}

        rows = spark.createDataFrame([(i, f"item{i % 3}", 1) for i in range(60)], "id long, item string, time long")
        with sediment_errors():
            rows.write.format("sediment").options(**opts("orders")).option("seal", "true").mode("append").save()
        assert ids_of(db, "orders", 1) == list(range(60)) and db.sealed("orders") == 1
        back = spark.read.format("sediment").options(**opts("orders")).option("asOf", 1).load()
        assert sorted(r.id for r in back.collect()) == list(range(60))
        # a member's own address works too: the data source follows its redirect to the owner
        other = next(m for m in members if m is not cluster.owner_of(src_p))
        via = spark.read.format("sediment").options(**opts("orders", other.uri)).load()
        assert via.count() == 60

        o = opts("orders")
        spark.sql(f"CREATE TABLE orders_zk USING sediment OPTIONS (uri '{o['uri']}', token '{o['token']}', "
                  "relation 'orders', seal 'true')")
        try:
            with sediment_errors():
                spark.sql("INSERT INTO orders_zk SELECT 60, 'tea', 1")  # diff 1 at the next open time, 2
            assert spark.sql("SELECT count(*) AS n FROM orders_zk").collect()[0].n == 61
        finally:
            spark.sql("DROP TABLE orders_zk")

        query = (spark.readStream.format("sediment").options(**opts("orders")).option("startingAsOf", "earliest")
                 .load().writeStream.format("sediment").options(**opts("copy")).option("seal", "true")
                 .option("checkpointLocation", str(tmp_path / "ck")).start())
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        assert ids_of(db, "copy", 2) == list(range(61))  # each update once, in the other partition's relation
        progress = [n for n in db.relations(include_internal=True) if n.startswith("_spark_sink.")]
        assert [db.describe(n)["partition"] for n in progress] == [dst_p]  # committed with the data

        victim = cluster.owner_of(src_p)
        victim.signal(signal.SIGKILL)
        victim.wait()
        more = spark.createDataFrame([(i, "jam", 3) for i in range(100, 110)], "id long, item string, time long")
        with sediment_errors():
            more.write.format("sediment").options(**opts("orders")).option("seal", "true").mode("append").save()
        assert cluster.owner_of(src_p) is not victim
        after = spark.read.format("sediment").options(**opts("orders")).option("asOf", 3).load()
        assert sorted(r.id for r in after.collect()) == [*range(61), *range(100, 110)]
