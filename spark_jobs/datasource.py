"""The ``sediment`` PySpark data source: Spark jobs write updates to, and read traces from, a
sediment coordinator (``sediment serve``) without ever opening its data directory.

Writing (``df.write.format("sediment")...mode("append").save()``)::

    df.write.format("sediment").option("uri", "grpc://127.0.0.1:8815").option("token", T)
      .option("relation", "orders").option("time", 7).option("seal", True).mode("append").save()

The DataFrame has the relation's columns, plus ``time`` (or ``option("time", t)``) and
optionally ``diff`` (or ``option("diff", d)``; default +1). ``option("batch_rows", n)``
sets how many rows a task gathers per append (default 262144). The whole job commits
as one, so a failed or aborted job leaves nothing visible, and a retried or
speculative task attempt never duplicates rows:

* the writer is built once, in a Python worker the driver starts: it checks the columns
  against the relation and names the job's transaction group (a random id); only
  options and that name are pickled into the writer (no clients or locks travel);
* each task attempt connects, begins its own server transaction in the group, streams
  its Arrow batches into it (durable but invisible) and returns the transaction's id
  with how many rows and which times it wrote;
* ``commit()`` (another Python worker) commits the transactions of the attempts Spark
  chose, all with one COMMIT record (``commit_all``: all visible or none), aborts the
  group's other transactions (failed or losing attempts), then seals the time when
  ``seal`` is set; ``abort()`` aborts the whole group.

A job whose driver dies before committing leaves its transactions open until the
coordinator aborts them (``txn_idle_timeout``, or when it stops; a restart's replay
discards them too).

Reading (``spark.read.format("sediment")...load()``)::

    spark.read.format("sediment").option("uri", U).option("token", T).option("relation", "orders")
      .option("as_of", 7)[.option("from", 3)].load()

yields the stored updates the read needs: the relation's columns plus ``time`` and
``diff``, with times <= as_of (default: the sealed frontier) and > from. They are not consolidated yet: pass the frame
to :func:`consolidate` (or use :func:`read_relation`, which does both) to get the
relation as of ``as_of`` (columns + diff), or its consolidated changes in (from, as_of]
(columns + time + diff), as incremental readers of Hudi and Delta expect.

The read plan comes from the coordinator (``plan_read``): one input partition per stored
batch (per slice of row groups of a batch above ``option("split_rows", n)``, default a
million rows), which executors read straight from the blob store (a local path or S3, through
the batch format's reader, footer and checksums verified), plus partitions holding the
WAL tail rows the plan carries. The plan pins its batches under a lease. Spark has no hook
for "this DataFrame will not be read again", so a ``load()`` lets its lease expire
(``option("lease_seconds", ...)``, default one hour); :func:`open_relation` plans on the
driver and releases the lease when its ``with`` block ends.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
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
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

FORMAT = "sediment"
TIME = "time"
DIFF = "diff"
DEFAULT_LEASE_SECONDS = 3600.0
APPEND_ROWS = 1 << 18  # rows per append into the transaction: few, large, durable puts
APPEND_BYTES = 32 << 20
TAIL_PARTITION_ROWS = 1 << 20  # WAL-tail rows per input partition
SPLIT_ROWS = 1 << 20  # a batch with more rows is read by several tasks (slices of its row groups)
TOKEN_ENV = "SEDIMENT_TOKEN"  # as sediment.net.protocol.TOKEN_ENV, without importing Flight here


# --- options --------------------------------------------------------------------------------


def _option(options: Any, key: str, what: str) -> str:
    value = options.get(key)
    if value is None or value == "":
        raise ValueError(f"the sediment data source needs option({key!r}, ...) ({what})")
    return str(value)


def _int_option(options: Any, key: str, default: int | None = None) -> int | None:
    value = options.get(key)
    if value is None or value == "":
        return default
    try:
        return int(str(value))
    except ValueError:
        raise ValueError(f"option {key!r} must be an integer, not {value!r}") from None


def _bool_option(options: Any, key: str) -> bool:
    value = str(options.get(key) or "false").strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no", ""):
        return False
    raise ValueError(f"option {key!r} must be true or false, not {value!r}")


def _token(options: Any) -> str:
    token = options.get("token") or os.environ.get(TOKEN_ENV)
    if not token:
        raise ValueError(f"the sediment data source needs option('token', ...) or ${TOKEN_ENV} on every worker")
    return str(token)


def _connect(uri: str, token: str) -> Any:
    """A client for one call site: opened inside read/write/commit, never pickled."""
    from sediment.client import connect

    return connect(uri, token)


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
    raise ValueError(f"a relation column of type {t} has no Spark type; read it with sediment.connect() instead")


def spark_schema(update_schema: pa.Schema, *, with_time: bool = True) -> StructType:
    """Spark's schema of a relation's updates (columns, ``time``, ``diff``)."""
    fields = [StructField(f.name, spark_type(f.type), True) for f in update_schema
              if f.name not in (TIME, DIFF)]
    if with_time:
        fields.append(StructField(TIME, LongType(), True))
    fields.append(StructField(DIFF, LongType(), True))
    return StructType(fields)


def _arrow_schema(schema: StructType) -> pa.Schema:
    """The exact Arrow schema Spark checks the batches ``read()`` yields against."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def _conform(table: pa.Table, target: pa.Schema) -> pa.Table:
    table = table.select(target.names)
    return table.cast(target) if not table.schema.equals(target) else table


