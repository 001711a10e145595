"""Spark across an alter: the source reads the current schema (old batches by field id, the
WAL tail too), pushed filters stay right on a widened column, and the sink adds new
DataFrame columns only with option("mergeSchema", "true")."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest

pytest.importorskip("pyspark", reason="the Spark tests need PySpark (pip install -e '.[test]')")

from pyspark.sql import functions as F  # noqa: E402


def _frame_rows(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def _engine_rows(table: pa.Table) -> Counter:
    return Counter(tuple(r.values()) for r in table.to_pylist())


def _evolved(c):
    e = c.engine
    e.add_relation("r", pa.schema([("id", pa.int32()), ("item", pa.string()), ("note", pa.string())]))
    e.append("r", pa.table({"id": pa.array([1, 2, 2], pa.int32()), "item": ["a", "b", "b"], "note": ["x", "y", "z"],
                            "time": [1, 1, 1], "diff": [1, 1, 1]}))
    e.seal("r", 1)
    e.compact("r")  # a batch of version 0
    e.alter_relation("r", add=[pa.field("qty", pa.int32())], defaults={"qty": 9}, widen={"id": pa.int64()},
                     rename={"item": "product"}, drop=["note"])
    e.append("r", pa.table({"id": [3_000_000_000], "product": ["c"], "qty": pa.array([1], pa.int32()),
                            "time": [2], "diff": [1]}))
    e.seal("r", 2)  # stays in the WAL tail, version 1


def test_spark_reads_the_current_schema_across_an_alter(spark, coordinator):
    c = coordinator(compact_interval=None)
    _evolved(c)
    df = spark.read.format("sediment").options(**c.options("r")).option("as_of", 2).load()
    assert df.columns == ["id", "product", "qty", "diff"]
    assert _frame_rows(df) == _engine_rows(c.engine.snapshot("r", 2))
    assert _frame_rows(df) == Counter({(1, "a", 9, 1): 1, (2, "b", 9, 2): 1, (3_000_000_000, "c", 1, 1): 1})
    widened = df.filter(F.col("id") > 2)  # statistics of the old batch are int32, the filter's value int64
    assert _frame_rows(widened) == Counter({(3_000_000_000, "c", 1, 1): 1})
    renamed = df.filter(F.col("product") == "b")
    assert _frame_rows(renamed) == Counter({(2, "b", 9, 2): 1})
    by_default = df.filter(F.col("qty") == 9)  # the old batch has no qty: it reads as the default
    assert _frame_rows(by_default) == Counter({(1, "a", 9, 1): 1, (2, "b", 9, 2): 1})


def test_spark_sink_merges_new_columns_only_when_asked(spark, coordinator):
    c = coordinator(compact_interval=None)
    c.engine.add_relation("w", pa.schema([("id", pa.int64())]))
    frame = spark.createDataFrame([(1, "tea", 1)], ["id", "item", "time"])
    w = frame.write.format("sediment").mode("append").options(**c.options("w"))
    with pytest.raises(Exception, match="unknown") as info:
        w.save()
    assert "item" in str(info.value) and c.engine.schema_version("w") == 0
    w.option("mergeSchema", "true").save()
    assert c.engine.schema_version("w") == 1
    assert c.engine.schema("w") == pa.schema([("id", pa.int64()), ("item", pa.string())])
    c.engine.seal("w", 1)
    assert c.engine.snapshot("w", 1).to_pylist() == [{"id": 1, "item": "tea", "diff": 1}]


def test_a_stream_crossing_an_alter_stops_then_resumes_in_the_new_columns(spark, coordinator, tmp_path):
    c = coordinator(compact_interval=None)
    e = c.engine
    e.add_relation("s", pa.schema([("id", pa.int64()), ("item", pa.string())]))
    e.append("s", pa.table({"id": [1], "item": ["a"], "time": [1], "diff": [1]}))
    e.seal("s", 1)
    got: dict[int, list] = {}

    def sink(df, batch_id):
        got[batch_id] = (df.columns, sorted(tuple(r) for r in df.collect()))

    def start():
        reader = spark.readStream.format("sediment").options(**c.options("s")).option("startingAsOf", "1")
        return reader.load().writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck")).start()

    q = start()
    try:
        q.processAllAvailable()
        assert got[0] == (["id", "item", "time", "diff"], [(1, "a", 1, 1)])
        e.alter_relation("s", add=[pa.field("qty", pa.int64())], defaults={"qty": 0}, rename={"item": "product"})
        e.append("s", pa.table({"id": [2], "product": ["b"], "qty": [7], "time": [2], "diff": [1]}))
        e.seal("s", 2)
        with pytest.raises(Exception, match="altered to schema version 1"):
            q.processAllAvailable()
    finally:
        q.stop()
    assert 1 not in got
    q = start()  # the restarted query plans the same micro-batch again, now in the new columns
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    assert got[1] == (["id", "product", "qty", "time", "diff"], [(2, "b", 7, 2, 1)])
