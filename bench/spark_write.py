"""Ingest through the ``sediment`` Spark data source beside ``df.write.parquet`` of the same
DataFrame, in one run.

Why: a job's rows go through Python workers (Arrow batches), the coordinator (Flight,
durable WAL appends into one transaction per task attempt) and one commit; Spark's own
Parquet writer is the peer for "put these rows somewhere durable". Target: >= 0.9x its
rows/s. The DataFrame is cached and counted first, so both sides write the same rows from
memory; a third side, a data source whose tasks drop Spark's Arrow batches, measures the
hand-off from the JVM to Python workers alone; a fourth, the bulk load
(``option("bulk", "true")``: Spark's own Parquet writer into the relation's staging
directory, then the coordinator's commit, timed to its end), targets >= 0.9x Parquet's
rows/s, and its read back must equal the row-by-row path's; a fifth, Spark's part of the bulk
load alone (the frame as the bulk load stages it, written to a local directory, no
coordinator: the frame itself when it has the relation's columns and types), says how much
of the gap is Spark's, a sixth adds only a constant ``diff`` column to the frame before
``df.write.parquet`` (what any projection costs), and a seventh writes it sorted within partitions as the bulk load did
before it learnt to skip the sort of a frame already in order. All sides write the same DataFrame (no extra projection on either side),
with fresh keys each round (a new cached frame per round, built untimed); rounds
alternate (the machine is shared and noisy); medians with min-max. Between measurements
the coordinator's background compaction of what earlier rounds wrote is run to its end
(``engine.compact()``, untimed), so that neither side is measured while the previous
round's compaction shares the two cores with it.

    .venv/bin/python bench/spark_write.py           # 4M rows, 3 rounds
    .venv/bin/python bench/spark_write.py --quick   # 1M rows, 3 rounds
    .venv/bin/python bench/spark_write.py --sides parquet,staged,bulk --rounds 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid

import pyarrow as pa

import sediment
from sediment.server import SedimentFlightServer

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
SIDES = ("sediment", "parquet", "dropped", "projected", "sorted", "staged", "bulk")


def floor_source() -> type:
    """A data source whose tasks take Spark's Arrow batches and drop them: what Spark's
    JVM-to-Python hand-off alone costs, the floor of any Python data source's ingest."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class DropWriter(DataSourceArrowWriter):
        def write(self, iterator):  # noqa: ANN001, ANN202 - PySpark's signature
            for _ in iterator:
                pass
            return WriterCommitMessage()

    class Drop(DataSource):
        @classmethod
        def name(cls) -> str:
            return "sediment_bench_drop"

        def writer(self, schema, overwrite):  # noqa: ANN001, ANN202 - PySpark's signature
            return DropWriter()

    return Drop


def spread(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.2f} s (min {min(xs):.2f}, max {max(xs):.2f})"


def frame(spark, first: int, rows: int):  # noqa: ANN001, ANN201 - PySpark's types
    """``rows`` fresh keys from ``first`` (k int64, v 16 B string, time 1-5), cached and counted."""
    from pyspark.sql import functions as F

    df = (spark.range(first, first + rows, numPartitions=2)
          .select(F.col("id").alias("k"), F.lpad(F.col("id").cast("string"), 16, "0").alias("v"),
                  (F.col("id") % 5 + 1).alias("time"))
          .cache())
    assert df.count() == rows
    return df


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--sides", default=",".join(SIDES), help=f"a subset of {','.join(SIDES)} (parquet always runs)")
    args = parser.parse_args()
    rows = args.rows or (1_000_000 if args.quick else 4_000_000)
    sides = [s for s in SIDES if s == "parquet" or s in args.sides.split(",")]
    from pyspark.sql import functions as F

    from sediment.spark_jobs import bulk_write
    from sediment.spark_jobs.bulk_write import staged_frame, written_as_is
    from sediment.spark_jobs.session import local_spark

    work = tempfile.mkdtemp(prefix="sediment-bench-spark-write-", dir=args.dir)
    token = uuid.uuid4().hex
    try:
        engine = sediment.open(os.path.join(work, "data"), segment_bytes=256 << 20)
        engine.add_relation("bench", SCHEMA)
        engine.add_relation("bench_bulk", SCHEMA)
        server = SedimentFlightServer(engine, "grpc://127.0.0.1:0", token)
        spark = local_spark("sediment-bench-write")
        spark.dataSource.register(floor_source())

        def to_sediment(df, relation: str, **extra: str) -> None:  # noqa: ANN001 - a DataFrame
            w = df.write.format("sediment").option("uri", server.uri).option("token", token).option("relation", relation)
            for key, value in extra.items():
                w = w.option(key, value)
            w.mode("append").save()

        def to_parquet(df) -> None:  # noqa: ANN001 - a DataFrame
            df.write.parquet("file://" + os.path.join(work, f"parquet-{uuid.uuid4().hex}"))

        def to_staged(df) -> None:  # noqa: ANN001 - a DataFrame
            frame = df if written_as_is(df.schema, SCHEMA) else staged_frame(df, SCHEMA, None, None)
            frame.write.parquet("file://" + os.path.join(work, f"staged-{uuid.uuid4().hex}"))

        def to_sorted(df) -> None:  # noqa: ANN001 - a DataFrame
            keys = [F.col(c).asc_nulls_last() for c in ("k", "v", "time")]
            (staged_frame(df, SCHEMA, None, None).sortWithinPartitions(*keys)
             .write.parquet("file://" + os.path.join(work, f"staged-{uuid.uuid4().hex}")))

        def to_projected(df) -> None:  # noqa: ANN001 - a DataFrame
            (df.select("*", F.lit(1).cast("long").alias("diff"))
             .write.parquet("file://" + os.path.join(work, f"staged-{uuid.uuid4().hex}")))

        write = {"sediment": lambda df: to_sediment(df, "bench"),
                 "parquet": to_parquet,
                 "dropped": lambda df: df.write.format("sediment_bench_drop").mode("append").save(),
                 "projected": to_projected,
                 "sorted": to_sorted,
                 "staged": to_staged,
                 "bulk": lambda df: to_sediment(df, "bench_bulk", bulk="true")}

        def timed(side: str, df) -> float:  # noqa: ANN001 - a DataFrame
            engine.compact()  # the previous round's compaction is not measured on either side
            t = time.perf_counter()
            write[side](df)
            took = time.perf_counter() - t
            for d in os.listdir(work):
                if d.startswith(("parquet-", "staged-")):
                    shutil.rmtree(os.path.join(work, d), ignore_errors=True)
            return took

        res: dict[str, list[float]] = {side: [] for side in sides}
        phases: list[dict[str, float]] = []  # the bulk load's own phases, per round
        for r in range(args.rounds + 1):  # round 0 warms up
            df = frame(spark, r * rows, rows)
            for side in sides:
                took = timed(side, df)
                if r:
                    res[side].append(took)
                    if side == "bulk":
                        phases.append(dict(bulk_write.last_phases, load=os.getloadavg()[0]))
            df.unpersist()
        report(engine, spark, server, token, rows, args.rounds, res)
        report_phases(res, phases)
        spark.stop()
        server.stop()
        engine.close()
        return 0 if all(ratio(res, side) >= 0.9 for side in ("sediment", "bulk") if side in res) else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ratio(res: dict[str, list[float]], side: str) -> float:
    """Of Parquet's rows/s, at the medians."""
    return statistics.median(res["parquet"]) / statistics.median(res[side])


