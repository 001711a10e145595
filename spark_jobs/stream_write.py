"""Structured Streaming sink: ``df.writeStream.format("sediment")...start()``.

Every micro-batch is one sediment transaction, committed exactly once even when Spark runs
the batch again after a failure:

* each task attempt appends into its own server transaction (as batch writes do), in a
  group named after the sink, this run of the query and the task's stage, so a failed
  attempt's leftovers are aborted when its stage commits (the server then refuses new
  transactions in that group; a later run's stages, numbered from 0 again, get new groups);
* ``commit(messages, batchId)`` commits the winners' transactions together with one more
  transaction that records the batch in the sink's progress relation (``_spark_sink.<id>``:
  one row ``(batch, data_time)`` at time ``batch``, the previous batch's row retracted):
  one ``commit_all``, one COMMIT record, so the data and its progress mark are visible
  together or not at all;
* before committing, it reads the progress relation (every committed update, sealed or not);
  the last recorded batch again was committed before (Spark replays the last batch after a
  restart), so its new transactions are aborted instead, and only the seals that may not
  have happened yet are redone; an older batch means the checkpoint was reset while the
  sink's progress was kept, and is refused (TransactionError) rather than skipped. So is
  the last batch again when it comes from another Spark query (the progress row keeps the
  query id its tasks saw, which a restart from the checkpoint keeps and a reset checkpoint
  changes): a reset query's micro-batch 0 after a sink that committed only batch 0 would
  otherwise pass for a replay, and its rows be dropped without a word.

The sink's identity is its checkpoint location plus the relation (stable across restarts of
the query, as Spark's own query id is), or ``queryName`` without a checkpoint location.
Times come from a ``time`` column; without one, each micro-batch is written at the next
open time (sealed + 1, read by the tasks) and that time is sealed when the batch commits.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter
from pyspark.sql.types import StructType

from sediment.errors import InvalidArgument, RelationExists, TransactionError
from sediment.spark_jobs.batch_write import SedimentCommitMessage, WriterBase
from sediment.spark_jobs.job_commit import commit_job, seal_through
from sediment.spark_jobs.options import connect

PROGRESS_SCHEMA = pa.schema([("batch", pa.int64()), ("data_time", pa.int64()), ("query", pa.string())])
QUERY_ID = "sql.streaming.queryId"  # the local property Spark gives a streaming query's tasks


def sink_id(options: dict[str, str], relation: str) -> str:
    where = options.get("checkpointlocation") or options.get("queryname")
    if not where:
        raise InvalidArgument("a sediment stream sink needs option('checkpointLocation', ...) (or a queryName): "
                              "it names the query whose micro-batches are committed exactly once")
    return hashlib.sha256(f"{where}\0{relation}".encode()).hexdigest()[:24]


def last_committed(client: Any, progress: str) -> tuple[int, int, str | None]:
    """(last committed batch, its data time, the Spark query id that committed it, None when
    unknown), or (-1, -1, None): from every committed update."""
    net: dict[tuple[int, int, str | None], int] = {}
    for batch in client.replay(progress):
        t = pa.Table.from_batches([batch])
        queries = t.column("query").to_pylist() if "query" in t.column_names else [None] * t.num_rows
        for b, dt, q, d in zip(t.column("batch").to_pylist(), t.column("data_time").to_pylist(), queries,
                               t.column("diff").to_pylist(), strict=True):
            net[(b, dt, q)] = net.get((b, dt, q), 0) + d
    live = [k for k, v in net.items() if v > 0]
    return max(live, key=lambda k: (k[0], k[1])) if live else (-1, -1, None)


def progress_relation(client: Any, name: str) -> None:
    """Create the sink's progress relation, or give one made before it kept query ids the
    ``query`` column (older rows read it as null: their replays are told apart as before)."""
    try:
        client.add_relation(name, PROGRESS_SCHEMA)
    except RelationExists:
        if "query" not in client.schema(name).names:
            client.alter_relation(name, add=[pa.field("query", pa.string())])


def query_id() -> str | None:
    """The Spark query id this task runs for (None outside a streaming query's task)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.getLocalProperty(QUERY_ID) if ctx is not None else None


class SedimentStreamWriter(WriterBase, DataSourceStreamArrowWriter):
    """Built once per query; ``write`` runs in tasks, ``commit``/``abort`` per micro-batch."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise InvalidArgument("the sediment sink only appends updates: use outputMode('append')")
        with self._setup(options, schema, what="writing a stream") as client:
            self.sink = sink_id(options, self.relation)
            self.run = uuid.uuid4().hex[:12]  # Spark numbers stages from 0 in every application
            self.progress = f"_spark_sink.{self.sink}"
            progress_relation(client, self.progress)

    def _group(self) -> str:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        return f"spark-sink-{self.sink}-{self.run}-stage-{ctx.stageId() if ctx is not None else 0}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SedimentCommitMessage:
        time = self.time
        if time is None and not self.has_time:
            with connect(self.uri, self.token, self.relation) as client:
                time = client.sealed(self.relation) + 1
        message = self._write(iterator, self._group(), time)
        message.group = self._group()
        message.query = query_id()
        return message

    def commit(self, messages: list[SedimentCommitMessage | None], batchId: int) -> None:  # noqa: N803
        done = [m for m in messages if m is not None]
        groups = sorted({getattr(m, "group", "") for m in done} - {""})
        with connect(self.uri, self.token, self.relation) as client:
            last, last_time, last_query = last_committed(client, self.progress)
            query = next((m.query for m in done if getattr(m, "query", None)), None)
            if batchId <= last:
                for g in groups:
                    client.abort_group(g)
                other = batchId == last and query is not None and last_query is not None and query != last_query
                if batchId < last or other:  # Spark replays only its last batch, in the same query
                    raise TransactionError(
                        f"micro-batch {batchId} {'is older than' if batchId < last else 'of another query repeats'} "
                        f"batch {last}, the last one this sink committed to {self.relation!r} (progress relation "
                        f"{self.progress!r}): the query's checkpoint was reset or reused; give the new query its "
                        "own checkpointLocation")
                self._seal(client, last, last_time)  # a replay of the committed batch: keep the first
                return
            data_time = self._data_time(done)
            marker = client.transaction()
            rows = [(batchId, data_time, query, batchId, 1)] + (
                [(last, last_time, last_query, batchId, -1)] if last >= 0 else [])
            marker.append(self.progress, pa.table({
                "batch": pa.array([r[0] for r in rows], pa.int64()), "data_time": pa.array([r[1] for r in rows], pa.int64()),
                "query": pa.array([r[2] for r in rows], pa.string()),
                "time": pa.array([r[3] for r in rows], pa.int64()), "diff": pa.array([r[4] for r in rows], pa.int64())}))
            commit_job(lambda: connect(self.uri, self.token, self.relation),
                       [*(m.txn for m in done if m.txn is not None), marker.id], group=None, relation=self.relation,
                       job=f"micro-batch {batchId} of sink {self.progress}")
            for g in groups:
                client.abort_group(g)
            self._seal(client, batchId, data_time)

    def _data_time(self, done: list[SedimentCommitMessage]) -> int:
        if self.has_time:
            return max((m.max_time for m in done if m.max_time is not None), default=-1)
        times = {t for m in done for t in (m.min_time, m.max_time) if t is not None}
        if len(times) > 1:
            raise TransactionError(f"the tasks of one micro-batch wrote relation {self.relation!r} at times "
                                   f"{sorted(times)}: something else sealed it meanwhile; the batch is retried")
        return times.pop() if times else -1

    def _seal(self, client: Any, batch: int, data_time: int) -> None:
        """Seal what a committed batch closes (idempotent: redone after a restart)."""
        if client.sealed(self.progress) < batch:
            client.seal(self.progress, batch)
            client.set_since(self.progress, batch)
        if data_time >= 0 and (self.seal or not self.has_time):
            seal_through(client, self.relation, data_time)

    def abort(self, messages: list[SedimentCommitMessage | None], batchId: int) -> None:  # noqa: N803
        with connect(self.uri, self.token, self.relation) as client:
            for g in sorted({getattr(m, "group", "") for m in messages if m is not None} - {""}):
                client.abort_group(g)