# --- reading --------------------------------------------------------------------------------


@dataclass
class PlanInfo:
    """The part of a coordinator's read plan the executors need (small: pickled to each task)."""

    lease: int
    relation: str
    relation_id: int
    as_of: int
    from_t: int | None
    blob_uri: str
    s3_endpoint: str | None
    batches: list[dict]
    update_schema_b64: str

    @classmethod
    def of(cls, plan: Any, from_t: int | None) -> PlanInfo:
        schema = base64.b64encode(plan.update_schema.serialize().to_pybytes()).decode("ascii")
        return cls(plan.lease, plan.relation, plan.relation_id, plan.as_of, from_t, plan.blob_uri,
                   plan.s3_endpoint, list(plan.batches), schema)

    @property
    def update_schema(self) -> pa.Schema:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(self.update_schema_b64)))

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> PlanInfo:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class ReadSpec:
    """What every partition of one read needs besides its own data (Spark pickles the reader
    before it asks for partitions, so the plan travels in the partitions)."""

    relation_id: int
    as_of: int
    from_t: int | None
    blob_uri: str
    s3_endpoint: str | None

    @classmethod
    def of(cls, info: PlanInfo) -> ReadSpec:
        return cls(info.relation_id, info.as_of, info.from_t, info.blob_uri, info.s3_endpoint)


class BatchPartition(InputPartition):
    """A stored batch, or the ``part``-th of ``parts`` slices of its row groups, read by the
    executor straight from the blob store."""

    def __init__(self, spec: ReadSpec, ref: dict, part: int = 0, parts: int = 1) -> None:
        super().__init__((ref.get("key"), part))
        self.spec = spec
        self.ref = ref
        self.part = part
        self.parts = parts


