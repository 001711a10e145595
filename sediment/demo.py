"""``sediment demo``: the end-to-end run, with Spark on both sides of the engine.

It starts an engine (local WAL, local blob store or ``--blob s3://...``, local
metadata) in a temporary directory and serves it on a loopback port, exactly as
``sediment serve`` would. Then, with a progress display:

1. Spark generates a change stream (inserts, updates as retract-plus-insert, deletes)
   over ``--times`` timestamps, about ``--rows`` updates in all;
2. Spark feeds it through the ``sediment`` data source, one write job (one sediment
   transaction) per slice of times, each sealing its last time;
3. the compaction frontier moves to the middle time and the compacter compacts;
4. the engine is stopped and reopened (restart-time replay), and served again;
5. Spark reads the relation back through the data source at several ``as_of`` times and
   once as changes between two times, and compares each read with the same consolidation
   computed by Spark straight from the generated input.

It prints a short summary and exits non-zero on any mismatch. The input is generated
deterministically from hashes of each id (no driver-side state), so the stream and the
expected answers are Spark computations that scale with the executors.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import uuid
from typing import Any

import pyarrow as pa

import sediment
from sediment.errors import SedimentError
from sediment.progress import Progress

SCHEMA = pa.schema([("id", pa.int64()), ("item", pa.string()), ("qty", pa.int64())])
ITEMS = ["tea", "cake", "bread", "jam", "milk", "eggs", "rice", "salt"]
DEFAULT_ROWS = 1_000_000
DEFAULT_TIMES = 100
DEFAULT_JOBS = 10
RELATION = "orders"
UPDATES_PER_ID = 4.09  # measured average of the generator below at 100 times: sizes the id range


def _spark_modules() -> tuple[Any, Any]:
    """pyspark and sediment's data source, or one clear error if PySpark is missing."""
    try:
        from pyspark.sql import functions as F

        from sediment.spark_jobs import datasource
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith(("pyspark", "py4j")):
            raise
        raise SedimentError("the demo runs on Spark: install PySpark (`pip install pyspark`, or `make demo`, "
                            "which installs it)") from None
    return F, datasource


def generate(spark: Any, rows: int, times: int, seed: int = 7) -> Any:
    """A change stream of about ``rows`` updates at times 1..times (columns id, item, qty,
    time, diff). Each id is inserted at a time t0, updated ``u`` times ``gap`` apart (each
    update retracts the previous row and inserts one with qty + 1, at the same time), and
    deleted (its last row retracted) one gap after its last update for a quarter of ids.
    Everything derives from hashes of the id, so any executor computes any id's events."""
    F, _ds = _spark_modules()

    def h(salt: int, mod: int) -> Any:
        return F.pmod(F.xxhash64(F.col("id"), F.lit(seed * 1000 + salt)), F.lit(mod))

    ids = max(1, int(rows / UPDATES_PER_ID))
    base = spark.range(ids).select(
        F.col("id"),
        F.element_at(F.array(*[F.lit(i) for i in ITEMS]), (h(1, len(ITEMS)) + 1).cast("int")).alias("item"),
        (h(2, times) + 1).alias("t0"), h(3, 4).alias("u"), (h(4, 5) + 1).alias("gap"),
        (h(5, 4) == 0).alias("deleted"), (h(6, 9) + 1).alias("q0"))
    k = F.col("k")
    versions = base.select("*", F.explode(F.sequence(F.lit(0), F.col("u").cast("int"))).alias("k")).select(
        "id", "item", (F.col("q0") + k).alias("qty"), (F.col("t0") + k * F.col("gap")).alias("start"),
        F.when((k < F.col("u")) | F.col("deleted"), F.col("t0") + (k + 1) * F.col("gap")).alias("end"))
    inserts = versions.filter(F.col("start") <= times).select(
        "id", "item", "qty", F.col("start").cast("long").alias("time"), F.lit(1).cast("long").alias("diff"))
    retracts = versions.filter(F.col("end").isNotNull() & (F.col("end") <= times)).select(
        "id", "item", "qty", F.col("end").cast("long").alias("time"), F.lit(-1).cast("long").alias("diff"))
    return inserts.unionByName(retracts)


def expected(stream: Any, as_of: int, from_t: int | None = None) -> Any:
    """The consolidation computed straight from the generated input, by Spark, without sediment."""
    F, ds = _spark_modules()
    upto = stream.filter(F.col("time") <= as_of)
    if from_t is not None:
        upto = upto.filter(F.col("time") > from_t)
    return ds.consolidate(upto, with_time=from_t is not None)


def differences(got: Any, want: Any) -> int:
    """How many rows differ between two consolidated frames (each row appears once in each):
    one aggregation of got minus want, instead of two exceptAll shuffles."""
    F, _ds = _spark_modules()
    keys = [c for c in want.columns if c != "diff"]
    both = got.select(*keys, "diff").unionByName(want.select(*keys, (-F.col("diff")).alias("diff")))
    return both.groupBy(*keys).agg(F.sum("diff").alias("d"), F.count("*").alias("n")) \
        .filter((F.col("d") != 0) | (F.col("n") != 2)).count()


