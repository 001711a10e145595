"""Structured Streaming both ways through the ``sediment`` source: a stream read (snapshot,
then changes; a failure mid-stream and a restart from the checkpoint; availableNow; the rate
limit) and a stream sink committed exactly once per micro-batch, including after its Spark
driver is SIGKILLed. Real local Spark, a Flight coordinator on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

import sediment

pytest.importorskip("pyspark", reason="the Spark tests need PySpark (pip install -e '.[test]')")

from support.fixtures_spark import append_updates, append_wal_tail  # noqa: E402

from sediment.errors import InvalidArgument, TransactionError  # noqa: E402
from sediment.spark_jobs import stream_write  # noqa: E402
from sediment.spark_jobs.errors import sediment_errors  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("item", pa.string())])
ROOT = Path(__file__).resolve().parent.parent.parent


append = append_updates



def changes(updates, lo, hi):
    """Consolidated (id, item, time, diff) of the updates at times in (lo, hi]."""
    sums: Counter = Counter()
    for i, item, t, d in updates:
        if lo < t <= hi:
            sums[(i, item, t)] += d
    return sorted((*k, v) for k, v in sums.items() if v)


def snapshot_at(updates, t):
    sums: Counter = Counter()
    for i, item, u, d in updates:
        if u <= t:
            sums[(i, item)] += d
    return sorted((*k, t, v) for k, v in sums.items() if v)


def stream(spark, c, relation="orders", **options):
    reader = spark.readStream.format("sediment").options(**c.options(relation))
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


class Batches:
    """A foreachBatch function that records each micro-batch's rows, and fails once on the
    batch named ``fail_on`` (a real exception in user code, after Spark planned the batch)."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.got: dict[int, list[tuple]] = {}
        self.fail_on = fail_on

    def __call__(self, df, batch_id: int) -> None:
        rows = sorted(tuple(r) for r in df.collect())
        if batch_id == self.fail_on:
            self.fail_on = None
            raise RuntimeError(f"user code fails in micro-batch {batch_id}")
        self.got[batch_id] = rows


def test_stream_read_snapshot_changes_failure_restart_and_available_now(spark, coordinator, tmp_path):
    c = coordinator()
    c.engine.add_relation("orders", SCHEMA)
    updates = [(1, "tea", 1, 1), (2, "jam", 1, 1), (1, "tea", 2, -1), (3, "egg", 2, 1), (3, "egg", 3, 1),
               (4, "rice", 3, 1)]
    append(c, updates)
    c.engine.seal("orders", 3)
    check = str(tmp_path / "check")
    sink = Batches()
    q = (stream(spark, c, startingAsOf="2").writeStream.foreachBatch(sink)
         .option("checkpointLocation", check).start())
    try:
        q.processAllAvailable()
        assert sink.got == {0: snapshot_at(updates, 2), 1: changes(updates, 2, 3)}
        more = [(4, "rice", 4, -1), (5, "tea", 4, 1), (5, "tea", 5, 2), (6, "jam", 6, 1)]
        append(c, more)
        updates += more
        c.engine.seal("orders", 4)
        q.processAllAvailable()
        assert sink.got[2] == changes(updates, 3, 4)
    finally:
        q.stop()
    c.engine.seal("orders", 6)  # sealed while the query is down
    failing = Batches(fail_on=3)  # the restarted query fails in its first batch, before committing it
    failing.got = dict(sink.got)
    q = (stream(spark, c, startingAsOf="2", maxTimesPerTrigger=1).writeStream.foreachBatch(failing)
         .option("checkpointLocation", check).start())
    with pytest.raises(Exception, match="user code fails in micro-batch 3"):
        q.awaitTermination()
    assert 3 not in failing.got
    q = (stream(spark, c, startingAsOf="earliest", maxTimesPerTrigger=1).writeStream.foreachBatch(failing)
         .option("checkpointLocation", check).trigger(availableNow=True).start())
    q.awaitTermination()  # availableNow: up to the sealed frontier, then the query ends by itself
    # the checkpoint wins over startingAsOf; the failed batch 3 is read again, one time per batch
    assert failing.got[3] == changes(updates, 4, 5) and failing.got[4] == changes(updates, 5, 6)
    assert sorted(failing.got) == [0, 1, 2, 3, 4]
    seen = [r for b in sorted(failing.got)[1:] for r in failing.got[b]]
    assert sorted(seen) == changes(updates, 2, 6)  # no gap, no duplicate


