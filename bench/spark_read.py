"""Reading a relation through the ``sediment`` Spark data source, beside its peers, in one run.

Three comparisons, each against its peer in the same session, rounds interleaved (the
machine is shared and noisy), median of the rounds with their min-max printed:

* consolidated read: ``spark.read.format("sediment")...load()`` (the relation as of its
  sealed frontier: executors read key ranges of the batches and consolidate them, no
  shuffle) into Spark's ``noop`` sink, against ``spark.read.parquet(<the same batch files>)``
  + ``time <= as_of`` + ``groupBy(row columns).sum("diff")`` + ``diff != 0``. Target <= 1.1x.
* pushdown: the same load with ``where k < N/100`` (1% of rows), with pushdown on, against
  the same query with ``spark.sql.python.filterPushdown.enabled=false`` (Spark then filters
  above the full scan). Target >= 5x faster.
* streaming latency: a ``readStream`` of the relation with a 1 s processing-time trigger;
  the driver appends one row at the next time and seals it, and measures until the
  micro-batch holding the row reaches ``foreachBatch``: p50 and p99.

Setup: N updates of ``k int64, v string (16 B, a function of k)`` at T times, k drawn
uniformly from [0, N) (rows repeat across times), diff -1 for 5%, appended to an embedded
engine, sealed and compacted (no WAL tail: the read is all batches), served on loopback.

    .venv/bin/python bench/spark_read.py            # 4M updates, 3 rounds
    .venv/bin/python bench/spark_read.py --quick    # 1M updates, 3 rounds, fewer latency samples
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid

import pyarrow as pa
import pyarrow.compute as pc

import sediment
from sediment.server import SedimentFlightServer

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def updates(n: int, times: int, seed: int = 3) -> list[pa.Table]:
    """One table per time; rows repeat an earlier (k, v) with diff +1 or -1."""
    per = max(1, n // times)
    out = []
    for t in range(1, times + 1):
        k = pc.cast(pc.floor(pc.multiply(pc.random(per, initializer=seed * 1000 + t), n)), pa.int64())
        coin = pc.random(per, initializer=seed * 1000 + t + 500)
        diff = pc.if_else(pc.less(coin, 0.05), -1, 1).cast(pa.int64())
        out.append(pa.table({"k": k, "v": value_of(k), "time": pa.repeat(pa.scalar(t, pa.int64()), per),
                             "diff": diff}))
    return out


def value_of(k: pa.Array) -> pa.Array:
    return pc.utf8_lpad(pc.cast(pc.bit_wise_and(pc.multiply(k, 2654435761), (1 << 40) - 1), pa.string()), 16, "0")


def spread(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.2f} s (min {min(xs):.2f}, max {max(xs):.2f})"


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--times", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=None, help="streaming latency samples")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    rows = args.rows or (1_000_000 if args.quick else 4_000_000)
    samples = args.samples or (10 if args.quick else 30)
    from pyspark.sql import functions as F

    from sediment.spark_jobs.session import local_spark

    data_dir = tempfile.mkdtemp(prefix="sediment-bench-spark-", dir=args.dir)
    token = uuid.uuid4().hex
    try:
        engine = sediment.open(data_dir, compact=False, segment_bytes=256 << 20)
        engine.add_relation("bench", SCHEMA)
        for t, table in enumerate(updates(rows, args.times), start=1):
            engine.append("bench", table)
            engine.seal("bench", t)
        engine.compact()
        info = engine.trace_info("bench")
        plan = engine.plan_read("bench", args.times)
        files = [os.path.join(data_dir, "blobs", ref["key"]) for ref in plan.batches if ref["key"]]
        engine.release_read(plan.lease)
        assert plan.tail.num_rows == 0 and files, "the relation should be all batches"
        server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", token)
        spark = local_spark("sediment-bench")
        as_of = args.times
        cut = rows // 100

        def source():
            return (spark.read.format("sediment").option("uri", server.uri).option("token", token)
                    .option("relation", "bench").load())

        def plain_frame():
            df = spark.read.parquet(*files).filter(F.col("time") <= as_of)
            return df.groupBy("k", "v").agg(F.sum("diff").alias("diff")).filter(F.col("diff") != 0)

        def timed(make) -> float:
            t = time.perf_counter()
            make().write.format("noop").mode("overwrite").save()
            return time.perf_counter() - t

        def with_pushdown(on: bool) -> float:
            spark.conf.set(PUSHDOWN_CONF, "true" if on else "false")
            try:
                return timed(lambda: source().where(F.col("k") < cut))
            finally:
                spark.conf.set(PUSHDOWN_CONF, "true")

        ours = source().agg(F.count("*"), F.sum("diff")).first()  # the same answer, checked once
        theirs = plain_frame().agg(F.count("*"), F.sum("diff")).first()
        assert tuple(ours) == tuple(theirs), (ours, theirs)
        spark.conf.set(PUSHDOWN_CONF, "false")
        unpushed = source().where(F.col("k") < cut).agg(F.count("*"), F.sum("diff")).first()
        spark.conf.set(PUSHDOWN_CONF, "true")
        pushed = source().where(F.col("k") < cut).agg(F.count("*"), F.sum("diff")).first()
        assert tuple(pushed) == tuple(unpushed), (pushed, unpushed)
        timed(source), timed(plain_frame)  # warm-up: Python workers, JIT, page cache
        res: dict[str, list[float]] = {"sediment": [], "plain": [], "pushed": [], "unpushed": []}
        for _ in range(args.rounds):
            res["sediment"].append(timed(source))
            res["plain"].append(timed(plain_frame))
            res["pushed"].append(with_pushdown(True))
            res["unpushed"].append(with_pushdown(False))
        read_ratio = statistics.median(res["sediment"]) / statistics.median(res["plain"])
        push_gain = statistics.median(res["unpushed"]) / statistics.median(res["pushed"])

        latencies = stream_latency(spark, engine, server.uri, token, samples, data_dir)
        print(f"spark read: {rows} updates -> {info['rows']} stored rows in {info['batches']} batches "
              f"({info['bytes'] / 1e6:.1f} MB), {ours[0]} rows as of {as_of}; local[2], {args.rounds} rounds")
        print(f"  sediment load() (consolidated):        {spread(res['sediment'])}")
        print(f"  spark.read.parquet + groupBy/sum:      {spread(res['plain'])}")
        print(f"  consolidated read ratio {read_ratio:.2f}x (target <= 1.1x): {'OK' if read_ratio <= 1.1 else 'MISSED'}")
        print(f"  k < N/100 (1%, {pushed[0]} rows), pushdown on:  {spread(res['pushed'])}")
        print(f"  k < N/100, pushdown off:               {spread(res['unpushed'])}")
        print(f"  pushdown gain {push_gain:.1f}x (target >= 5x): {'OK' if push_gain >= 5 else 'MISSED'}")
        print(f"  streaming, 1 s trigger, append+seal -> row in foreachBatch, {len(latencies)} samples: "
              f"p50 {percentile(latencies, 0.5) * 1000:.0f} ms, p99 {percentile(latencies, 0.99) * 1000:.0f} ms, "
              f"max {max(latencies) * 1000:.0f} ms")
        spark.stop()
        server.stop()
        engine.close()
        return 0 if read_ratio <= 1.1 and push_gain >= 5 else 1
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def stream_latency(spark, engine, uri: str, token: str, samples: int, data_dir: str) -> list[float]:
    """Append one row at the next time and seal it; time until foreachBatch sees it."""
    engine.add_relation("live", SCHEMA)
    sent: dict[int, float] = {}
    arrived: dict[int, float] = {}
    cond = threading.Condition()

    def on_batch(df, batch_id: int) -> None:
        now = time.perf_counter()
        keys = [r["k"] for r in df.select("k").collect()]
        with cond:
            for k in keys:
                arrived.setdefault(k, now)
            cond.notify_all()

    q = (spark.readStream.format("sediment").option("uri", uri).option("token", token).option("relation", "live")
         .option("startingAsOf", "latest").load().writeStream.foreachBatch(on_batch)
         .option("checkpointLocation", os.path.join(data_dir, "stream-check")).trigger(processingTime="1 second")
         .start())
    try:
        for i in range(samples):
            t = engine.sealed("live") + 1
            with cond:
                sent[i] = time.perf_counter()
            engine.append("live", pa.table({"k": pa.array([i], pa.int64()), "v": value_of(pa.array([i], pa.int64())),
                                            "time": pa.array([t], pa.int64()), "diff": pa.array([1], pa.int64())}))
            engine.seal("live", t)
            with cond:
                if not cond.wait_for(lambda i=i: i in arrived, timeout=60):
                    raise RuntimeError(f"row {i} did not arrive within 60 s")
    finally:
        q.stop()
    return [arrived[i] - sent[i] for i in range(samples)]


if __name__ == "__main__":
    sys.exit(main())