class _Served:
    """The engine served on a free loopback port, as `sediment serve` would serve it."""

    def __init__(self, data_dir: str, token: str, options: dict[str, Any]) -> None:
        from sediment.server import SedimentFlightServer

        self.engine = sediment.open(data_dir, **options)
        try:
            self.server = SedimentFlightServer(self.engine, "grpc://127.0.0.1:0", token)
        except BaseException:
            self.engine.close()
            raise

    @property
    def uri(self) -> str:
        return self.server.uri

    def stop(self) -> None:
        try:
            self.server.stop(grace=30.0)
        finally:
            self.engine.close()


def run(args: argparse.Namespace) -> int:
    """The demo; returns the exit code (0 when every read matched)."""
    rows = int(getattr(args, "rows", None) or DEFAULT_ROWS)
    times = int(getattr(args, "times", None) or DEFAULT_TIMES)
    jobs = max(1, min(times, int(getattr(args, "jobs", None) or DEFAULT_JOBS)))
    force = getattr(args, "progress", None)
    blob = getattr(args, "blob", None)
    endpoint = getattr(args, "s3_endpoint", None)
    F, ds = _spark_modules()
    from sediment.spark_jobs.session import local_spark

    options: dict[str, Any] = {"segment_bytes": 16 << 20, "compact_interval": 1.0}
    if blob:  # a fresh prefix: the demo never mixes with (or deletes) anything already there
        options["blob"] = blob.rstrip("/") + f"/sediment-demo-{uuid.uuid4().hex[:12]}"
        if blob.startswith("s3://") and endpoint:
            options["s3_endpoint"] = endpoint
    data_dir = tempfile.mkdtemp(prefix="sediment-demo-")  # never touches the user's data directory
    token = uuid.uuid4().hex
    timings: dict[str, float] = {}
    served: _Served | None = None
    spark = None
    checks = sorted({times // 2, times * 2 // 3, times - 1, times})
    since = times // 2
    mismatches: list[str] = []
    try:
        t0 = time.perf_counter()
        with Progress(0, "start Spark and a served engine", force=force):
            spark = local_spark("sediment-demo")
            served = _Served(data_dir, token, options)
            with sediment.connect(served.uri, token) as client:
                client.add_relation(RELATION, SCHEMA)
        timings["start"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        with Progress(0, f"generate about {rows} updates over {times} times", force=force):
            stream = generate(spark, rows, times).cache()
            per_time = {r["time"]: r["count"] for r in stream.groupBy("time").count().collect()}
            total = sum(per_time.values())
        timings["generate"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        bounds = [round(times * j / jobs) for j in range(jobs + 1)]
        with Progress(total, "feed", "updates", force=force) as bar:
            for lo, hi in zip(bounds, bounds[1:], strict=False):
                (stream.filter((F.col("time") > lo) & (F.col("time") <= hi)).write.format("sediment")
                 .option("uri", served.uri).option("token", token).option("relation", RELATION)
                 .option("seal", True).mode("append").save())
                bar.update(sum(n for t, n in per_time.items() if lo < t <= hi))
        with sediment.connect(served.uri, token) as client:
            if client.sealed(RELATION) < times:
                client.seal(RELATION, times)
        timings["feed+seal"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        with Progress(0, f"compact (since {since})", force=force), sediment.connect(served.uri, token) as client:
            client.set_since(RELATION, since)
            client.compact()
            info = client.trace_info(RELATION)
        timings["compact"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        with Progress(0, "restart the engine (replay)", force=force):
            served.stop()
            served = None
            served = _Served(data_dir, token, options)
        timings["restart"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        reads = [(as_of, None) for as_of in checks] + [(times, since)]
        with Progress(len(reads), "verify", "reads", force=force) as bar:
            for as_of, from_t in reads:
                with ds.open_relation(spark, served.uri, RELATION, as_of, from_t, token) as got:
                    wrong = differences(got, expected(stream, as_of, from_t))
                if wrong:
                    what = f"as_of {as_of}" + (f" from {from_t}" if from_t is not None else "")
                    mismatches.append(f"{what}: {wrong} rows differ")
                bar.update(1)
        timings["verify"] = time.perf_counter() - t0
        with sediment.connect(served.uri, token) as client:
            if blob:  # leave no objects behind in the user's bucket
                client.drop_relation(RELATION)
    finally:
        if served is not None:
            served.stop()
        if spark is not None:
            spark.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    print(f"sediment demo: {total} updates over {times} times, fed by Spark in {jobs} jobs (each committed "
          f"atomically) into relation {RELATION!r}" + (f" (batches on {options['blob']})" if blob else ""))
    print(f"  trace: {info['batches']} batches, {info['rows']} rows ({info['bytes'] / 1e6:.1f} MB), "
          f"since {info['since']}, upper {info['upper']}; engine restarted before the reads")
    print("  timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
    if mismatches:
        print("  verdict: MISMATCH: " + "; ".join(mismatches))
        return 1
    print(f"  verdict: OK, Spark reads as of {checks} and of the changes in ({since}, {times}] match the "
          "consolidation Spark computed from the input")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    parser.add_argument("--times", type=int, default=DEFAULT_TIMES)
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS)
    parser.add_argument("--blob", default=os.environ.get("SEDIMENT_BLOB"))
    parser.add_argument("--s3-endpoint", default=os.environ.get("AWS_ENDPOINT_URL"))
    raise SystemExit(run(parser.parse_args()))


if __name__ == "__main__":
    main()
