"""Write a relation as of a time (or its changes between two times) to Parquet or CSV.

    python -m sediment.spark_jobs.read_trace --uri grpc://127.0.0.1:8815 --relation orders \\
        --as-of 7 [--from 3] --output out/ [--format parquet|csv] [--overwrite]
    spark-submit spark_jobs/read_trace.py --uri ... (the same arguments)

The read goes through the ``sediment`` data source: executors read the batches straight
from the blob store and Spark consolidates. As of a time the output has the relation's
columns plus ``diff``; with ``--from`` it has the consolidated changes in (from, as_of]:
columns, ``time`` and ``diff``. The read plan's lease is released when the write is done.
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = JobParser(prog="sediment.spark_jobs.read_trace", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_connection_args(parser)
    parser.add_argument("--as-of", type=int, default=None, help="the time to read at (default: the sealed frontier)")
    parser.add_argument("--from", dest="from_t", type=int, default=None,
                        help="write the changes in (FROM, AS_OF] instead of the relation as of AS_OF")
    parser.add_argument("--output", required=True, help="the output directory (Spark writes part files)")
    parser.add_argument("--format", choices=("parquet", "csv"), default="parquet")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    parser.add_argument("--files", type=int, default=None, help="coalesce to this many output files")
    return parser.parse_args(argv)


def run(spark: Any, args: argparse.Namespace) -> int:
    """Write the read to ``args.output``; returns the number of rows written (and sets
    ``args.as_of`` to the sealed frontier when it was not given)."""
    import sediment
    from sediment.spark_jobs.datasource import open_relation

    token = token_of(args)
    as_of = args.as_of
    if as_of is None:
        with sediment.connect(args.uri, token) as client:
            as_of = client.sealed(args.relation)
    args.as_of = as_of
    from sediment.progress import Progress

    with Progress(0, f"read {args.relation} to {args.output}"), \
            open_relation(spark, args.uri, args.relation, as_of, args.from_t, token) as df:
        cached = df.cache()  # counted and written from one read of the batches
        try:
            rows = cached.count()
            out = cached.coalesce(args.files) if args.files else cached
            writer = out.write.mode("overwrite" if args.overwrite else "errorifexists")
            if args.format == "csv":
                writer.option("header", "true").csv(args.output)
            else:
                writer.parquet(args.output)
        finally:
            cached.unpersist()
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    token_of(args)  # before Spark starts (seconds), not after
    spark = local_spark("sediment-read-trace", master=args.master, quiet=not debugging())
    try:
        rows = run(spark, args)
    finally:
        spark.stop()
    what = f"changes in ({args.from_t}, {args.as_of}]" if args.from_t is not None else f"as of {args.as_of}"
    print(f"wrote {rows} rows of relation {args.relation!r} {what} to {args.output} ({args.format})")
    return 0


if __name__ == "__main__":
    sys.exit(run_job("sediment.spark_jobs.read_trace", main))
