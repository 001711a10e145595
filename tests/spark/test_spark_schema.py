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


# each kind of change: the alter, a row written after it, and the columns and rows the
# restarted query delivers (the row at time 3, written before the alter, read in the new columns)
CHANGES = {
    "add": ({"add": [pa.field("qty", pa.int64())], "defaults": {"qty": 0}},
            {"id": [4], "item": ["d"], "note": ["w"], "qty": [7]},
            ["id", "item", "note", "qty"], [(3, "c", "z", 0, 3, 1), (4, "d", "w", 7, 4, 1)]),
    "widen": ({"widen": {"id": pa.int64()}},
              {"id": [4_000_000_000], "item": ["d"], "note": ["w"]},
              ["id", "item", "note"], [(3, "c", "z", 3, 1), (4_000_000_000, "d", "w", 4, 1)]),
    "rename": ({"rename": {"item": "product"}},
               {"id": [4], "product": ["d"], "note": ["w"]},
               ["id", "product", "note"], [(3, "c", "z", 3, 1), (4, "d", "w", 4, 1)]),
    "drop": ({"drop": ["note"]},
             {"id": [4], "item": ["d"]},
             ["id", "item"], [(3, "c", 3, 1), (4, "d", 4, 1)]),
}


@pytest.mark.parametrize("kind", sorted(CHANGES))
def test_a_stream_crossing_an_alter_stops_then_resumes_in_the_new_columns(spark, coordinator, tmp_path, kind):
    """Spark fixes a stream's schema when the query starts (as for Delta Lake): the first
    micro-batch planned after the alter stops the query with SchemaMismatch naming the
    relation, the version and "restart the query", having delivered nothing of it; the
    restart from the same checkpoint plans that micro-batch again in the new columns. Every
    row reaches the sink exactly once."""
    from sediment.errors import SchemaMismatch
    from sediment.spark_jobs.errors import sediment_errors

    c = coordinator(compact_interval=None)
    e = c.engine
    e.add_relation("s", pa.schema([("id", pa.int32()), ("item", pa.string()), ("note", pa.string())]))

    def put(t, **cols):
        e.append("s", pa.table({**cols, "time": [t] * len(cols["id"]), "diff": [1] * len(cols["id"])}))
        e.seal("s", t)

    put(1, id=pa.array([1], pa.int32()), item=["a"], note=["x"])
    got: dict[int, tuple] = {}

    def sink(df, batch_id):
        got[batch_id] = (df.columns, sorted(tuple(r) for r in df.collect()))

    def start():
        reader = spark.readStream.format("sediment").options(**c.options("s")).option("startingAsOf", "1")
        return reader.load().writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck")).start()

    alter, after, columns, resumed = CHANGES[kind]
    q = start()
    try:
        q.processAllAvailable()
        put(2, id=pa.array([2], pa.int32()), item=["b"], note=["y"])
        q.processAllAvailable()
        assert got == {0: (["id", "item", "note", "time", "diff"], [(1, "a", "x", 1, 1)]),
                       1: (["id", "item", "note", "time", "diff"], [(2, "b", "y", 2, 1)])}
        put(3, id=pa.array([3], pa.int32()), item=["c"], note=["z"])  # sealed before the alter, not yet read
        e.alter_relation("s", **alter)
        put(4, **after)
        with pytest.raises(SchemaMismatch, match=r"relation 's' was altered to schema version 1 .*restart the query"
                           ) as info, sediment_errors():
            q.processAllAvailable()
        assert "\n" not in str(info.value)
    finally:
        q.stop()
    assert sorted(got) == [0, 1]  # the failed micro-batch delivered nothing
    q = start()
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    # micro-batch 2 again, in the new columns (Spark may have ended it at time 3 before the
    # alter, if it planned it between put(3) and the alter: then time 4 is micro-batch 3)
    later = sorted(b for b in got if b >= 2)
    assert later[0] == 2 and all(got[b][0] == [*columns, "time", "diff"] for b in later)
    assert sorted(r for b in later for r in got[b][1]) == resumed
    times = [r[-2] for b in sorted(got) for r in got[b][1]]
    assert sorted(times) == [1, 2, 3, 4]  # each row once: none lost at the alter, none repeated at the restart


def _altered_for_omission(e, name):
    """A relation created with ``id`` (required), then given ``qty`` (nullable, no default)
    and ``price`` (default 5): appends may leave those two out."""
    e.add_relation(name, pa.schema([("id", pa.int64()), ("item", pa.string())]))
    e.alter_relation(name, add=[pa.field("qty", pa.int32()), pa.field("price", pa.int64())], defaults={"price": 5})
    e.seal(name, 0)


