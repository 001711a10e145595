"""The ``sediment`` data source as a Delta or Paimon user tries it: ``load()`` gives the table,
every read option against a Python model, errors before any job, SQL tables and views,
pushdown, key-range splits of batches and of the WAL tail. A real local[2] session (shared,
from tests/support/fixtures_spark.py) and a Flight coordinator on 127.0.0.1."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

pytest.importorskip("pyspark", reason="the Spark tests need PySpark (pip install -e '.[test]')")

from pyspark.sql import functions as F  # noqa: E402
from support.fixtures_spark import append_updates, append_wal_tail  # noqa: E402

from sediment import spark_jobs  # noqa: E402
from sediment.errors import AsOfOutOfRange, InvalidArgument  # noqa: E402
from sediment.spark_jobs import batch_read  # noqa: E402
from sediment.spark_jobs import datasource as ds  # noqa: E402
from sediment.spark_jobs.errors import sediment_error, sediment_errors  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("item", pa.string())])
ROOT = Path(__file__).resolve().parent.parent.parent


append = append_updates



def model(updates, as_of, from_t=None):
    """What a read must give, computed here: the snapshot, or the changes in (from_t, as_of]."""
    sums: Counter = Counter()
    for i, item, t, d in updates:
        if t <= as_of and (from_t is None or t > from_t):
            sums[(i, item) if from_t is None else (i, item, t)] += d
    return Counter({(*k, v): 1 for k, v in sums.items() if v})


def rows(df) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def load(spark, c, relation="orders", **options):
    reader = spark.read.format("sediment").options(**c.options(relation))
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


@pytest.fixture
def history(coordinator):
    """A relation with batches (times <= 6, since 3) and a WAL tail (times 7..10), with
    retractions, nulls and repeated rows; returns (coordinator, updates)."""
    c = coordinator()
    c.engine.add_relation("orders", SCHEMA)
    rnd = random.Random(16)
    updates = []
    for t in range(1, 11):
        batch = [(rnd.randrange(40), rnd.choice(["tea", "jam", None]), t, rnd.choice([1, 1, -1, 2]))
                 for _ in range(60)]
        updates += batch
        append(c, batch)
        c.engine.seal("orders", t)
        if t == 6:
            c.engine.set_since("orders", 3)
            c.engine.compact()
    info = c.engine.trace_info("orders")
    assert info["batches"] >= 1 and info["tail_records"] >= 4
    return c, [(i, item, max(t, 3), d) for i, item, t, d in updates]  # times below since read as since


def test_every_read_option_matches_the_python_model(spark, history):
    c, updates = history
    got = load(spark, c)  # default: consolidated, as of the sealed frontier
    assert got.columns == ["id", "item", "diff"]
    assert rows(got) == model(updates, 10)
    for key in ("asOf", "ASOF", "as_of"):  # option names are case-insensitive; as_of still works
        for as_of in (3, 6, 8):
            assert rows(load(spark, c, **{key: as_of})) == model(updates, as_of), (key, as_of)
    for from_t, as_of in ((3, 10), (5, 7), (6, 6), (8, 10)):
        df = load(spark, c, asOf=as_of, **{"from": from_t})
        assert df.columns == ["id", "item", "time", "diff"]
        assert rows(df) == model(updates, as_of, from_t), (from_t, as_of)
    raw = load(spark, c, raw="true", asOf=9)
    assert raw.columns == ["id", "item", "time", "diff"]
    # raw gives the stored updates (an append stores its equal rows summed), so compare sums per (row, time)
    assert rows(ds.consolidate(raw, with_time=True)) == model(updates, 9, -1)
    raw_late = load(spark, c, raw="TRUE", asOf=9, **{"from": 7})
    assert {r["time"] for r in raw_late.collect()} == {8, 9}
    assert rows(ds.consolidate(raw_late, with_time=True)) == model(updates, 9, 7)
    for split in (5, 50):  # many small key ranges: each row still consolidated exactly once
        assert rows(load(spark, c, split_rows=split)) == model(updates, 10)


def test_bad_options_fail_on_the_driver_before_any_job_with_sediment_s_error(spark, history):
    c, _ = history
    sc = spark.sparkContext
    sc.setJobGroup("bad-options", "no job may start")
    try:
        with pytest.raises(Exception) as info:
            load(spark, c, timestampAsOf=5)
        typed = sediment_error(info.value)
        assert isinstance(typed, InvalidArgument) and "'timestampasof'" in str(typed)
        text = str(info.value)  # what a user of plain load() reads: the error, one frame, no Java stack
        assert "sediment.errors.InvalidArgument: the sediment data source has no option 'timestampasof'" in text
        assert len(text.splitlines()) <= 6, text
        with pytest.raises(AsOfOutOfRange, match=r"asOf=11 is outside \[since 3, sealed 10\]"):
            with sediment_errors():
                load(spark, c, asOf=11)
        with pytest.raises(AsOfOutOfRange, match="asOf=2 is outside"):
            ds.read_relation(spark, c.uri, "orders", 2, token=c.token)
        c.engine.add_relation("unsealed", SCHEMA)  # no asOf and never sealed: it says so, not "as_of ... -1"
        with pytest.raises(AsOfOutOfRange, match="relation 'unsealed' was never sealed"):
            with sediment_errors():
                load(spark, c, relation="unsealed")
        with pytest.raises(AsOfOutOfRange, match="from=1 is outside"):
            with sediment_errors():
                load(spark, c, asOf=5, **{"from": 1})
        with pytest.raises(InvalidArgument, match="'raw' must be true or false"):
            with sediment_errors():
                load(spark, c, raw="maybe")
        for key, value in (("lease_seconds", "x"), ("lease_seconds", "nan"), ("split_rows", "0"),
                           ("split_rows", "-5"), ("batch_rows", "0")):  # not a ValueError in a task, nor the default
            with pytest.raises(InvalidArgument, match=f"option '{key}' must be an? .* > 0, not '{value}'"):
                with sediment_errors():
                    load(spark, c, **{key: value}).collect()
    finally:
        sc.setJobGroup("", "")
    assert sc.statusTracker().getJobIdsForGroup("bad-options") == []  # every check ran at plan time


def test_sql_table_select_insert_and_temporary_view(spark, coordinator):
    c = coordinator()
    c.engine.add_relation("orders", SCHEMA)
    append(c, [(1, "tea", 1, 1), (2, "jam", 1, 1), (1, "tea", 2, -1)])
    c.engine.seal("orders", 2)
    o = c.options("orders")
    spark.sql(f"CREATE TABLE orders_t USING sediment OPTIONS (uri '{o['uri']}', token '{o['token']}', "
              "relation 'orders')")
    spark.sql(f"CREATE TABLE orders_sealing USING sediment OPTIONS (uri '{o['uri']}', token '{o['token']}', "
              "relation 'orders', seal 'true')")
    try:
        assert rows(spark.sql("SELECT * FROM orders_t")) == Counter({(2, "jam", 1): 1})
        described = {r["col_name"]: r["comment"] for r in spark.sql("DESCRIBE TABLE orders_t").collect()}
        assert "sediment relation 'orders'" in described["diff"] and o["token"] not in described["diff"]
        spark.sql("INSERT INTO orders_t SELECT 3, 'egg', 1")  # no time column: the next open time, 3
        assert c.engine.sealed("orders") == 2  # without the seal option the time stays open
        c.engine.seal("orders", 3)
        assert rows(spark.sql("SELECT id, item, diff FROM orders_t WHERE id > 1")) == \
            Counter({(2, "jam", 1): 1, (3, "egg", 1): 1})
        spark.sql("INSERT INTO orders_sealing (id, item) VALUES (4, 'rice')")  # a null diff is +1
        assert c.engine.sealed("orders") == 4  # seal 'true': appended at 4, then 4 sealed
        spark.sql("INSERT INTO orders_sealing SELECT id, item, -diff FROM orders_t WHERE id = 2")
        assert rows(spark.sql("SELECT * FROM orders_t")) == Counter({(3, "egg", 1): 1, (4, "rice", 1): 1})
        assert c.engine.sealed("orders") == 5
        spark.sql(f"CREATE TEMPORARY VIEW orders_then USING sediment OPTIONS (uri '{o['uri']}', "
                  f"token '{o['token']}', relation 'orders', asOf '2')")
        assert rows(spark.sql("SELECT * FROM orders_then")) == Counter({(2, "jam", 1): 1})
    finally:
        for t in ("orders_t", "orders_sealing"):
            spark.sql(f"DROP TABLE IF EXISTS {t}")
        spark.sql("DROP VIEW IF EXISTS orders_then")


def test_pushed_filters_skip_row_groups_keep_exact_results_and_show_in_explain(spark, coordinator, capsys):
    c = coordinator()
    c.engine.add_relation("orders", SCHEMA)
    n = 200_000
    ids = pa.array(range(n), pa.int64())
    items = pa.array([None if i % 97 == 0 else f"i{i % 13}" for i in range(n)], pa.string())
    c.engine.append("orders", pa.table({"id": ids, "item": items, "time": pa.repeat(pa.scalar(1, pa.int64()), n),
                                        "diff": pa.repeat(pa.scalar(1, pa.int64()), n)}))
    c.engine.seal("orders", 1)
    c.engine.compact()
    append(c, [(5, "i5", 2, -1), (199_999, None, 2, 1)])  # the tail is filtered too
    c.engine.seal("orders", 2)
    full = load(spark, c, split_rows=65_536)
    assert full.rdd.getNumPartitions() >= 3  # one batch of four row groups, read by key range
    want = Counter()
    for i, item in zip(ids.to_pylist(), items.to_pylist(), strict=True):
        want[(i, item)] += 1
    want[(5, "i5")] -= 1
    want[(199_999, None)] += 1
    cases = {"id = 7": lambda i, s: i == 7, "id < 1000": lambda i, s: i < 1000,
             "id <= 1000": lambda i, s: i <= 1000, "id > 199000": lambda i, s: i > 199_000,
             "id >= 199000": lambda i, s: i >= 199_000, "id IN (5, 6, 150000)": lambda i, s: i in (5, 6, 150_000),
             "item IS NULL AND id < 50000": lambda i, s: s is None and i < 50_000,
             "item = 'i3' AND id < 2000": lambda i, s: s == "i3" and i < 2000}
    for where, keep in cases.items():
        df = full.where(where)
        expected = Counter({(i, s, d): 1 for (i, s), d in want.items() if d and keep(i, s)})
        assert rows(df) == expected, where
    narrow = load(spark, c, split_rows=65_536).where("id < 1000")
    assert narrow.rdd.getNumPartitions() < full.rdd.getNumPartitions()  # row groups ruled out by statistics
    plan = narrow._jdf.queryExecution().executedPlan().toString()
    assert "BatchScan sediment" in plan and "Filter (" not in plan, plan  # the source took the filter
    capsys.readouterr()
    narrow.explain("formatted")  # where Spark shows what a Python source took: the scan's metadata
    shown = capsys.readouterr().out
    assert "BatchScan sediment" in shown and "LessThan(id,1000)" in shown.split("PushedFilters: [", 1)[1], shown
    assert "LessThan(id,1000)" in spark_jobs.pushed_filters(narrow)
    two = full.where("item IS NULL AND id IN (5, 6)")
    assert {"IsNull(item)", "In(id, [5,6])"} <= set(spark_jobs.pushed_filters(two)), spark_jobs.pushed_filters(two)
    kept = load(spark, c).where(F.col("diff") > 0)  # diff is known only after consolidation: Spark filters
    assert "Filter (" in kept._jdf.queryExecution().executedPlan().toString()
    assert not any("diff" in f for f in spark_jobs.pushed_filters(kept)), spark_jobs.pushed_filters(kept)
    assert kept.count() == sum(1 for d in want.values() if d > 0)


def test_the_wal_tail_is_split_by_key_range_across_tasks(spark, coordinator):
    c = coordinator(compact_interval=None)  # compaction runs when a WAL segment fills, so the tail stays
    c.engine.add_relation("orders", SCHEMA)
    n = 200_000
    append_wal_tail(c, n, 150_000)
    df = load(spark, c)
    assert df.rdd.getNumPartitions() >= 3
    got = df.groupBy("diff").count().collect()
    assert {r["diff"]: r["count"] for r in got} == {2: 50_000, 1: 100_000}  # repeats consolidated across tasks
    raw = load(spark, c, raw="true")
    assert raw.rdd.getNumPartitions() >= 3
    assert raw.groupBy("time", "diff").count().collect() == [(1, 1, n)]
    assert c.server._held_tails.leases()  # the rows stayed on the coordinator for the plans' leases
    for mode in ({}, {"raw": "true"}):  # the plan the driver's planning worker makes carries no tail rows
        options = {**c.options("orders"), **mode}
        parts = batch_read.SedimentReader(options, load(spark, c, **mode).schema, "").partitions()
        assert len(parts) >= 3 and all(p.tail == b"" and p.fetch is not None for p in parts), mode
        assert sum(len(batch_read.fetch_tail(p.fetch, options)) for p in parts) == n  # each row in one part


@pytest.mark.slow
def test_a_new_session_finds_the_source_by_itself(coordinator, tmp_path):
    """PySpark registers ``DefaultSource`` of every ``pyspark_*`` module on its path; the
    installed ``pyspark_sediment`` is that module (here put on the path by hand, as the
    editable install of the tests does not lay out top-level modules). Such a session has no
    readStream hook, so a stream read names startingAsOf, as the README says."""
    c = coordinator()
    c.engine.add_relation("orders", SCHEMA)
    append(c, [(1, "tea", 1, 1)])
    c.engine.seal("orders", 1)
    script = ("import os,sys\nfrom pyspark.sql import SparkSession\n"
              "s=SparkSession.builder.master('local[1]').config('spark.ui.enabled','false').getOrCreate()\n"
              f"o={{'uri':'{c.uri}','token':'{c.token}','relation':'orders'}}\n"
              "print('ROWS', s.read.format('sediment').options(**o).load().collect())\n"
              "def stream(name, **extra):\n"
              "    s.readStream.format('sediment').options(**o, **extra).load().writeStream.format('memory')"
              ".queryName(name).trigger(availableNow=True).start().awaitTermination()\n"
              "    return s.table(name).collect()\n"
              "try:\n    stream('plain')\nexcept Exception as e:\n"
              "    print('REFUSED', 'needs option(' + repr('startingAsOf') in str(e))\n"
              "print('STREAM', stream('named', startingAsOf='latest'))\ns.stop()\n")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": str(ROOT / "spark_jobs" / "plugin")}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ROWS [Row(id=1, item='tea', diff=1)]" in out.stdout
    # README: without register()'s readStream hook a stream read must name a stream option
    assert "REFUSED True" in out.stdout and "STREAM [Row(id=1, item='tea', time=1, diff=1)]" in out.stdout


def readme_spark_example() -> str:
    """The README's Spark code block, as written."""
    text = (ROOT / "README.md").read_text()
    start = text.index("```python\nimport sediment.spark_jobs\n") + len("```python\n")
    return text[start:text.index("```", start)]


