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
from typing import TYPE_CHECKING, Any

import pyarrow as pa

import sediment
from sediment.errors import SedimentError
from sediment.progress import Progress
from sediment.wording import counted

if TYPE_CHECKING:
    from sediment.client import Client

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


class _Settings:
    """The demo's size and storage, from the command line's arguments (all optional)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.rows = int(getattr(args, "rows", None) or DEFAULT_ROWS)
        self.times = int(getattr(args, "times", None) or DEFAULT_TIMES)
        self.jobs = max(1, min(self.times, int(getattr(args, "jobs", None) or DEFAULT_JOBS)))
        self.force = getattr(args, "progress", None)
        self.blob = getattr(args, "blob", None)
        endpoint = getattr(args, "s3_endpoint", None)
        self.options: dict[str, Any] = {"segment_bytes": 16 << 20, "compact_interval": 1.0}
        if self.blob:  # a fresh prefix: the demo never mixes with (or deletes) anything already there
            self.options["blob"] = self.blob.rstrip("/") + f"/sediment-demo-{uuid.uuid4().hex[:12]}"
            if self.blob.startswith("s3://") and endpoint:
                self.options["s3_endpoint"] = endpoint
        self.token = uuid.uuid4().hex
        self.checks = sorted({self.times // 2, self.times * 2 // 3, self.times - 1, self.times})
        self.since = self.times // 2


def _serve(data_dir: str, s: _Settings) -> Client:
    """The engine served on a free loopback port, as `sediment serve` would serve it: a client
    whose ``close()`` stops the server and closes the engine."""
    from sediment.server import serve_local

    return serve_local(sediment.open(data_dir, **s.options), token=s.token)


def _feed(spark: Any, stream: Any, per_time: dict[int, int], total: int, uri: str, s: _Settings) -> None:
    """One write job per slice of times, each sealing its last time; then seal the end."""
    F, _ds = _spark_modules()
    bounds = [round(s.times * j / s.jobs) for j in range(s.jobs + 1)]
    with Progress(total, "feed", "updates", force=s.force) as bar:
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            (stream.filter((F.col("time") > lo) & (F.col("time") <= hi)).write.format("sediment")
             .option("uri", uri).option("token", s.token).option("relation", RELATION)
             .option("seal", True).mode("append").save())
            bar.update(sum(n for t, n in per_time.items() if lo < t <= hi))
    with sediment.connect(uri, s.token) as client:
        if client.sealed(RELATION) < s.times:
            client.seal(RELATION, s.times)


def _verify(spark: Any, stream: Any, uri: str, s: _Settings) -> list[str]:
    """Read back at every checked time (and once as changes since ``since``) through the data
    source; each read compared with Spark's own consolidation of the input. The mismatches."""
    _F, ds = _spark_modules()
    mismatches = []
    reads = [(as_of, None) for as_of in s.checks] + [(s.times, s.since)]
    with Progress(len(reads), "verify", "reads", force=s.force) as bar:
        for as_of, from_t in reads:
            with ds.open_relation(spark, uri, RELATION, as_of, from_t, s.token) as got:
                wrong = differences(got, expected(stream, as_of, from_t))
            if wrong:
                what = f"as_of {as_of}" + (f" from {from_t}" if from_t is not None else "")
                mismatches.append(f"{what}: {counted(wrong, 'row')} differ{'s' if wrong == 1 else ''}")
            bar.update(1)
    return mismatches


def _report(s: _Settings, total: int, info: dict, timings: dict[str, float], mismatches: list[str]) -> int:
    print(f"sediment demo: {total} updates over {s.times} times, fed by Spark in {s.jobs} jobs (each committed "
          f"atomically) into relation {RELATION!r}" + (f" (batches on {s.options['blob']})" if s.blob else ""))
    print(f"  trace: {counted(info['batches'], 'batch')}, {counted(info['rows'], 'row')} "
          f"({info['bytes'] / 1e6:.1f} MB), "
          f"since {info['since']}, upper {info['upper']}; engine restarted before the reads")
    print("  timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
    if mismatches:
        print("  verdict: MISMATCH: " + "; ".join(mismatches))
        return 1
    print(f"  verdict: OK, Spark reads as of {s.checks} and of the changes in ({s.since}, {s.times}] match the "
          "consolidation Spark computed from the input")
    return 0


def run(args: argparse.Namespace) -> int:
    """The demo; returns the exit code (0 when every read matched)."""
    s = _Settings(args)
    _spark_modules()
    from sediment.spark_jobs.session import local_spark

    data_dir = tempfile.mkdtemp(prefix="sediment-demo-")  # never touches the user's data directory
    timings: dict[str, float] = {}
    served: Client | None = None
    spark = None

    def phase(name: str, label: str) -> Any:
        timings[name] = time.perf_counter()  # replaced by the duration when the phase ends
        return Progress(0, label, force=s.force)

    def done(name: str) -> None:
        timings[name] = time.perf_counter() - timings[name]

    try:
        with phase("start", "start Spark and a served engine"):
            spark = local_spark("sediment-demo")
            served = _serve(data_dir, s)
            served.add_relation(RELATION, SCHEMA)
        done("start")
        with phase("generate", f"generate about {s.rows} updates over {s.times} times"):
            stream = generate(spark, s.rows, s.times).cache()
            per_time = {r["time"]: r["count"] for r in stream.groupBy("time").count().collect()}
            total = sum(per_time.values())
        done("generate")
        timings["feed+seal"] = time.perf_counter()
        _feed(spark, stream, per_time, total, served.uri, s)
        done("feed+seal")
        with phase("compact", f"compact (since {s.since})"):
            served.set_since(RELATION, s.since)
            served.compact()
            info = served.trace_info(RELATION)
        done("compact")
        with phase("restart", "restart the engine (replay)"):
            served.close()
            served: Client | None = None
            served = _serve(data_dir, s)
        done("restart")
        timings["verify"] = time.perf_counter()
        mismatches = _verify(spark, stream, served.uri, s)
        done("verify")
        if s.blob:  # leave no objects behind in the user's bucket
            served.drop_relation(RELATION)
    finally:
        if served is not None:
            served.close()
        if spark is not None:
            spark.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    return _report(s, total, info, timings, mismatches)


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