def report(engine, spark, server, token: str, rows: int, rounds: int, res: dict[str, list[float]]) -> None:  # noqa: ANN001
    """Check what the sides wrote, then print each figure beside Parquet's."""
    from pyspark.sql import functions as F

    loaded = rows * (rounds + 1)
    for relation, side in (("bench", "sediment"), ("bench_bulk", "bulk")):
        if side in res:
            engine.seal(relation, 5)
            check = (spark.read.format("sediment").option("uri", server.uri).option("token", token)
                     .option("relation", relation).load().agg(F.count("*"), F.sum("diff")).first())
            assert tuple(check) == (loaded, loaded), (relation, tuple(check), loaded)  # every row once
    same = None
    if "sediment" in res and "bulk" in res:
        same = engine.snapshot("bench", 5).equals(engine.snapshot("bench_bulk", 5))
        assert same, "the bulk load reads back differently from the row-by-row path"
    print(f"spark ingest of {rows} rows a round (k int64 fresh each round, v 16 B string, time 1-5) from a cached "
          f"DataFrame; local[2], {rounds} rounds interleaved; load: {os.getloadavg()}")
    what = {"sediment": "sediment data source", "parquet": "df.write.parquet", "dropped": "Arrow hand-off alone",
            "projected": "Parquet, + a diff column", "sorted": "same, sorted by Spark", "staged": "bulk, Spark's part", "bulk": "bulk load"}
    fastest = min(res["parquet"])
    for side, xs in res.items():
        line = f"  {what[side]:22s} {spread(xs)}, {rows / statistics.median(xs) / 1e6:.2f} M rows/s"
        if side != "parquet":
            line += f", {ratio(res, side):.2f}x of Parquet's rows/s (fastest rounds {fastest / min(xs):.2f}x)"
        if side in ("sediment", "bulk"):
            line += f"; target >= 0.9x: {'OK' if ratio(res, side) >= 0.9 else 'MISSED'}"
        if side != "parquet":  # the same round's Parquet over this side's: pairs taken moments apart
            paired = [p / x for p, x in zip(res["parquet"], xs, strict=True)]
            line += f"; per round {statistics.median(paired):.2f}x ({min(paired):.2f}-{max(paired):.2f})"
        print(line)
    if "staged" in res and "bulk" in res:
        print(f"  bulk load minus Spark's part (the driver's calls and the commit): "
              f"{statistics.median(res['bulk']) - statistics.median(res['staged']):.2f} s at the medians")
    if same is not None:
        print(f"  bulk read back equals the row path's: {same}")


def report_phases(res: dict[str, list[float]], phases: list[dict[str, float]]) -> None:
    """Each round's bulk load cut into its phases (the driver's calls, Spark's write, the
    commit) beside the same round's Parquet: which part moves when the ratio does."""
    if not phases:
        return
    print("  bulk load per round: parquet | calls + spark + commit = bulk (ratio), load")
    for p, par, bulk in zip(phases, res["parquet"], res["bulk"], strict=True):
        print(f"    {par:.2f} s | {p['calls'] * 1e3:.0f} ms + {p['spark']:.2f} s + {p['commit'] * 1e3:.0f} ms = "
              f"{bulk:.2f} s ({par / bulk:.2f}x), load {p['load']:.1f}")
    for name in ("calls", "spark", "commit"):
        xs = [p[name] for p in phases]
        print(f"  bulk {name}: median {statistics.median(xs) * 1e3:.0f} ms (min {min(xs) * 1e3:.0f}, "
              f"max {max(xs) * 1e3:.0f})")


if __name__ == "__main__":
    sys.exit(main())
