"""Bulk loads from Spark: ``df.write.format("sediment").option("bulk", "true")...save()``.

Why: the row-by-row path hands every Arrow batch from the JVM to a Python worker and from
there over the network into the coordinator's WAL; for large loads that hand-off, not the
disk, is the limit (0.73x ``df.write.parquet``). A bulk load keeps the rows in the JVM:

* the driver checks the options and columns as the row path does, asks the coordinator for
  the load's staging directory (engine/staged.py), and names the load (a random job name);
* executors write the frame as it is (:func:`written_as_is`: no projection, no sort; the
  load's one time and diff travel with the commit, not in the pages) with Spark's own
  Parquet writer into that directory; a frame that needs casts, filled columns or has a
  ``diff`` column is written as the relation's updates instead (:func:`staged_frame`).
  Spark's commit protocol keeps exactly one output per partition, so a retried or
  speculative task attempt is committed once, and a failed job leaves only its temporary
  files;
* the driver asks the coordinator to commit the staged files as pending runs of the relation
  (one compare-and-set, recorded under the job's name: a repeated commit changes nothing;
  files that are not sorted runs become raw runs, consolidated by reads until background
  compaction rewrites them);
  if the job fails or the commit is refused it aborts the load, which deletes the staged
  files; a commit whose reply is lost is asked again with the same job
  (spark_jobs/bulk_commit.py), never aborted blindly.

The WAL is skipped (the files are fsynced into the blob store before the commit). Reads see
the same rows, times and consolidated diffs as after a row-by-row write of the same frame.
With a file blob store the coordinator must run on the same machine or shared file system
as the executors. A coordinator whose batches are in S3 (an S3-only cluster's members)
stages the load under an S3 prefix instead, which this Spark build's writer cannot reach:
there the tasks put the files themselves, one object per partition (bulk_s3.py), and the
commit copies each object to a local spill file before it checks it. Relation columns must be of types
Spark's Parquet writer writes as Arrow does (integers, floats, strings, binaries, booleans,
dates); others are refused with ``SchemaMismatch`` at the commit, and the load is aborted.
Columns an alter added may be left out (filled by :func:`bulk_fills`); Spark's files carry
no field ids, so for a relation an alter renamed or added columns to, the commit rewrites
each staged file as a batch with the relation's field ids (engine/staged.py).
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Iterator, Mapping
from time import perf_counter
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from sediment.errors import BulkSealUnknown, InvalidArgument, SchemaMismatch, TimeAlreadySealed
from sediment.spark_jobs.batch_write import READ_ONLY, check_columns, omitted
from sediment.spark_jobs.bulk_commit import abort_load, commit_load
from sediment.spark_jobs.bulk_s3 import staged_in_s3, target_schema, write_staged
from sediment.spark_jobs.job_commit import seal_through
from sediment.spark_jobs.options import (
    DIFF,
    FORMAT,
    TIME,
    bool_option,
    check_options,
    connect,
    diff_option,
    int_option,
    lowered,
    required,
    spark_type,
)

BULK = "bulk"
last_phases: dict[str, float] = {}  # the driver's last bulk load, in seconds: "calls", "spark", "commit" (benchmarks)


def bulk_load(df: DataFrame, options: Mapping[str, Any]) -> dict[str, Any]:
    """Load ``df`` into the relation the options name (``uri``, ``token``, ``relation``, and
    ``time``/``diff``/``seal`` as for the row path); returns the commit's counts."""
    options = lowered(options)
    check_options(options, refused=READ_ONLY, what="writing")
    relation = required(options, "relation")
    time, diff, seal = int_option(options, TIME), diff_option(options), bool_option(options, "seal")
    schema = df.schema  # each ask is a call into the JVM
    for name, given in ((TIME, time), (DIFF, diff)):
        if given is not None and name in schema.names:
            raise InvalidArgument(f"the DataFrame has a {name!r} column and option({name!r}) is set too; use one")
    started = perf_counter()
    with connect(options) as client:
        rel_schema = client.schema(relation)
        fills = bulk_fills(relation, rel_schema, omitted(client, relation, rel_schema, schema))
        check_columns(relation, rel_schema, schema, fills)
        sealed = client.sealed(relation)
        if time is None and TIME not in schema.names:
            time = sealed + 1  # the next open time, as the row path
        if time is not None and time <= sealed:
            raise TimeAlreadySealed(f"relation {relation!r} is sealed through time {sealed}: option('time', {time}) "
                                    "can never commit; write at a later time")
        as_is = written_as_is(schema, rel_schema, fills)
        frame = df if as_is else staged_frame(df, rel_schema, time, diff, fills)
        job = f"spark-{uuid.uuid4().hex}"
        path = client.bulk_stage(relation, job)
        marks = [perf_counter()]
        try:
            if staged_in_s3(path):  # the coordinator's batches are in S3: the tasks put the files there
                write_staged(frame, path, target_schema(frame.schema, rel_schema), options)
            else:
                with early_writeback(path):
                    frame.write.mode("append").parquet("file://" + path)
        except BaseException:
            abort_load(client, relation, job)  # nothing was committed: the job failed before the commit
            raise
        marks.append(perf_counter())
        result = commit_load(client, relation, job, time_=time if as_is and TIME not in schema.names else None,
                             diff=diff if as_is else None)
        marks.append(perf_counter())
        last_phases.clear()
        last_phases.update(calls=marks[0] - started, spark=marks[1] - marks[0], commit=marks[2] - marks[1])
        if seal:
            t = time if time is not None else result.get("max_time")
            if t is None and not result.get("counts_known", True):
                raise BulkSealUnknown(f"bulk load {job!r} of relation {relation!r} committed (an earlier attempt "
                                      "did), but the coordinator did not keep its last time: nothing was sealed; "
                                      "seal the relation at the frame's last time yourself")
            if t is not None:
                seal_through(client, relation, t)
    return result