def test_stream_read_starting_points_and_refusals(spark, coordinator, tmp_path):
    c = coordinator()
    c.engine.add_relation("orders", SCHEMA)
    updates = [(1, "tea", 1, 1), (1, "tea", 2, -1), (2, "jam", 2, 1)]
    append(c, updates)
    c.engine.seal("orders", 2)
    for start, want in (("earliest", {0: snapshot_at(updates, 0), 1: changes(updates, 0, 2)}),
                        ("latest", {0: snapshot_at(updates, 2)}),
                        (None, {0: snapshot_at(updates, 2)})):  # no option at all: latest, with time
        sink = Batches()
        df = stream(spark, c, **({} if start is None else {"startingAsOf": start}))
        assert df.columns == ["id", "item", "time", "diff"], (start, df.columns)
        q = (df.writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(tmp_path / str(start))).trigger(availableNow=True).start())
        q.awaitTermination()
        assert {b: r for b, r in sink.got.items() if r or b == 0} == want, start
    assert spark.read.format("sediment").options(**c.options("orders")).load().columns == ["id", "item", "diff"]
    c.engine.add_relation("fresh", SCHEMA)  # never sealed when the query starts: no snapshot, then everything
    sink = Batches()
    q = (stream(spark, c, "fresh", startingAsOf="latest").writeStream.foreachBatch(sink)
         .option("checkpointLocation", str(tmp_path / "fresh")).start())
    try:
        q.processAllAvailable()
        append(c, [(7, "tea", 0, 1), (8, "jam", 1, 1)], relation="fresh")
        c.engine.seal("fresh", 1)
        q.processAllAvailable()
    finally:
        q.stop()
    assert [r for b in sorted(sink.got) for r in sink.got[b]] == [(7, "tea", 0, 1), (8, "jam", 1, 1)]
    with pytest.raises(Exception, match="startingAsOf=9 is outside"):
        with sediment_errors():
            stream(spark, c, startingAsOf="9").writeStream.foreachBatch(Batches()).start().awaitTermination()
    with pytest.raises(InvalidArgument, match="do not apply when reading a stream"):
        with sediment_errors():
            stream(spark, c, startingAsOf="latest", asOf="1").writeStream.foreachBatch(Batches()) \
                .start().awaitTermination()