def _batch_partitions(spec: ReadSpec, ref: dict, split_rows: int) -> list[InputPartition]:
    """Large batches are read by several tasks, each a contiguous run of row groups, so a
    trace merged into one big batch still reads in parallel (as Spark splits a Parquet file)."""
    parts = max(1, -(-int(ref.get("rows") or 0) // max(1, split_rows)))
    return [BatchPartition(spec, ref, i, parts) for i in range(parts)]


class TailPartition(InputPartition):
    """WAL-tail rows from the plan (Arrow IPC stream bytes)."""

    def __init__(self, spec: ReadSpec, ipc: bytes) -> None:
        super().__init__(len(ipc))
        self.spec = spec
        self.ipc = ipc


def _ipc_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _tail_partitions(spec: ReadSpec, tail: pa.Table) -> list[InputPartition]:
    return [TailPartition(spec, _ipc_bytes(tail.slice(i, TAIL_PARTITION_ROWS)))
            for i in range(0, tail.num_rows, TAIL_PARTITION_ROWS)]


_stores: dict[tuple[str, str | None], Any] = {}
_stores_lock = threading.Lock()


def _blob_store(blob_uri: str, s3_endpoint: str | None) -> Any:
    """One blob store per Python worker process and URI: Spark reuses workers across tasks,
    and an S3 client costs far more to build than a batch's first request."""
    from sediment.blob.uri import open_blob_store

    key = (blob_uri, s3_endpoint)
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = open_blob_store(blob_uri, s3_endpoint=s3_endpoint) \
                if blob_uri.startswith("s3://") else open_blob_store(blob_uri)
        return store


def _batch_tables(spec: ReadSpec, partition: BatchPartition) -> Iterator[pa.Table]:
    """The partition's row groups of its batch, opened once, with the footer checked against
    the plan's reference and every page checksum verified, as :meth:`TraceStore.read_stream` does."""
    from sediment.errors import BatchCorruption, BlobNotFound
    from sediment.trace.batch import open_stored, read_row_group
    from sediment.trace.state import BatchRef
    from sediment.trace.store import describe

    ref = BatchRef(**partition.ref)
    blobs = _blob_store(spec.blob_uri, spec.s3_endpoint)
    where = f"batch {ref.key!r}"
    try:
        blobs.size(ref.key)
    except BlobNotFound as e:
        raise BatchCorruption(f"{where} is gone from the blob store: the read plan's lease ended (released, or "
                              "expired after lease_seconds) and compaction replaced the batch; read again") from e
    pf, desc = open_stored(blobs, ref.key, describe(spec.relation_id, ref), expected_bytes=ref.bytes,
                           footer_crc=ref.footer_crc)
    groups = pf.num_row_groups
    for i in range(groups * partition.part // partition.parts, groups * (partition.part + 1) // partition.parts):
        yield read_row_group(pf, i, desc, where=where)


class SedimentReader(DataSourceReader):
    """Plans in the planning worker (``partitions``) and reads partitions on executors."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = dict(options)
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        given = self.options.get("plan")
        if given:  # planned on the driver by open_relation: the tail travels in an option
            info = PlanInfo.from_json(given)
            tail_b64 = self.options.get("plan_tail") or ""
            tail = pa.ipc.open_stream(pa.py_buffer(base64.b64decode(tail_b64))).read_all() if tail_b64 \
                else info.update_schema.empty_table()
        else:
            info, tail = plan_relation(self.options)
        spec = ReadSpec.of(info)
        split = _int_option(self.options, "split_rows", SPLIT_ROWS) or SPLIT_ROWS
        batches = [p for ref in info.batches if ref.get("key") for p in _batch_partitions(spec, ref, split)]
        return batches + _tail_partitions(spec, tail)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, BatchPartition | TailPartition):
            return  # Spark's placeholder partition for a plan with none
        spec = partition.spec
        target = _arrow_schema(self.schema)
        if isinstance(partition, TailPartition):
            tables: Iterator[pa.Table] = iter([pa.ipc.open_stream(pa.py_buffer(partition.ipc)).read_all()])
        else:
            tables = _batch_tables(spec, partition)
        for table in tables:
            lo, hi = pc.min_max(table.column(TIME)).values()
            if hi.as_py() > spec.as_of or (spec.from_t is not None and lo.as_py() <= spec.from_t):
                times = table.column(TIME)
                keep = pc.less_equal(times, spec.as_of)
                if spec.from_t is not None:
                    keep = pc.and_(keep, pc.greater(times, spec.from_t))
                table = table.filter(keep)
            yield from _conform(table, target).to_batches()


def plan_relation(options: Any) -> tuple[PlanInfo, pa.Table]:
    """Ask the coordinator for a read plan (options: uri, token, relation, as_of — default the
    sealed frontier — from, lease_seconds); returns the plan and its WAL-tail rows."""
    uri = _option(options, "uri", "the coordinator, grpc://HOST:PORT")
    relation = _option(options, "relation", "the relation to read")
    from_t = _int_option(options, "from")
    lease = float(options.get("lease_seconds") or DEFAULT_LEASE_SECONDS)
    with _connect(uri, _token(options)) as client:
        as_of = _int_option(options, "as_of")
        if as_of is None:
            as_of = client.sealed(relation)
        plan = client.plan_read(relation, as_of, from_t=from_t, lease_seconds=lease)
    return PlanInfo.of(plan, from_t), plan.tail


# --- writing --------------------------------------------------------------------------------


@dataclass
class SedimentCommitMessage(WriterCommitMessage):
    """What one task appended into the job's transaction."""

    rows: int = 0
    appends: int = 0
    min_time: int | None = None
    max_time: int | None = None
    partition: int | None = None
    txn: int | None = None  # the attempt's transaction (None: it wrote nothing)


class SedimentWriter(DataSourceArrowWriter):
    """Built once per job (driver side); only options, the relation's schema and the
    job's transaction group are pickled to the tasks and to commit/abort."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ValueError("the sediment data source only appends updates (retractions are diff -1 rows); "
                             "use .mode('append')")
        self.uri = _option(options, "uri", "the coordinator, grpc://HOST:PORT")
        self.token = _token(options)
        self.relation = _option(options, "relation", "the relation to append to")
        self.time = _int_option(options, "time")
        self.diff = _int_option(options, "diff")
        self.seal = _bool_option(options, "seal")
        self.batch_rows = _int_option(options, "batch_rows", APPEND_ROWS) or APPEND_ROWS
        columns = list(schema.names)
        if self.time is None and TIME not in columns:
            raise ValueError("the DataFrame has no 'time' column: add one or pass option('time', t)")
        if self.time is not None and TIME in columns:
            raise ValueError("the DataFrame has a 'time' column and option('time') is set too; use one")
        if self.diff is not None and DIFF in columns:
            raise ValueError("the DataFrame has a 'diff' column and option('diff') is set too; use one")
        with _connect(self.uri, self.token) as client:
            rel_schema = client.schema(self.relation)
            missing = [n for n in rel_schema.names if n not in columns]
            extra = [n for n in columns if n not in rel_schema.names and n not in (TIME, DIFF)]
            if missing or extra:
                raise ValueError(f"the DataFrame's columns {columns} do not match relation {self.relation!r} "
                                 f"{rel_schema.names}: " + "; ".join(
                                     ([f"missing {missing}"] if missing else []) +
                                     ([f"unknown {extra}"] if extra else [])))
            self.schema_b64 = base64.b64encode(rel_schema.serialize().to_pybytes()).decode("ascii")
        self.group = f"spark-job-{uuid.uuid4().hex}"

    def _update_schema(self) -> pa.Schema:
        rel = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(self.schema_b64)))
        return pa.schema([*rel, pa.field(TIME, pa.int64()), pa.field(DIFF, pa.int64())])

    def _updates(self, batch: pa.RecordBatch, target: pa.Schema) -> pa.Table:
        table = pa.Table.from_batches([batch])
        n = table.num_rows
        if self.time is not None:
            table = table.append_column(TIME, pa.array([self.time] * n, pa.int64()) if n < 1024 else
                                        pa.repeat(pa.scalar(self.time, pa.int64()), n))
        if DIFF not in table.column_names:
            table = table.append_column(DIFF, pa.repeat(pa.scalar(1 if self.diff is None else self.diff,
                                                                  pa.int64()), n))
        return _conform(table, target)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SedimentCommitMessage:
        from pyspark import TaskContext

        from sediment.client import RemoteTransaction

        ctx = TaskContext.get()
        target = self._update_schema()
        message = SedimentCommitMessage(partition=ctx.partitionId() if ctx is not None else None)
        pending: list[pa.Table] = []
        pending_rows = pending_bytes = 0
        with _connect(self.uri, self.token) as client:
            tx: RemoteTransaction | None = None

            def flush() -> None:
                nonlocal pending, pending_rows, pending_bytes, tx
                if not pending:
                    return
                table = pa.concat_tables(pending)
                lo, hi = pc.min_max(table.column(TIME)).values()
                if tx is None:  # one transaction per attempt: a retry's rows never mix with its
                    tx = client.transaction(group=self.group)  # predecessor's
                    message.txn = tx.id
                tx.append(self.relation, table)
                message.rows += table.num_rows
                message.appends += 1
                message.min_time = lo.as_py() if message.min_time is None else min(message.min_time, lo.as_py())
                message.max_time = hi.as_py() if message.max_time is None else max(message.max_time, hi.as_py())
                pending, pending_rows, pending_bytes = [], 0, 0

            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                table = self._updates(batch, target)
                pending.append(table)
                pending_rows += table.num_rows
                pending_bytes += table.nbytes
                if pending_rows >= self.batch_rows or pending_bytes >= APPEND_BYTES:
                    flush()
            flush()
        return message

    def commit(self, messages: list[SedimentCommitMessage | None]) -> None:
        done = [m for m in messages if m is not None]
        with _connect(self.uri, self.token) as client:
            client.commit_all([m.txn for m in done if m.txn is not None], group=self.group)
            if self.seal:
                t = self.time if self.time is not None else max(
                    (m.max_time for m in done if m.max_time is not None), default=None)
                if t is not None:
                    client.seal(self.relation, t)

    def abort(self, messages: list[SedimentCommitMessage | None]) -> None:
        with _connect(self.uri, self.token) as client:
            client.abort_group(self.group)


# --- the data source ------------------------------------------------------------------------


class SedimentDataSource(DataSource):
    """``format("sediment")``: see the module docstring for options and semantics."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        given = self.options.get("plan")
        if given:
            return spark_schema(PlanInfo.from_json(given).update_schema)
        uri = _option(self.options, "uri", "the coordinator, grpc://HOST:PORT")
        relation = _option(self.options, "relation", "the relation to read or write")
        with _connect(uri, _token(self.options)) as client:
            columns = client.schema(relation)
        return spark_schema(pa.schema([*columns, pa.field(TIME, pa.int64()), pa.field(DIFF, pa.int64())]))

    def reader(self, schema: StructType) -> SedimentReader:
        return SedimentReader(dict(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> SedimentWriter:
        return SedimentWriter(dict(self.options), schema, overwrite)


def register(spark: SparkSession) -> None:
    """Make ``format("sediment")`` available in ``spark`` (idempotent)."""
    spark.dataSource.register(SedimentDataSource)


# --- consolidation in Spark -----------------------------------------------------------------


def consolidate(updates: DataFrame, *, with_time: bool = False) -> DataFrame:
    """Sum the diffs of equal rows (of equal rows at equal times, ``with_time``) and drop the
    zero sums: a snapshot's consolidation (columns + diff), or a change log's (columns + time
    + diff). Runs as one Spark aggregation, so it scales with the cluster, not the driver."""
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
    changes in (from_t, as_of] (columns + time + diff). The read plan's lease expires after
    ``lease_seconds``; use :func:`open_relation` to release it as soon as you are done."""
    reader = _reader(spark, uri, relation, token).option("as_of", as_of).option("lease_seconds", lease_seconds)
    if from_t is not None:
        reader = reader.option("from", from_t)
    return consolidate(reader.load(), with_time=from_t is not None)


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
        raise ValueError(f"open_relation needs token=... or ${TOKEN_ENV}")
    options = {"uri": uri, "token": token, "relation": relation, "as_of": as_of, "lease_seconds": lease_seconds}
    if from_t is not None:
        options["from"] = from_t
    info, tail = plan_relation(options)
    try:
        tail_b64 = base64.b64encode(_ipc_bytes(tail)).decode("ascii") if tail.num_rows else ""
        df = (_reader(spark, uri, relation, token).option("plan", info.to_json())
              .option("plan_tail", tail_b64).load())
        yield consolidate(df, with_time=from_t is not None) if consolidated else df
    finally:
        with _connect(uri, token) as client:
            client.release_read(info.lease)