@contextlib.contextmanager
def early_writeback(root: str, every: float = 0.05) -> Iterator[dict[str, int]]:
    """While the body runs, flush the Parquet files appearing under ``root`` to disk
    (``fdatasync``, again whenever a file grew), so the commit's fsyncs find little left;
    yields the paths flushed so far with their sizes then.

    Why: Spark's writer leaves its files in the page cache; the commit must fsync them, and
    for 4M rows that was about 30 ms of the commit, paid after Spark's job. A head start
    only: the commit still fsyncs every file (and the directories) itself. The staging
    directory is on this machine (a file blob store's), as the bulk load requires."""
    stop = threading.Event()
    flushed: dict[str, int] = {}

    def flush() -> None:
        for top, _dirs, files in os.walk(root):
            for name in files:
                path = os.path.join(top, name)
                try:
                    size = os.path.getsize(path)
                    if not name.endswith(".parquet") or flushed.get(path) == size:
                        continue
                    fd = os.open(path, os.O_RDONLY)
                    try:
                        os.fdatasync(fd)
                    finally:
                        os.close(fd)
                    flushed[path] = size
                except OSError:
                    pass  # moved by Spark's task commit meanwhile: found again under its new name

    def loop() -> None:
        while not stop.wait(every):
            flush()

    worker = threading.Thread(target=loop, name="sediment-bulk-writeback", daemon=True)
    worker.start()
    try:
        yield flushed
    finally:
        stop.set()
        worker.join()


def bulk_fills(relation: str, rel_schema: pa.Schema, omitted: Mapping[str, Any]) -> dict[str, Any]:
    """The omitted columns' values for a bulk load, which skips the engine's append and so
    fills them in Spark: null, or the default ``describe`` gives, cast by Spark. Defaults of
    types whose text Spark would not cast back exactly (binaries, times, timestamps,
    durations) are refused: give the column, or write without ``bulk``."""
    exact = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean, pa.types.is_string,
             pa.types.is_large_string, pa.types.is_decimal, pa.types.is_date32)
    for f in rel_schema:
        if f.name in omitted and omitted[f.name] is not None and not any(test(f.type) for test in exact):
            raise SchemaMismatch(f"relation {relation!r} column {f.name!r} ({f.type}) has a default that a bulk load "
                                 "cannot fill exactly: give the column in the DataFrame or write without bulk")
    return dict(omitted)


def written_as_is(schema: StructType, rel_schema: Any, fills: Mapping[str, Any] | None = None) -> bool:
    """Whether executors write a frame of ``schema`` itself, as ``df.write.parquet`` would (no projection, no
    sort): it has every relation column in the relation's Spark type, ``time`` as a long or
    not at all (then the load's time goes with the commit), and no ``diff`` column (the
    load's diff goes with the commit). The commit keeps such files as raw runs (batch format
    version 2), which reads consolidate and background compaction rewrites sorted.

    Why: any projection over a cached frame (even one constant column) cost Spark's writer
    0.75x of ``df.write.parquet`` here; the constants cost nothing as batch metadata."""
    given = {f.name: f.dataType for f in schema.fields}
    if fills or DIFF in given or (TIME in given and given[TIME].simpleString() != "bigint"):
        return False
    return all(given.get(f.name) == spark_type(f.type) for f in rel_schema)


