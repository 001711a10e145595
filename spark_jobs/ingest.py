"""Feed CSV, Parquet or JSON files into a relation through the ``sediment`` data source.

    python -m sediment.spark_jobs.ingest --uri grpc://127.0.0.1:8815 --relation orders \\
        --input orders.csv --format csv --time 7 [--seal] [--map order_id=id ...]
    spark-submit spark_jobs/ingest.py --uri ... (the same arguments)

Columns are renamed by ``--map SRC=DST``, then every relation column is taken from the
input and cast to the relation's type (CSV columns arrive as strings); columns an alter
added may be missing (the append fills them with their default); other input columns are
ignored. Each row's time is ``--time`` or the input's ``time`` column, its diff
``--diff`` or the input's ``diff`` column or +1. The whole input is one write job, so one
sediment transaction: a failure anywhere leaves nothing visible. ``--seal`` closes the
time (with a time column: the greatest time written) once the job has committed.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sediment.spark_jobs.session import (
    JobParser,
    add_connection_args,
    debugging,
    local_spark,
    run_job,
    token_of,
)

FORMATS = ("csv", "parquet", "json")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = JobParser(prog="sediment.spark_jobs.ingest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_connection_args(parser)
    parser.add_argument("--input", required=True, help="a file or directory (anything Spark's readers accept)")
    parser.add_argument("--format", choices=FORMATS, default=None, help="default: from --input's extension")
    parser.add_argument("--time", type=int, default=None, help="the time of every row (else a 'time' column)")
    parser.add_argument("--diff", type=int, default=None, help="the diff of every row (else a 'diff' column, or 1)")
    parser.add_argument("--map", action="append", default=[], metavar="SRC=DST",
                        help="rename input column SRC to relation column DST (repeatable)")
    parser.add_argument("--no-header", dest="header", action="store_false", help="CSV files have no header line")
    parser.add_argument("--seal", action="store_true", help="seal the time written once the job commits")
    args = parser.parse_args(argv)
    if args.format is None:
        ext = args.input.rstrip("/").rsplit(".", 1)[-1].lower()
        if ext not in FORMATS:
            parser.error(f"cannot tell the format of {args.input!r} from its extension: pass --format")
        args.format = ext
    if args.diff == 0:
        parser.error("--diff 0: a diff of 0 is no update, so every row would change nothing; give a non-zero diff "
                     "(-1 retracts) or leave it out (a 'diff' column, or 1)")
    for spec in args.map:
        if spec.count("=") != 1 or not all(spec.split("=")):
            parser.error(f"--map {spec!r}: give SRC=DST")
    return args


def updates_frame(spark: Any, args: argparse.Namespace, relation_schema: Any, optional: Any = ()) -> Any:
    """The input as the relation's updates: mapped, typed, with time and diff where given.
    Columns in ``optional`` (added by an alter) may be missing: the append fills them."""
    from pyspark.sql import functions as F

    from sediment.spark_jobs.datasource import spark_type

    reader = spark.read
    if args.format == "csv":
        df = reader.option("header", str(args.header).lower()).csv(args.input)
    elif args.format == "json":
        df = reader.json(args.input)
    else:
        df = reader.parquet(args.input)
    for spec in args.map:
        src, dst = spec.split("=")
        if src not in df.columns:
            raise SystemExit(f"error: --map {spec}: the input has no column {src!r}; it has {df.columns}")
        df = df.withColumnRenamed(src, dst)
    missing = [f.name for f in relation_schema if f.name not in df.columns and f.name not in optional]
    if missing:
        raise SystemExit(f"error: the input lacks relation column(s) {missing}; it has {df.columns} "
                         "(rename with --map SRC=DST)")
    columns = [F.col(f.name).cast(spark_type(f.type)).alias(f.name) for f in relation_schema if f.name in df.columns]
    if args.time is None:
        if "time" not in df.columns:
            raise SystemExit("error: the input has no 'time' column: pass --time T")
        columns.append(F.col("time").cast("long").alias("time"))
    if args.diff is not None:
        columns.append(F.lit(args.diff).cast("long").alias("diff"))
    elif "diff" in df.columns:
        columns.append(F.col("diff").cast("long").alias("diff"))
    return df.select(*columns)


def run(spark: Any, args: argparse.Namespace) -> None:
    """Ingest ``args.input`` into ``args.relation`` with the session ``spark``."""
    import sediment

    token = token_of(args)
    with sediment.connect(args.uri, token) as client:
        relation_schema = client.schema(args.relation)
        optional = [c["name"] for c in client.describe(args.relation)["columns"] if not c.get("required", True)]
    writer = (updates_frame(spark, args, relation_schema, optional).write.format("sediment")
              .option("uri", args.uri).option("token", token).option("relation", args.relation)
              .option("seal", args.seal).mode("append"))
    if args.time is not None:
        writer = writer.option("time", args.time)
    from sediment.progress import Progress

    with Progress(0, f"ingest {args.input} into {args.relation}"):
        writer.save()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    token_of(args)  # before Spark starts (seconds), not after
    spark = local_spark("sediment-ingest", master=args.master, quiet=not debugging())
    try:
        run(spark, args)
    finally:
        spark.stop()
    print(f"ingested {args.input} into relation {args.relation!r}" + (" and sealed" if args.seal else ""))
    return 0


if __name__ == "__main__":
    sys.exit(run_job("sediment.spark_jobs.ingest", main))