def test_the_readme_spark_example_runs_as_written(spark, coordinator, tmp_path):
    """Issue 24, finding 9: every statement of the README's Spark example runs in order (only
    the coordinator's address differs), each read gives what its comment says, and the
    stream copies the relation into another exactly once."""
    import ast

    from pyspark.sql import DataFrame

    c = coordinator()
    c.engine.add_relation("orders", SCHEMA)
    c.engine.add_relation("copy", SCHEMA)
    updates = [(i, f"i{i}", i, 1) for i in range(1, 10)] + [(1, "i1", 8, -1), (2, "i2", 9, 2)]
    append(c, updates)
    c.engine.seal("orders", 9)
    spark.createDataFrame([(20, "staged")], "id long, item string").createOrReplaceTempView("staged")
    scope = {"spark": spark, "token": c.token, "ck": str(tmp_path / "ck"),
             "df": spark.createDataFrame([(10, "tea")], "id long, item string")}
    code = readme_spark_example().replace("grpc://127.0.0.1:8815", c.uri)
    assert code.count("spark.read.format") == 4
    read: list[Counter] = []
    try:
        for stmt in ast.parse(code).body:
            if isinstance(stmt, ast.Expr):
                value = eval(compile(ast.Expression(stmt.value), "README.md", "eval"), scope)  # noqa: S307
                if isinstance(value, DataFrame) and ast.unparse(stmt).endswith(".load()"):
                    read.append(rows(value))  # now: the later writes move the sealed frontier
            else:
                exec(compile(ast.Module([stmt], []), "README.md", "exec"), scope)  # noqa: S102
        scope["query"].processAllAvailable()
        assert c.engine.sealed("orders") == 10  # the write at 10, sealed; the INSERT at 11, still open
        c.engine.seal("orders", 11)
        scope["query"].processAllAvailable()
    finally:
        if "query" in scope:
            scope["query"].stop()
        spark.sql("DROP TABLE IF EXISTS orders")
    raw = Counter()
    for i, item, t, d in (r for r, n in read[3].items() for _ in range(n)):
        raw[(i, item, t)] += d
    assert read[:3] == [model(updates, 9), model(updates, 7), model(updates, 9, 7)]
    assert Counter({(*k, v): 1 for k, v in raw.items() if v}) == model(updates, 9, -1)
    c.engine.seal("copy", 11)
    everything = updates + [(10, "tea", 10, 1), (20, "staged", 11, 1)]
    copied = c.engine.snapshot("copy", 11)
    assert Counter(zip(*(copied.column(n).to_pylist() for n in ("id", "item", "diff")), strict=True)) == \
        Counter({k: 1 for k in model(everything, 11)})