def test_stream_sink_commits_each_batch_once_even_when_replayed(spark, coordinator, tmp_path):
    """Spark replays the last micro-batch after a restart: the sink's commit of an already
    committed batch aborts the new attempt's transactions. Driven directly, then through Spark."""
    c = coordinator()
    c.engine.add_relation("orders", SCHEMA)
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    schema = StructType([StructField("id", LongType()), StructField("item", StringType())])
    options = {**c.options("orders"), "checkpointlocation": str(tmp_path / "ck")}
    batch = pa.record_batch([pa.array([1, 2], pa.int64()), pa.array(["tea", "jam"])], names=["id", "item"])

    def run(batch_id: int) -> None:
        """One micro-batch in a new run of the query (outside Spark every task is in stage 0,
        and a stage's group ends when it commits, so each run builds its writer anew)."""
        writer = stream_write.SedimentStreamWriter(options, schema, False)
        writer.commit([writer.write(iter([batch]))], batch_id)

    for _ in range(2):  # the same micro-batch 0 written and committed twice
        run(0)
    assert c.engine.sealed("orders") == 0 and c.engine.snapshot("orders", 0).num_rows == 2
    assert c.server.open_transactions == []
    run(1)
    with pytest.raises(TransactionError, match="micro-batch 0 is older than batch 1"):  # a reset checkpoint
        run(0)
    assert c.engine.sealed("orders") == 1 and c.engine.snapshot("orders", 1).column("diff").to_pylist() == [2, 2]
    assert c.server.open_transactions == []
    src = tmp_path / "in"
    src.mkdir()
    for k in range(3):
        (src / f"f{k}.json").write_text("".join(json.dumps({"id": 10 * k + i, "item": "x"}) + "\n" for i in range(4)))
    q = (spark.readStream.schema("id long, item string").option("maxFilesPerTrigger", 1).json(str(src))
         .writeStream.format("sediment").options(**c.options("orders"))
         .option("checkpointLocation", str(tmp_path / "ck2")).trigger(availableNow=True).start())
    q.awaitTermination()
    assert c.engine.sealed("orders") == 4  # three more micro-batches, each at the next open time, sealed
    for t in (2, 3, 4):
        got = c.engine.snapshot("orders", t).num_rows - c.engine.snapshot("orders", t - 1).num_rows
        assert got == 4, t


def test_a_stream_from_one_relation_into_another_commits_each_update_once(spark, coordinator, tmp_path):
    """Issue 24, finding 1: the options of the stream read (its readStream mark, startingAsOf)
    stayed in the frame's schema and reached the sink, which refused them. Two pipelines, with
    and without startingAsOf, and a batch copy as of a time; each copy holds every update
    once, and the sinks' progress relations stay out of the listing of relations."""
    c = coordinator()
    for name in ("orders", "copy", "copy_latest"):
        c.engine.add_relation(name, SCHEMA)
    updates = [(1, "tea", 1, 1), (2, "jam", 1, 1), (1, "tea", 2, -1), (3, "egg", 2, 1)]
    append(c, updates)
    c.engine.seal("orders", 2)

    def pipe(sink: str, **read: str):
        return (stream(spark, c, **read).writeStream.format("sediment").options(**c.options(sink))
                .option("seal", "true").option("checkpointLocation", str(tmp_path / sink)).start())

    queries = [pipe("copy", startingAsOf="earliest"), pipe("copy_latest")]
    try:
        for q in queries:
            q.processAllAvailable()
        more = [(3, "egg", 3, -1), (4, "rice", 3, 1)]
        append(c, more)
        c.engine.seal("orders", 3)
        for q in queries:
            q.processAllAvailable()
    finally:
        for q in queries:
            q.stop()

    def rows(relation: str, t: int) -> list[tuple]:
        table = c.engine.snapshot(relation, t)
        return sorted(zip(*(table.column(n).to_pylist() for n in ("id", "item", "diff")), strict=True))

    assert c.engine.sealed("copy") == c.engine.sealed("copy_latest") == 3
    for t in (1, 2, 3):  # from earliest: every time as in the source, each update once
        assert rows("copy", t) == rows("orders", t), t
    assert rows("copy_latest", 2) == rows("orders", 2) and rows("copy_latest", 3) == rows("orders", 3)
    c.engine.add_relation("then", SCHEMA)  # a batch copy as of 2: asOf stays with the read too
    (spark.read.format("sediment").options(**c.options("orders")).option("asOf", 2).load()
     .write.format("sediment").options(**c.options("then")).option("time", 0).option("seal", True)
     .mode("append").save())
    assert rows("then", 0) == rows("orders", 2)
    assert c.engine.relations() == ["copy", "copy_latest", "orders", "then"]
    assert len(c.engine.relations(include_internal=True)) == 6  # plus the two sinks' progress relations


