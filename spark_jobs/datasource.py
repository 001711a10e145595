"""The ``sediment`` PySpark data source: Spark jobs write updates to, and read the relation from,
a sediment coordinator (``sediment serve``) without ever opening its data directory. ``uri``
is the coordinator's ``grpc://HOST:PORT`` or a cluster's ``zk://HOST:PORT/NAME`` or, for an
S3-only cluster, ``s3://BUCKET/PREFIX?endpoint=URL`` (each call then goes to the owner of the
relation's partition: cluster_connect.py).

Reading::

    spark.read.format("sediment").option("uri", U).option("token", T).option("relation", "orders")
      [.option("asOf", t)][.option("from", t0)][.option("raw", "true")].load()

gives the relation consolidated as of ``asOf`` (default: its sealed frontier): its columns plus
``diff``; with ``from`` its consolidated changes in (from, asOf] (columns, ``time``, ``diff``);
with ``raw`` the stored updates (columns, ``time``, ``diff``). See batch_read.py for how the
read is split across executors without a shuffle, and pushdown.py for pushed filters.

Writing (``df.write.format("sediment")...mode("append").save()`` or SQL ``INSERT INTO``): see
batch_write.py. Streaming: ``readStream`` (stream_read.py) and ``writeStream`` (stream_write.py).

SQL: ``CREATE TABLE t USING sediment OPTIONS (uri '...', token '...', relation '...')``. Spark's
session catalog does not hand a Python data source the table's options when the table is
read or written, only its schema, so the options travel in the schema: as metadata of the
``diff`` column (the token too, in the catalog, as with any table option) and, without the
token, as that column's comment, which ``DESCRIBE`` shows. Only a call that names no relation
takes them (see :func:`options_with_schema`).

Every check that needs no data runs where Spark plans (``schema()``, ``reader()``, ``writer()``):
unknown options, the relation, the columns, ``asOf``/``from`` within [since, sealed].
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructField, StructType

from sediment.arrow_codec import schema_to_text, table_to_text
from sediment.errors import AsOfOutOfRange, InvalidArgument
from sediment.spark_jobs.batch_read import (
    PlanInfo,
    SedimentPushdownReader,
    SedimentReader,
    mode_of,
    plan_relation,
    pushdown_enabled,
)
from sediment.spark_jobs.batch_write import SedimentWriter
from sediment.spark_jobs.bulk_s3 import STAGED_IN, StagedWriter
from sediment.spark_jobs.bulk_write import route_bulk_writes
from sediment.spark_jobs.errors import short_traceback as _short
from sediment.spark_jobs.options import (  # noqa: F401 - re-exported names
    DEFAULT_LEASE_SECONDS,
    DIFF,
    FORMAT,
    STREAM_MARK,
    STREAM_READ,
    TIME,
    TOKEN_ENV,
    as_of_option,
    check_options,
    connect,
    int_option,
    lowered,
    required,
    spark_schema,
    spark_type,
)

OPTIONS_KEY = "sediment.options"
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
_INTERNAL = ("plan", "plan_tail", "provider", "owner")


def options_with_schema(options: Any, schema: StructType | None) -> dict[str, str]:
    """The options a table or view was created with (kept in its schema), overridden by the
    options of this call.

    The kept options apply only to a call that names no relation, which is how Spark's
    catalog calls the source for a table. Every frame read from sediment carries the
    options of its read in the same schema metadata, and its projections and streams keep
    it: a call that names its relation (``format("sediment").option("relation", ...)``)
    is a write or read of its own, and the options of the read that made its input
    (``asOf``, ``readStream``, ``startingAsOf``, another relation or coordinator) must
    not leak into it."""
    given = {k: v for k, v in lowered(options).items() if not k.startswith("option.") and k not in _INTERNAL[2:]}
    if given.get("relation"):
        return given
    kept: dict[str, str] = {}
    if schema is not None:
        for f in schema.fields:
            text = (f.metadata or {}).get(OPTIONS_KEY)
            if text:
                kept = json.loads(text)
    return {**kept, **given}


def check_read(options: dict[str, str], client: Any, relation: str) -> tuple[int, int | None]:
    """``asOf`` and ``from`` within [since, sealed] (as_of default: sealed), before any job."""
    since, sealed = client.since(relation), client.sealed(relation)
    as_of = as_of_option(options)
    from_t = int_option(options, "from")
    at = sealed if as_of is None else as_of
    if as_of is None and sealed < 0:
        raise AsOfOutOfRange(f"relation {relation!r} was never sealed, so no time of it is final to read: seal it "
                             f"(`sediment seal {relation} T`, or a stream sink's option seal=true) or read it as a stream")
    if as_of is not None and not since <= as_of <= sealed:
        raise AsOfOutOfRange(f"relation {relation!r}: option asOf={as_of} is outside [since {since}, sealed {sealed}]"
                             ": below since, history is consolidated away; above sealed, updates may still arrive")
    if from_t is not None and not since <= from_t <= at:
        raise AsOfOutOfRange(f"relation {relation!r}: option from={from_t} is outside [since {since}, asOf {at}]; "
                             "changes are kept only from the compaction frontier on")
    return at, from_t


class SedimentDataSource(DataSource):
    """``format("sediment")``: see the module docstring for options and semantics."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _options(self, schema: StructType | None = None) -> dict[str, str]:
        options = options_with_schema(self.options, schema)
        check_options(options)
        return options

    @_short
    def schema(self) -> StructType:
        options = self._options()
        given = options.get("plan")
        if given:
            return spark_schema(PlanInfo.from_json(given).update_schema, with_time=mode_of(options) != "snapshot")
        relation = required(options, "relation")
        streaming = any(options.get(k) for k in STREAM_READ)
        with connect(options) as client:
            columns = client.schema(relation)
            if not streaming and mode_of(options) != "raw":
                check_read(options, client, relation)
        schema = spark_schema(columns, with_time=streaming or mode_of(options) != "snapshot")
        kept = {k: v for k, v in options.items() if k not in _INTERNAL}
        comment = f"sediment relation {relation!r} at {options.get('uri')}"
        fields = [StructField(f.name, f.dataType, f.nullable,
                              {OPTIONS_KEY: json.dumps(kept), "comment": comment} if f.name == DIFF else f.metadata)
                  for f in schema.fields]
        return StructType(fields)

    @_short
    def reader(self, schema: StructType) -> SedimentReader:
        options = self._options(schema)
        relation = required(options, "relation")
        if options.get("plan"):
            return SedimentReader(options, schema, PlanInfo.from_json(options["plan"]).update_schema_b64)
        with connect(options) as client:
            columns = client.schema(relation)
            if mode_of(options) != "raw":
                check_read(options, client, relation)
        want = [f.name for f in spark_schema(columns, with_time=mode_of(options) != "snapshot").fields]
        if [f.name for f in schema.fields] != want:
            raise InvalidArgument(f"relation {relation!r} reads as columns {want}, not {schema.names}: the relation "
                                  "changed since the table was created, or a stream option was given to a batch read")
        cls = SedimentPushdownReader if pushdown_enabled() else SedimentReader
        return cls(options, schema, schema_to_text(columns))

    @_short
    def writer(self, schema: StructType, overwrite: bool) -> SedimentWriter | StagedWriter:
        options = self._options(schema)
        if options.get(STAGED_IN):  # a bulk load's tasks putting its files into S3 (bulk_s3.py)
            return StagedWriter(options)
        return SedimentWriter(options, schema, overwrite)

    @_short
    def streamReader(self, schema: StructType) -> Any:  # noqa: N802 - Spark's name
        from sediment.spark_jobs.stream_read import SedimentStreamReader

        return SedimentStreamReader(self._options(schema), schema)

    @_short
    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:  # noqa: N802 - Spark's name
        from sediment.spark_jobs.stream_write import SedimentStreamWriter

        return SedimentStreamWriter(self._options(schema), schema, overwrite)


