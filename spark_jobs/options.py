"""Options, types and connections shared by every part of the ``sediment`` data source.

Spark hands a Python data source its options in a case-insensitive map whose keys are lower
case, so every name here is compared lower-cased: ``asOf``, ``ASOF`` and ``asof`` are one
option. An option no part of the source knows is refused (a typo such as ``timestampAsOf``
must not silently read the latest state). Tables created by ``CREATE TABLE ... USING
sediment OPTIONS (...)`` pass the same options to reads and writes, so the known set is one
set for both; what a mode cannot use is refused where it matters (``asOf`` on a write).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NullType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from sediment.errors import InvalidArgument

FORMAT = "sediment"
TIME = "time"
DIFF = "diff"
DEFAULT_LEASE_SECONDS = 3600.0
STREAM_MARK = "readstream"  # the option register()'s readStream hook adds: schema() cannot tell otherwise
TOKEN_ENV = "SEDIMENT_TOKEN"  # as sediment.net.protocol.TOKEN_ENV, without importing Flight here

CONNECTION = {"uri": "the coordinator, grpc://HOST:PORT, or a cluster: zk://HOST:PORT/NAME, "
                     "s3://BUCKET/PREFIX?endpoint=URL (S3-only) or a member's address",
              "token": "the coordinator's token",
              "relation": "the relation"}
BATCH_READ = {"asof": "read as of this time (default: the sealed frontier)", "as_of": "as asOf",
              "from": "the consolidated changes in (from, asOf]", "raw": "true: the stored updates with time and diff",
              "lease_seconds": "how long the read plan pins its batches", "split_rows": "rows per read task",
              "plan": "internal: a plan made on the driver", "plan_tail": "internal: its WAL-tail rows"}
BATCH_WRITE = {"time": "the time of every row (else a time column)", "diff": "the diff of every row",
               "seal": "true: seal the time written once the job commits",
               "batch_rows": "rows a task gathers per append",
               "mergeschema": "true: first add the DataFrame's columns the relation lacks (nullable)",
               "bulk": "true: executors write Parquet with Spark's writer, committed as pending runs",
               "staged_in": "internal: a bulk load's S3 staging prefix", "staged_schema": "internal: its files' schema"}
STREAM_READ = {"startingasof": "earliest | latest | a time: the first micro-batch's snapshot",
               "maxtimespertrigger": "at most this many sealed times per micro-batch",
               STREAM_MARK: "internal: set by readStream in sessions where register() ran"}
STREAM_WRITE = {"checkpointlocation": "Spark's checkpoint directory (the sink's progress lives in sediment)",
                "queryname": "as Spark's"}
CREDENTIALS = {"aws_access_key_id": "S3 credentials for the executors' and planner's reads of batches",
               "aws_secret_access_key": "as aws_access_key_id", "aws_session_token": "as aws_access_key_id",
               "aws_region": "as aws_access_key_id"}
SPARK_ADDED = {"path"}  # Spark adds a table's location to its options
KNOWN = {**CONNECTION, **CREDENTIALS, **BATCH_READ, **BATCH_WRITE, **STREAM_READ, **STREAM_WRITE}


def lowered(options: Mapping[str, Any]) -> dict[str, str]:
    """The options as a plain dict with lower-case keys and string values (picklable)."""
    return {str(k).lower(): ("" if v is None else str(v)) for k, v in dict(options).items()}


def check_options(options: Mapping[str, Any], *, refused: Iterable[str] = (), what: str = "reading") -> None:
    """Refuse an option nobody knows, or one this mode (``what``) cannot use."""
    keys = {str(k).lower() for k in options}
    unknown = sorted(k for k in keys - set(KNOWN) - SPARK_ADDED if not k.startswith("spark."))
    if unknown:
        raise InvalidArgument(
            f"the sediment data source has no option {', '.join(repr(k) for k in unknown)} (option names are "
            f"case-insensitive; known: {', '.join(sorted(KNOWN))}); remove it or fix its spelling")
    check_values(options)
    bad = sorted(keys & {k.lower() for k in refused} - {""})
    if bad and any(options.get(k) not in (None, "") for k in bad):
        raise InvalidArgument(f"option(s) {', '.join(repr(k) for k in bad)} do not apply when {what}; remove them")


POSITIVE = {"split_rows": int, "batch_rows": int, "maxtimespertrigger": int, "lease_seconds": float}


def check_values(options: Mapping[str, Any]) -> None:
    """The sizes and durations among the options are numbers > 0, checked where Spark plans:
    ``lease_seconds="x"`` must not reach a task as Python's ValueError, nor ``split_rows=0``
    silently mean the default."""
    given = {str(k).lower(): v for k, v in options.items()}
    for key, kind in POSITIVE.items():
        value = given.get(key)
        if value is None or str(value).strip() == "":
            continue
        try:
            number = kind(str(value).strip())
        except ValueError:
            number = None
        if number is None or not 0 < number < float("inf"):
            raise InvalidArgument(f"option {key!r} must be {'an integer' if kind is int else 'a number'} > 0, "
                                  f"not {value!r} ({KNOWN.get(key, key)})")


def required(options: Mapping[str, Any], key: str) -> str:
    value = options.get(key)
    if value is None or value == "":
        raise InvalidArgument(f"the sediment data source needs option({key!r}, ...) ({KNOWN.get(key, key)})")
    return str(value)


def int_option(options: Mapping[str, Any], key: str, default: int | None = None) -> int | None:
    value = options.get(key)
    if value is None or value == "":
        return default
    try:
        return int(str(value).strip())
    except ValueError:
        raise InvalidArgument(f"option {key!r} must be an integer, not {value!r}") from None


def diff_option(options: Mapping[str, Any]) -> int | None:
    """``option("diff", d)``: every row's diff, or None (a ``diff`` column, else +1). Both write
    paths refuse 0 before anything is written: a diff of 0 is no update (the engine takes such
    a row and it consolidates away), so a job whose every row has it would change nothing,
    which is a mistake, not a request. Rows of a ``diff`` column that are 0 are no updates too,
    and are taken as such, as ``Engine.append`` takes them."""
    diff = int_option(options, DIFF)
    if diff == 0:
        raise InvalidArgument("option 'diff' is 0: a diff of 0 is no update, so every row of this write would change "
                              "nothing; give a non-zero diff (-1 retracts) or leave the option out (+1); nothing "
                              "was written")
    if diff is not None and not -(1 << 63) <= diff < 1 << 63:
        raise InvalidArgument(f"option 'diff' is {diff}, outside int64; give a non-zero int64; nothing was written")
    return diff


def bool_option(options: Mapping[str, Any], key: str) -> bool:
    value = str(options.get(key) or "false").strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no", ""):
        return False
    raise InvalidArgument(f"option {key!r} must be true or false, not {value!r}")


def as_of_option(options: Mapping[str, Any]) -> int | None:
    """``asOf`` (or the older ``as_of``); both given and different is an error."""
    a, b = int_option(options, "asof"), int_option(options, "as_of")
    if a is not None and b is not None and a != b:
        raise InvalidArgument(f"options asOf={a} and as_of={b} disagree; give one")
    return a if a is not None else b


def token(options: Mapping[str, Any]) -> str:
    value = options.get("token") or os.environ.get(TOKEN_ENV)
    if not value:
        raise InvalidArgument(f"the sediment data source needs option('token', ...) or ${TOKEN_ENV} on every worker")
    return str(value)


def connect(options_or_uri: Mapping[str, Any] | str, token_: str | None = None, relation: str | None = None) -> Any:
    """A client for one call site: opened inside read/write/commit, never pickled. Over a
    cluster (``zk://HOST:PORT/NAME``, ``s3://BUCKET/PREFIX[?endpoint=URL]`` or a member's
    address), a client of the member serving
    the relation's partition (spark_jobs/cluster_connect.py); ``relation`` defaults to the
    options' relation."""
    from sediment.spark_jobs.cluster_connect import connect_for

    if isinstance(options_or_uri, str):
        return connect_for(options_or_uri, token_, relation)
    return connect_for(required(options_or_uri, "uri"), token(options_or_uri),
                       relation or options_or_uri.get("relation") or None)


