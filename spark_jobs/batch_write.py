"""Batch writes of the ``sediment`` data source (``df.write`` and SQL ``INSERT INTO``).

The DataFrame has the relation's columns, plus ``time`` (or ``option("time", t)``; with
neither, the next open time: sealed + 1) and optionally ``diff`` (or ``option("diff", d)``;
default +1, also for a null diff). The whole job commits as one, so a failed or aborted
job leaves nothing visible, and a retried or speculative task attempt never duplicates rows:

* the writer is built once, in a Python worker the driver starts: it checks the options
  and the columns against the relation and names the job's transaction group (a random
  id); only options and that name are pickled into the writer (no clients or locks travel);
* each task attempt connects, begins its own server transaction in the group, streams its
  Arrow batches into it (durable but invisible) and returns the transaction's id with how
  many rows and which times it wrote;
* ``commit()`` (another Python worker) commits the transactions of the attempts Spark chose,
  all with one COMMIT record (``commit_all``), aborts the group's other transactions, then
  seals the time when ``seal`` is set; ``abort()`` aborts the whole group.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from sediment.arrow_codec import schema_from_text, schema_to_text
from sediment.errors import InvalidArgument, SchemaMismatch, TimeAlreadySealed
from sediment.spark_jobs.job_commit import commit_job, seal_through
from sediment.spark_jobs.options import (
    BATCH_READ,
    DIFF,
    STREAM_READ,
    TIME,
    arrow_schema,
    bool_option,
    check_options,
    connect,
    diff_option,
    int_option,
    required,
    token,
    writes_into,
)

APPEND_ROWS = 1 << 18  # rows per append into the transaction: few, large, durable puts
APPEND_BYTES = 32 << 20
READ_ONLY = [k for k in (*BATCH_READ, *STREAM_READ) if k not in ("lease_seconds",)]


@dataclass
class SedimentCommitMessage(WriterCommitMessage):
    """What one task appended into the job's transaction."""

    rows: int = 0
    appends: int = 0
    min_time: int | None = None
    max_time: int | None = None
    partition: int | None = None
    txn: int | None = None  # the attempt's transaction (None: it wrote nothing)
    group: str | None = None  # the stream sink's transaction group of the attempt
    query: str | None = None  # the stream sink's Spark query id (stable across restarts of its checkpoint)


def omitted(client: Any, relation: str, rel_schema: pa.Schema, schema: StructType) -> dict[str, Any]:
    """The relation's columns the DataFrame leaves out that an append may leave out (added by
    an alter: the engine fills them, trace/evolve.py ``Layout.optional``), each with its
    default as ``describe`` shows it (None: null). Asks the engine only when one is missing."""
    missing = [n for n in rel_schema.names if n not in schema.names]
    if not missing:
        return {}
    columns = {c["name"]: c for c in client.describe(relation)["columns"]}
    return {n: columns[n]["default"] for n in missing if n in columns and not columns[n].get("required", True)}


def check_columns(relation: str, rel_schema: pa.Schema, schema: StructType, optional: Any = ()) -> None:
    """The DataFrame's columns against the relation's, by name and by kind (``writes_into``),
    where Spark plans: a string into an integer column fails here, in one line, before any
    task runs, not in a task's cast with Arrow's text. Columns in ``optional`` (added by an
    alter) may be missing; the relation's first columns may not."""
    columns = list(schema.names)
    missing = [n for n in rel_schema.names if n not in columns and n not in optional]
    extra = [n for n in columns if n not in rel_schema.names and n not in (TIME, DIFF)]
    if missing or extra:
        raise SchemaMismatch(f"the DataFrame's columns {columns} do not match relation {relation!r} "
                             f"{rel_schema.names}: " + "; ".join(
                                 ([f"missing {missing} (required: only columns added by an alter may be "
                                   "left out)"] if missing else []) +
                                 ([f"unknown {extra}"] if extra else [])))
    target = {**{f.name: f.type for f in rel_schema}, TIME: pa.int64(), DIFF: pa.int64()}
    wrong = [f"{f.name!r} is {f.dataType.simpleString()}, the relation's is {target[f.name]}"
             for f in schema.fields if not writes_into(f.dataType, target[f.name])]
    if wrong:
        raise SchemaMismatch(f"the DataFrame's column types do not fit relation {relation!r}: {'; '.join(wrong)}; "
                             "cast those columns first (for example F.col(name).cast(...)) or fix the relation")