DefaultSource = SedimentDataSource  # the name PySpark's automatic lookup of pyspark_* modules wants


def register(spark: SparkSession) -> None:
    """Make ``format("sediment")`` (and ``USING sediment``) available in ``spark``; idempotent.
    Installing sediment also installs the module ``pyspark_sediment``, which PySpark finds and
    registers by itself in every session it starts; this call is for sessions that cannot see it.
    It also turns on PySpark's filter pushdown for Python data sources (off by default), and
    routes ``option("bulk", "true")`` writes to Spark's Parquet writer (spark_jobs/bulk_write.py)."""
    spark.dataSource.register(SedimentDataSource)
    spark.conf.set(PUSHDOWN_CONF, "true")
    _mark_stream_reads()
    route_bulk_writes()


def _mark_stream_reads() -> None:
    """Make ``spark.readStream.format("sediment")...load()`` add the option ``readStream``.

    Why: Spark asks a Python data source for its schema in a worker that is not told whether
    a stream or a batch read wants it (``create_data_source`` receives the format, the
    options and a user schema only), and a stream reads columns + time + diff where a batch
    ``load()`` reads columns + diff. Without a stream option (``startingAsOf``,
    ``maxTimesPerTrigger``) the two are indistinguishable, so the driver's own
    ``DataStreamReader`` says so. Idempotent; the stream reader names ``startingAsOf`` in
    its error where this hook did not run (a session that found the source by itself)."""
    from pyspark.sql.streaming.readwriter import DataStreamReader

    if getattr(DataStreamReader, "_sediment_marks_streams", False):
        return
    plain_format, plain_load = DataStreamReader.format, DataStreamReader.load

    def format(self: Any, source: str) -> Any:  # noqa: A001 - PySpark's name
        self._sediment_format = str(source).lower()
        return plain_format(self, source)

    def load(self: Any, path: str | None = None, format: str | None = None,  # noqa: A002 - PySpark's name
             schema: Any = None, **options: Any) -> Any:
        if format is not None:
            self.format(format)
        if getattr(self, "_sediment_format", None) == FORMAT:
            self.option(STREAM_MARK, "true")
        return plain_load(self, path, None, schema, **options)

    format.__doc__, load.__doc__ = plain_format.__doc__, plain_load.__doc__
    DataStreamReader.format, DataStreamReader.load = format, load
    DataStreamReader._sediment_marks_streams = True