# --- types ----------------------------------------------------------------------------------


def spark_type(t: pa.DataType) -> DataType:
    """The Spark type a relation column of Arrow type ``t`` reads as (unsigned integers widen,
    since Spark has none; timestamps read at microseconds)."""
    for check, spark in ((pa.types.is_int8, ByteType()), (pa.types.is_int16, ShortType()),
                         (pa.types.is_int32, IntegerType()), (pa.types.is_int64, LongType()),
                         (pa.types.is_uint8, ShortType()), (pa.types.is_uint16, IntegerType()),
                         (pa.types.is_uint32, LongType()), (pa.types.is_uint64, DecimalType(20, 0)),
                         (pa.types.is_float32, FloatType()), (pa.types.is_float64, DoubleType()),
                         (pa.types.is_boolean, BooleanType()), (pa.types.is_date, DateType())):
        if check(t):
            return spark
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return StringType()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return BinaryType()
    if pa.types.is_timestamp(t):
        return TimestampType() if t.tz else TimestampNTZType()
    if pa.types.is_decimal(t) and t.precision <= 38:
        return DecimalType(t.precision, t.scale)
    raise InvalidArgument(f"a relation column of type {t} has no Spark type; read it with sediment.connect() instead")


_INTS = (ByteType, ShortType, IntegerType, LongType)