@pytest.mark.parametrize("path", ["rows", "bulk", "stream"])
def test_the_sink_fills_columns_an_alter_added_as_the_engine_append_does(spark, coordinator, tmp_path, path):
    from sediment.spark_jobs import register
    from sediment.spark_jobs.errors import sediment_errors

    register(spark)  # the bulk path routes through the driver's writer
    c = coordinator(compact_interval=None)
    e = c.engine
    for name in ("by_engine", "by_spark"):
        _altered_for_omission(e, name)
    e.append("by_engine", pa.table({"id": [1, 2], "item": ["a", "b"], "price": [8, 9], "time": [1, 1], "diff": [1, 1]}))
    e.seal("by_engine", 1)
    frame = spark.createDataFrame([(1, "a", 8, 1), (2, "b", 9, 1)], "id long, item string, price long, time long")
    with sediment_errors():
        if path == "stream":
            frame.write.parquet(str(tmp_path / "in"))
            q = (spark.readStream.schema(frame.schema).parquet(str(tmp_path / "in")).writeStream.format("sediment")
                 .options(**c.options("by_spark")).option("checkpointLocation", str(tmp_path / "ck")).start())
            try:
                q.processAllAvailable()
            finally:
                q.stop()
        else:
            w = frame.write.format("sediment").mode("append").options(**c.options("by_spark"))
            (w.option("bulk", "true") if path == "bulk" else w).save()
    e.seal("by_spark", 1)
    got = e.snapshot("by_spark", 1)
    assert got.equals(e.snapshot("by_engine", 1))
    assert sorted(got.to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "item": "a", "qty": None, "price": 8, "diff": 1},
        {"id": 2, "item": "b", "qty": None, "price": 9, "diff": 1}]
    only_id = spark.createDataFrame([(3, "c", 2)], "id long, item string, time long")
    w = only_id.write.format("sediment").mode("append").options(**c.options("by_spark"))
    with sediment_errors():
        (w.option("bulk", "true") if path == "bulk" else w).save()
    e.seal("by_spark", 2)
    assert e.snapshot("by_spark", 2).filter(pa.compute.field("id") == 3).to_pylist() == [
        {"id": 3, "item": "c", "qty": None, "price": 5, "diff": 1}]  # price: its default, as the engine fills it


@pytest.mark.parametrize("bulk", [False, True])
def test_a_frame_without_a_required_column_is_refused_at_planning(spark, coordinator, bulk):
    from sediment.errors import SchemaMismatch
    from sediment.spark_jobs import register
    from sediment.spark_jobs.errors import sediment_errors

    register(spark)
    c = coordinator(compact_interval=None)
    _altered_for_omission(c.engine, "r")
    frame = spark.createDataFrame([("a", 3, 1)], "item string, qty int, time long")  # no id: a version-0 column
    w = frame.write.format("sediment").mode("append").options(**c.options("r"))
    with pytest.raises(SchemaMismatch, match=r"missing \['id'\] \(required"), sediment_errors():
        (w.option("bulk", "true") if bulk else w).save()
    stats = c.engine.stats()
    assert stats["relations"]["r"]["tail_records"] == 0 and stats["relations"]["r"]["batches"] == 0
    assert stats["wal"]["open_transactions"] == 0 and c.engine.schema_version("r") == 1


def test_ingest_leaves_out_columns_an_alter_added(spark, coordinator, tmp_path):
    from sediment.spark_jobs import ingest

    c = coordinator(compact_interval=None)
    _altered_for_omission(c.engine, "r")
    (tmp_path / "in.csv").write_text("id,item,qty\n1,tea,4\n")  # no price: its default
    common = ["--uri", c.uri, "--token", c.token, "--relation", "r", "--input", str(tmp_path / "in.csv")]
    ingest.run(spark, ingest.parse_args([*common, "--time", "1", "--seal"]))
    assert c.engine.snapshot("r", 1).to_pylist() == [{"id": 1, "item": "tea", "qty": 4, "price": 5, "diff": 1}]
    (tmp_path / "no_id.csv").write_text("item,qty\njam,2\n")
    end = c.engine.stats()["wal"]["end_lsn"]
    with pytest.raises(SystemExit, match=r"lacks relation column\(s\) \['id'\]"):
        ingest.run(spark, ingest.parse_args([*common[:-1], str(tmp_path / "no_id.csv"), "--time", "2"]))
    assert c.engine.stats()["wal"]["end_lsn"] == end  # refused before anything was written