def staged_frame(df: DataFrame, rel_schema: Any, time: int | None, diff: int | None,
                 fills: Mapping[str, Any] | None = None) -> DataFrame:
    """The frame as the relation's updates, every column nullable (as a batch's are), each
    partition sorted by (row, time) with NULLs last (a batch's order), so most staged files
    are runs as written and the commit does not rewrite them; a frame whose plan already
    orders it by the first key column (:func:`ordered_by`) is not sorted again. ``fills`` gives the values of
    the columns the frame leaves out (:func:`bulk_fills`)."""
    given = {f.name: f.dataType for f in df.schema.fields}
    columns = []
    for f in rel_schema:
        target = spark_type(f.type)
        if f.name not in given:
            columns.append((f.name, F.lit((fills or {})[f.name]).cast(target)))
            continue
        c = F.col(f.name)
        columns.append((f.name, c if given[f.name] == target else c.cast(target)))
    columns.append((TIME, F.col(TIME).cast("long") if time is None else F.lit(time).cast("long")))
    if diff is None and DIFF in given:
        columns.append((DIFF, F.coalesce(F.col(DIFF).cast("long"), F.lit(1).cast("long"))))
    else:
        columns.append((DIFF, F.lit(1 if diff is None else diff).cast("long")))
    live = F.spark_partition_id() >= 0  # not foldable: keeps the CASE (and so the column) nullable
    frame = df.select(*[F.when(live, c).alias(name) for name, c in columns])
    first = rel_schema[0]
    if given.get(first.name) == spark_type(first.type) and ordered_by(df, first.name):
        return frame
    keys = [f.name for f in rel_schema] + [TIME]
    return frame.sortWithinPartitions(*[F.col(k).asc_nulls_last() for k in keys])


def ordered_by(df: DataFrame, column: str) -> bool:
    """Whether Spark's plan says each partition of ``df`` comes ordered by ``column`` ascending
    (a frame built from ``spark.range`` or sorted by the caller, cached or not).

    Why: sorting a partition that is already in order still copies every row into Spark's
    sorter before the writer sees the first one. Ordered by the first key column, a partition
    is a run whenever that column does not repeat; the commit checks every file and
    consolidates (sorts and rewrites) one that is not, so the result is the same either way.
    False when the plan cannot be asked (Spark Connect) or says nothing."""
    try:
        plan = df._jdf.queryExecution().executedPlan()
        order, out = plan.outputOrdering(), plan.output()
        if order.isEmpty() or order.head().direction().sql() != "ASC":
            return False
        lead = order.head().child()
        return any(out.apply(i).name() == column and lead.semanticEquals(out.apply(i)) for i in range(out.length()))
    except Exception:  # noqa: BLE001 - any failure to ask only means the frame is sorted by Spark
        return False


def route_bulk_writes() -> None:
    """Make ``df.write.format("sediment").option("bulk", "true")...save()`` a bulk load.

    Why: a Python data source's writer runs in Python workers and can only receive Arrow
    batches; Spark's own Parquet writer is reached from the driver's ``DataFrameWriter``. So
    the driver's writer remembers the format and options it was given, and ``save`` hands a
    bulk write to :func:`bulk_load`. Idempotent; without this hook (a session that found
    the source by itself) the data source refuses ``bulk`` and says to call ``register``."""
    from pyspark.sql.readwriter import DataFrameWriter

    if getattr(DataFrameWriter, "_sediment_routes_bulk", False):
        return
    plain = DataFrameWriter.format, DataFrameWriter.option, DataFrameWriter.options, DataFrameWriter.save

    def seen(self: Any) -> dict[str, Any]:
        return self.__dict__.setdefault("_sediment_options", {})

    def format(self: Any, source: str) -> Any:  # noqa: A001 - PySpark's name
        self._sediment_format = str(source).lower()
        return plain[0](self, source)

    def option(self: Any, key: str, value: Any) -> Any:
        seen(self)[str(key).lower()] = value
        return plain[1](self, key, value)

    def options(self: Any, **opts: Any) -> Any:
        seen(self).update({str(k).lower(): v for k, v in opts.items()})
        return plain[2](self, **opts)

    def save(self: Any, path: str | None = None, format: str | None = None,  # noqa: A002 - PySpark's name
             mode: str | None = None, partitionBy: Any = None, **opts: Any) -> None:  # noqa: N803
        if format is not None:
            self.format(format)
        given = {**seen(self), **{str(k).lower(): v for k, v in opts.items()}}
        if getattr(self, "_sediment_format", None) == FORMAT and bool_option(given, BULK):
            if mode is not None and str(mode).lower() not in ("append", "default"):
                raise InvalidArgument("the sediment data source only appends updates; use .mode('append')")
            bulk_load(self._df, {k: v for k, v in given.items() if k != BULK})
            return None
        return plain[3](self, path, format, mode, partitionBy, **opts)

    for fn, orig in zip((format, option, options, save), plain, strict=True):
        fn.__doc__ = orig.__doc__
    DataFrameWriter.format, DataFrameWriter.option, DataFrameWriter.options, DataFrameWriter.save = (
        format, option, options, save)
    DataFrameWriter._sediment_routes_bulk = True