CHILD = """
import sys
from sediment.spark_jobs.session import local_spark
uri, token, src, check, trigger = sys.argv[1:6]
spark = local_spark("sink-child", master="local[2]")
w = (spark.readStream.schema("id long, item string").option("maxFilesPerTrigger", 1).json(src)
     .writeStream.format("sediment").option("uri", uri).option("token", token).option("relation", "orders")
     .option("checkpointLocation", check))
q = (w.trigger(availableNow=True) if trigger == "now" else w).start()
print("started", flush=True)
q.awaitTermination()
"""


@pytest.mark.slow
def test_stream_sink_killed_with_sigkill_and_restarted_writes_each_row_once(coordinator, tmp_path):
    c = coordinator()
    c.engine.add_relation("orders", SCHEMA)
    src = tmp_path / "in"
    src.mkdir()
    files = 8
    for k in range(files):
        (src / f"f{k}.json").write_text("".join(json.dumps({"id": 100 * k + i, "item": f"i{k}"}) + "\n"
                                               for i in range(50)))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1"}
    args = [sys.executable, "-c", CHILD, c.uri, c.token, str(src), str(tmp_path / "ck")]
    c.engine.seal("orders", 0)  # a feed starts at a sealed time; the sink's first batch goes to time 1
    feed = c.engine.subscribe("orders")
    child = subprocess.Popen([*args, "run"], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        sealed = -1
        while sealed < 3:  # wait for the third micro-batch's seal, then kill the driver at once
            event = feed.next(timeout=240)
            assert event is not None, "the streaming child committed nothing"
            if event.kind == "progress":
                sealed = event.time
        os.killpg(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
        feed.close()
    assert child.returncode == -signal.SIGKILL
    done = subprocess.run([*args, "now"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    sealed = c.engine.sealed("orders")
    got = Counter()
    for r in zip(*(c.engine.snapshot("orders", sealed).column(n).to_pylist() for n in ("id", "item", "diff")),
                 strict=True):
        got[r[:2]] += r[2]
    assert got == Counter({(100 * k + i, f"i{k}"): 1 for k in range(files) for i in range(50)})  # once each
    assert sealed == files  # one time per file (micro-batch), none skipped or repeated


class Shapes:
    """A foreachBatch function that records each micro-batch's task count and its rows' totals."""

    def __init__(self) -> None:
        self.got: dict[int, tuple[int, Counter]] = {}

    def __call__(self, df, batch_id: int) -> None:
        totals = Counter({(r["time"], r["diff"]): r["count"] for r in df.groupBy("time", "diff").count().collect()})
        self.got[batch_id] = (df.rdd.getNumPartitions(), totals)


def test_a_stream_reads_a_large_wal_tail_in_parallel_tasks(spark, coordinator, tmp_path):
    c = coordinator(compact_interval=None)  # compaction runs when a WAL segment fills, so the tail stays
    c.engine.add_relation("orders", SCHEMA)
    n = 150_000
    append_wal_tail(c, n, 100_000)
    sink = Shapes()
    q = (stream(spark, c, startingAsOf="earliest").writeStream.foreachBatch(sink)
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination()
    tasks, totals = sink.got[1]  # batch 0 is the (empty) snapshot at since 0; batch 1 the changes in (0, 1]
    assert totals == Counter({(1, 2): 50_000, (1, 1): 50_000})  # repeats consolidated across the tasks
    assert tasks >= 3
    held = c.server._held_tails.leases()
    assert set(held) <= set(c.engine.collector.readers.leases), (held, c.engine.collector.readers.leases)  # rows only for live leases


def test_a_failed_stream_query_gives_sediment_s_typed_error(spark, tmp_path):
    """A micro-batch whose tasks fail with a sediment error (the coordinator, a ``sediment
    serve`` process, SIGKILLed by a task): the query's own exception says only "Writing job
    failed" (the tasks' traceback is in its cause), and ``sediment_errors()`` around
    ``awaitTermination`` still gives the one line."""
    from pyspark.sql import functions as F
    from support.served import Served

    from sediment.errors import CoordinatorUnavailable

    served = Served(tmp_path / "data")
    try:
        with sediment.connect(served.uri, token=served.token) as client:
            client.add_relation("orders", SCHEMA)
        pid, marker = served.proc.pid, str(tmp_path / "killed")

        @F.udf("long", useArrow=False)
        def kill_on_first(i: int) -> int:
            if not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(pid, signal.SIGKILL)
            return i

        src = tmp_path / "in"
        src.mkdir()
        (src / "f0.json").write_text(json.dumps({"id": 1, "item": "x"}) + "\n")
        q = (spark.readStream.schema("id long, item string").json(str(src)).select(kill_on_first("id").alias("id"), "item")
             .writeStream.format("sediment").option("uri", served.uri).option("token", served.token)
             .option("relation", "orders").option("checkpointLocation", str(tmp_path / "ck")).start())
        try:
            with pytest.raises(CoordinatorUnavailable, match="no coordinator answered") as info:
                with sediment_errors():
                    q.awaitTermination(120)
            assert len(str(info.value).splitlines()) == 1
        finally:
            q.stop()
    finally:
        served.kill()


def test_a_reset_checkpoint_s_first_batch_is_refused_not_taken_for_a_replay(spark, coordinator, tmp_path):
    """A sink that committed only micro-batch 0, then its checkpoint deleted and the query
    started again on the same location: the new query's batch 0 is no replay of the old one
    (another Spark query id), so it is refused like an older batch, not dropped in silence."""
    import shutil

    c = coordinator()
    c.engine.add_relation("orders", SCHEMA)
    src = tmp_path / "in"
    src.mkdir()

    def start():
        return (spark.readStream.schema("id long, item string").json(str(src))
                .writeStream.format("sediment").options(**c.options("orders"))
                .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())

    (src / "f0.json").write_text(json.dumps({"id": 1, "item": "a"}) + "\n")
    start().awaitTermination(120)
    assert [b.column("id").to_pylist() for b in c.engine.replay("orders")] == [[1]]
    shutil.rmtree(tmp_path / "ck")
    (src / "f1.json").write_text(json.dumps({"id": 2, "item": "b"}) + "\n")
    q = start()
    try:
        with pytest.raises(TransactionError, match="micro-batch 0 of another query repeats batch 0.*checkpoint was reset"):
            with sediment_errors():
                q.awaitTermination(120)
    finally:
        q.stop()
    assert sorted(i for b in c.engine.replay("orders") for i in b.column("id").to_pylist()) == [1]  # nothing more


def test_a_progress_relation_from_before_query_ids_gains_the_column_and_keeps_its_batches(coordinator, tmp_path):
    """A sink whose progress relation was made with (batch, data_time) only: the writer adds
    the ``query`` column, a replay of its last batch is still skipped, and the next commits."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    c = coordinator()
    c.engine.add_relation("orders", SCHEMA)
    options = {**c.options("orders"), "checkpointlocation": str(tmp_path / "ck")}
    progress = f"_spark_sink.{stream_write.sink_id(options, 'orders')}"
    c.engine.add_relation(progress, pa.schema([("batch", pa.int64()), ("data_time", pa.int64())]))
    c.engine.append(progress, pa.table({"batch": pa.array([0], pa.int64()), "data_time": pa.array([0], pa.int64()),
                                        "time": pa.array([0], pa.int64()), "diff": pa.array([1], pa.int64())}))
    c.engine.seal(progress, 0)
    schema = StructType([StructField("id", LongType()), StructField("item", StringType())])
    batch = pa.record_batch([pa.array([1], pa.int64()), pa.array(["tea"])], names=["id", "item"])
    for batch_id in (0, 1):
        writer = stream_write.SedimentStreamWriter(options, schema, False)
        writer.commit([writer.write(iter([batch]))], batch_id)
    assert c.engine.schema(progress).names == ["batch", "data_time", "query"]
    assert sum(b.num_rows for b in c.engine.replay("orders")) == 1  # batch 0 skipped as a replay, batch 1 taken
    assert c.server.open_transactions == []