# --- consolidation in Spark (of raw updates) ------------------------------------------------


def consolidate(updates: DataFrame, *, with_time: bool = False) -> DataFrame:
    """Sum the diffs of equal rows (of equal rows at equal times, ``with_time``) and drop the
    zero sums, as one Spark aggregation: for raw updates read with ``option("raw", "true")``."""
    rows = [c for c in updates.columns if c not in (TIME, DIFF)]
    keys = rows + ([TIME] if with_time else [])
    return (updates.groupBy(*keys).agg(F.sum(DIFF).alias(DIFF))
            .filter(F.col(DIFF) != 0))


def _reader(spark: SparkSession, uri: str, relation: str, token: str | None) -> Any:
    register(spark)
    reader = spark.read.format(FORMAT).option("uri", uri).option("relation", relation)
    token = token or os.environ.get(TOKEN_ENV)
    return reader.option("token", token) if token else reader


def read_relation(spark: SparkSession, uri: str, relation: str, as_of: int, from_t: int | None = None,
                  token: str | None = None, *, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> DataFrame:
    """The relation as of ``as_of`` (columns + diff), or with ``from_t`` its consolidated
    changes in (from_t, as_of] (columns + time + diff): ``load()`` with those options, with a
    failure raised as sediment's own typed error."""
    from sediment.spark_jobs.errors import sediment_errors

    reader = _reader(spark, uri, relation, token).option("asOf", as_of).option("lease_seconds", lease_seconds)
    if from_t is not None:
        reader = reader.option("from", from_t)
    with sediment_errors():
        return reader.load()


@contextmanager
def open_relation(spark: SparkSession, uri: str, relation: str, as_of: int, from_t: int | None = None,
                  token: str | None = None, *, lease_seconds: float = DEFAULT_LEASE_SECONDS,
                  consolidated: bool = True) -> Iterator[DataFrame]:
    """Like :func:`read_relation`, but planned here on the driver, and the plan's lease is
    released when the block ends: run every action on the frame inside the block (afterwards
    the compacter may delete the batches it reads). ``consolidated=False`` gives the raw
    updates (columns + time + diff) instead. The plan's WAL-tail rows travel to the
    planning worker inside the read options, so with a large uncompacted tail, compact
    first (or use :func:`read_relation`, which plans in the worker)."""
    token = token or os.environ.get(TOKEN_ENV)
    if not token:
        raise InvalidArgument(f"open_relation needs token=... or ${TOKEN_ENV}")
    options = {"uri": uri, "token": token, "relation": relation, "as_of": as_of, "lease_seconds": lease_seconds}
    if from_t is not None:
        options["from"] = from_t
    info, tail, _ = plan_relation(options, hold=False)
    try:
        tail_b64 = table_to_text(tail) if tail.num_rows else ""
        reader = _reader(spark, uri, relation, token).option("plan", info.to_json()).option("plan_tail", tail_b64)
        if from_t is not None:
            reader = reader.option("from", from_t)
        if not consolidated:
            reader = reader.option("raw", "true")
        yield reader.load()
    finally:
        with connect(uri, token, relation) as client:
            client.release_read(info.lease)
