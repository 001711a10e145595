"""A bulk load's files put into an S3 blob store by Spark's tasks themselves.

Why: Spark's own Parquet writer reaches only the file systems Spark has, and this build has
no S3 one, so a coordinator whose batches are in S3 (every partition of an S3-only cluster)
stages a load under a key prefix instead of a directory (engine/staging_area.py). The frame
is then written through the data source with the internal option ``staged_in`` (the
prefix): each task's :class:`StagedWriter` writes its partition's rows as one Parquet object
named by the partition, so a retried or speculative attempt replaces the object an earlier
attempt put instead of adding one, and the commit, which lists the prefix, finds each
partition once. A task writes its object even when it has no rows, so an empty retry also
replaces what a failed attempt left. A task that finds the load's marker gone after its PUT
(the job failed and the driver aborted the load while this task still ran, or the load was
committed or swept) deletes its object, which the abort's listing may have missed. The rows cross from the JVM to Python as Arrow batches
(the hand-off the file path avoids), are cast to the relation's Arrow types, and reach S3
with the options' credentials, as the executors' reads of batches do.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from sediment.arrow_codec import schema_from_text, schema_to_text
from sediment.engine.staging_area import MARKER
from sediment.errors import BlobNotFound, SchemaMismatch
from sediment.spark_jobs.batch_read import credentials_of
from sediment.spark_jobs.options import DIFF, FORMAT, TIME, conform

STAGED_IN = "staged_in"  # internal options of the write bulk_load runs
STAGED_SCHEMA = "staged_schema"


def staged_in_s3(location: str) -> bool:
    """Whether ``bulk_stage``'s answer is an S3 prefix (else a local directory)."""
    return location.startswith("s3://")


def target_schema(schema: StructType, rel_schema: pa.Schema) -> pa.Schema:
    """The Arrow schema of the files written from a frame of ``schema``: its columns in its
    order, each of the relation's in the relation's type, ``time`` and ``diff`` as int64,
    every one nullable (the update schema when the frame is the relation's updates; a frame
    written as it is may have any order and nullability)."""
    types = {f.name: f.type for f in rel_schema}
    return pa.schema([pa.field(f.name, pa.int64() if f.name in (TIME, DIFF) else types[f.name], True)
                      for f in schema.fields])


def write_staged(frame: DataFrame, location: str, target: pa.Schema, options: Mapping[str, str]) -> None:
    """Have every task of ``frame`` put its rows under ``location``
    (``s3://BUCKET/KEYS/[?endpoint=URL]``) as ``part-<partition>.parquet``."""
    given = {"relation": options["relation"], STAGED_IN: location, STAGED_SCHEMA: schema_to_text(target),
             **{k: v for k, v in options.items() if k.startswith("aws_")}}
    frame.write.format(FORMAT).options(**given).mode("append").save()


class StagedWriter(DataSourceArrowWriter):
    """The data source's writer when ``staged_in`` is given (see the module doc): only the
    prefix, the files' schema and the credentials are pickled to the tasks."""

    def __init__(self, options: Mapping[str, str]) -> None:
        parts = urlsplit(options[STAGED_IN])
        self.bucket, self.keys = parts.netloc, parts.path.lstrip("/")
        self.endpoint = parse_qs(parts.query).get("endpoint", [None])[0]
        self.target = options[STAGED_SCHEMA]
        self.credentials = credentials_of(options)
        self.relation = options.get("relation")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from pyspark import TaskContext

        self.put_part(iterator, TaskContext.get().partitionId())
        return WriterCommitMessage()

    def put_part(self, batches: Iterator[pa.RecordBatch], partition: int) -> str:
        """Put partition ``partition``'s rows as its one object (replacing an earlier attempt's); its key."""
        from sediment.spark_jobs.batch_read import blob_store

        target = schema_from_text(self.target)
        sink = pa.BufferOutputStream()
        with pq.ParquetWriter(sink, target, compression="snappy") as out:
            for batch in batches:
                try:
                    out.write_table(conform(pa.Table.from_batches([batch]), target))
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                    raise SchemaMismatch(f"bulk load of relation {self.relation!r}: a value of the DataFrame does not "
                                         f"fit the relation's columns {target.names} ({first}); nothing of this job is "
                                         "visible; fix or filter those rows") from None
        key = f"{self.keys}part-{partition:05d}.parquet"
        store = blob_store(f"s3://{self.bucket}", self.endpoint, self.credentials)
        store.put(key, sink.getvalue().to_pybytes())
        try:
            store.size(self.keys + MARKER)
        except BlobNotFound:  # aborted, committed or swept meanwhile: its clean-up may have missed this object
            store.delete(key)
        return key

    def commit(self, messages: list[Any]) -> None:
        """Nothing: the driver's bulk_load commits the load once the job is done."""

    def abort(self, messages: list[Any]) -> None:
        """Nothing: the driver's bulk_load aborts the load (deleting the prefix)."""