def writes_into(given: DataType, column: pa.DataType) -> bool:
    """Whether a DataFrame column of Spark type ``given`` is of a kind a relation column of
    Arrow type ``column`` takes: integers into integers, floats or decimals, floats into
    floats, decimals into decimals (or integers, at scale 0), strings, binaries, booleans,
    dates and either kind of timestamp into their own, nulls into any. Checked where Spark
    plans, so a string into an integer column fails before any task runs; whether each value
    fits (300 into int8) is for the task's cast. Columns with no Spark type (times,
    durations, fixed-size binary) are left to the cast."""
    t = pa.types
    ints = isinstance(given, _INTS)
    kinds: list[tuple[bool, bool]] = [
        (t.is_integer(column), ints or isinstance(given, DecimalType) and given.scale == 0),
        (t.is_floating(column), ints or isinstance(given, (FloatType, DoubleType))),
        (t.is_decimal(column), ints or isinstance(given, DecimalType)),
        (t.is_string(column) or t.is_large_string(column), isinstance(given, StringType)),
        (t.is_binary(column) or t.is_large_binary(column), isinstance(given, BinaryType)),
        (t.is_boolean(column), isinstance(given, BooleanType)),
        (t.is_date(column), isinstance(given, DateType)),
        (t.is_timestamp(column), isinstance(given, (TimestampType, TimestampNTZType))),
    ]
    if isinstance(given, NullType):
        return True
    return next((fits for is_kind, fits in kinds if is_kind), True)


def spark_schema(columns: pa.Schema, *, with_time: bool = True, with_diff: bool = True) -> StructType:
    """Spark's schema of a relation's rows (its columns, then ``time`` and ``diff`` as asked)."""
    fields = [StructField(f.name, spark_type(f.type), True) for f in columns if f.name not in (TIME, DIFF)]
    if with_time:
        fields.append(StructField(TIME, LongType(), True))
    if with_diff:
        fields.append(StructField(DIFF, LongType(), True))
    return StructType(fields)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The exact Arrow schema Spark checks the batches ``read()`` yields against."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def conform(table: pa.Table, target: pa.Schema) -> pa.Table:
    table = table.select(target.names)
    return table.cast(target) if not table.schema.equals(target) else table