def merge_schema(client: Any, relation: str, rel_schema: pa.Schema, schema: StructType) -> pa.Schema:
    """``option("mergeSchema", "true")``: the DataFrame's columns the relation lacks are added to
    it (nullable, in the DataFrame's Arrow types) by one alter, before anything is written; the
    relation's schema after it. Without the option such columns are refused at planning."""
    extra = [f for f in schema.fields if f.name not in rel_schema.names and f.name not in (TIME, DIFF)]
    if not extra:
        return rel_schema
    client.alter_relation(relation, add=[pa.field(f.name, f.type) for f in arrow_schema(StructType(extra))])
    return client.schema(relation)


class WriterBase:
    """Checks and task-side appending shared by the batch writer and the stream writer."""

    def _setup(self, options: dict[str, str], schema: StructType, *, what: str) -> Any:
        check_options(options, refused=READ_ONLY, what=what)
        if bool_option(options, "bulk"):
            raise InvalidArgument("option('bulk', 'true') needs sediment.spark_jobs.register(spark) in this session "
                                  "(it routes df.write...save() to Spark's Parquet writer); SQL and streams write rows")
        self.uri = required(options, "uri")
        self.token = token(options)
        self.relation = required(options, "relation")
        self.time = int_option(options, "time")
        self.diff = diff_option(options)
        self.seal = bool_option(options, "seal")
        self.batch_rows = int_option(options, "batch_rows", APPEND_ROWS) or APPEND_ROWS
        columns = list(schema.names)
        if self.time is not None and TIME in columns:
            raise InvalidArgument("the DataFrame has a 'time' column and option('time') is set too; use one")
        if self.diff is not None and DIFF in columns:
            raise InvalidArgument("the DataFrame has a 'diff' column and option('diff') is set too; use one")
        self.has_time = TIME in columns
        client = connect(self.uri, self.token, self.relation)
        try:
            rel_schema = client.schema(self.relation)
            if bool_option(options, "mergeschema"):
                rel_schema = merge_schema(client, self.relation, rel_schema, schema)
            check_columns(self.relation, rel_schema, schema, omitted(client, self.relation, rel_schema, schema))
            # the columns the tasks send: those left out are filled by the engine's append
            self.schema_b64 = schema_to_text(pa.schema([f for f in rel_schema if f.name in schema.names]))
            if self.time is not None:
                sealed = client.sealed(self.relation)
                if self.time <= sealed:
                    raise TimeAlreadySealed(f"relation {self.relation!r} is sealed through time {sealed}: "
                                            f"option('time', {self.time}) can never commit; write at a later time")
        except BaseException:
            client.close()
            raise
        return client

    def _update_schema(self) -> pa.Schema:
        rel = schema_from_text(self.schema_b64)
        return pa.schema([*rel, pa.field(TIME, pa.int64()), pa.field(DIFF, pa.int64())])

    def _updates(self, batch: pa.RecordBatch, target: pa.Schema, time: int | None) -> pa.RecordBatch:
        """The batch as the relation's updates, column by column: Spark's columns are taken
        as they are (cast only where the type differs, not for nullability alone), time and
        diff filled from slices of one constant array, so a batch costs no copy of its data."""
        n = batch.num_rows
        names = batch.schema.names
        columns = []
        for field in target:
            if field.name in names:
                column = batch.column(names.index(field.name))
                if field.name == DIFF and column.null_count:
                    column = pc.fill_null(column, pa.scalar(1, column.type))
                columns.append(column if column.type == field.type else self._cast(column, field))
            else:
                columns.append(self._constant(field.name, time if field.name == TIME else
                                              (1 if self.diff is None else self.diff), n))
        return pa.RecordBatch.from_arrays(columns, schema=target)

    def _cast(self, column: pa.Array, field: pa.Field) -> pa.Array:
        """The cast of a column whose kind was checked while Spark planned, which a value can
        still fail (-1 into an unsigned column): sediment's one-line error instead of Arrow's."""
        try:
            return column.cast(field.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SchemaMismatch(f"relation {self.relation!r} column {field.name!r}: a value of the DataFrame's "
                                 f"{column.type} column does not fit {field.type} ({first}); nothing of this "
                                 "job is visible; fix or filter those rows") from None

    def _constant(self, name: str, value: int | None, n: int) -> pa.Array:
        cache = self.__dict__.setdefault("_constants", {})
        held = cache.get(name)
        if held is None or held[0] != value or len(held[1]) < n:
            held = cache[name] = (value, pa.repeat(pa.scalar(value, pa.int64()), max(n, 1 << 16)))
        return held[1].slice(0, n)

    def _write(self, iterator: Iterator[pa.RecordBatch], group: str, time: int | None) -> SedimentCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        target = self._update_schema()
        message = SedimentCommitMessage(partition=ctx.partitionId() if ctx is not None else None)
        pending: list[pa.RecordBatch] = []
        pending_rows = pending_bytes = 0
        in_flight: Future | None = None  # one append travels while the next one is gathered
        with connect(self.uri, self.token, self.relation) as client, ThreadPoolExecutor(1, "sediment-append") as sender:
            tx: Any = None

            def flush() -> None:
                nonlocal pending, pending_rows, pending_bytes, tx, in_flight
                if not pending:
                    return
                table = pa.Table.from_batches(pending, schema=target)
                lo, hi = pc.min_max(table.column(TIME)).values()
                if tx is None:  # one transaction per attempt: a retry's rows never mix with its
                    tx = client.transaction(group=group)  # predecessor's
                    message.txn = tx.id
                if in_flight is not None:
                    in_flight.result()
                in_flight = sender.submit(tx.append, self.relation, table)
                message.rows += table.num_rows
                message.appends += 1
                message.min_time = lo.as_py() if message.min_time is None else min(message.min_time, lo.as_py())
                message.max_time = hi.as_py() if message.max_time is None else max(message.max_time, hi.as_py())
                pending, pending_rows, pending_bytes = [], 0, 0

            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                table = self._updates(batch, target, time)
                pending.append(table)
                pending_rows += table.num_rows
                pending_bytes += table.nbytes
                if pending_rows >= self.batch_rows or pending_bytes >= APPEND_BYTES:
                    flush()
            flush()
            if in_flight is not None:
                in_flight.result()  # durable before the task reports its transaction
        return message


class SedimentWriter(WriterBase, DataSourceArrowWriter):
    """Built once per job (driver side); only options, the relation's schema and the
    job's transaction group are pickled to the tasks and to commit/abort."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise InvalidArgument("the sediment data source only appends updates (retractions are diff -1 rows); "
                                  "use .mode('append') or INSERT INTO")
        with self._setup(options, schema, what="writing") as client:
            self.open_time: int | None = None
            if self.time is None and not self.has_time:  # the next open time, fixed for the whole job
                self.open_time = client.sealed(self.relation) + 1
        self.group = f"spark-job-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SedimentCommitMessage:
        return self._write(iterator, self.group, self.time if self.time is not None else self.open_time)

    def commit(self, messages: list[SedimentCommitMessage | None]) -> None:
        done = [m for m in messages if m is not None]
        commit_job(lambda: connect(self.uri, self.token, self.relation), [m.txn for m in done if m.txn is not None],
                   group=self.group, relation=self.relation)
        with connect(self.uri, self.token, self.relation) as client:
            if self.seal:
                fixed = self.time if self.time is not None else self.open_time
                t = fixed if fixed is not None else max(
                    (m.max_time for m in done if m.max_time is not None), default=None)
                if t is not None:
                    seal_through(client, self.relation, t)

    def abort(self, messages: list[SedimentCommitMessage | None]) -> None:
        with connect(self.uri, self.token, self.relation) as client:
            client.abort_group(self.group)
