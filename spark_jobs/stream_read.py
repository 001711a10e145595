"""Structured Streaming source: ``spark.readStream.format("sediment")...load()``.

Offsets are sealed times, ``{"time": t, "snapshot": bool}``. The first micro-batch (from the
initial offset, ``snapshot`` true) holds the consolidated snapshot as of the starting time,
every row at that time; each later one, from offset ``a`` to ``b``, the relation's
consolidated changes at times in (a.time, b.time], each row with its ``time`` and ``diff``.

* ``startingAsOf``: ``earliest`` (the compaction frontier, since), ``latest`` (the sealed
  frontier when the query first starts; the default), or a time in [since, sealed].
* ``maxTimesPerTrigger``: a micro-batch spans at most this many times (b.time - a.time).
* A query restarted from its checkpoint continues from the checkpointed offset: the data at
  sealed times never changes, so a replayed micro-batch reads the same rows (no gap, no
  duplicate). If compaction moved ``since`` past that offset meanwhile, the read fails with
  AsOfOutOfRange rather than skip changes.
* ``trigger(availableNow=True)``: reads up to the sealed frontier as of the query's start.

Spark asks a data source for its schema without saying whether a stream or a batch read
wants it, and a batch ``load()`` is columns + diff; so in sessions where
``sediment.spark_jobs.register(spark)`` ran, ``readStream`` adds the internal option
``readStream`` (datasource.py ``_mark_stream_reads``), and elsewhere a stream read names one of
its own options (``startingAsOf`` or ``maxTimesPerTrigger``); the source then gives columns +
time + diff. Each micro-batch's read plan holds a lease, released when Spark commits the batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from sediment.errors import AsOfOutOfRange, InvalidArgument, SchemaMismatch
from sediment.spark_jobs.batch_read import (
    MAX_TAIL_PARTS,
    SPLIT_ROWS,
    TAIL_SPLIT_ROWS,
    PlanInfo,
    ScanPartition,
    credentials_of,
    held_tail,
    plan_partitions,
    read_partition,
)
from sediment.spark_jobs.options import (
    DEFAULT_LEASE_SECONDS,
    TIME,
    arrow_schema,
    check_options,
    connect,
    int_option,
    required,
)

STREAM_LEASE_SECONDS = 600.0


def starting_time(spec: str, since: int, sealed: int, relation: str) -> int:
    """The time ``startingAsOf`` names, checked against [since, sealed]."""
    spec = (spec or "latest").strip().lower()
    if spec == "earliest":
        return since
    if spec == "latest":
        return sealed
    try:
        t = int(spec)
    except ValueError:
        raise InvalidArgument(f"option startingAsOf must be earliest, latest or a time, not {spec!r}") from None
    if not since <= t <= sealed:
        raise AsOfOutOfRange(f"relation {relation!r}: startingAsOf={t} is outside [since {since}, sealed {sealed}]")
    return t


def next_end(start: int, target: int, max_times: int | None) -> int:
    """The end of the next micro-batch: the target, at most ``max_times`` past the start."""
    end = max(start, target)
    return min(end, start + max_times) if max_times else end


class SedimentStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Lives in one Python worker for the query's life: offsets and planning; tasks read."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        check_options(options, refused=("asof", "as_of", "from", "raw", "plan", "plan_tail"),
                      what="reading a stream (use startingAsOf)")
        if TIME not in schema.names:
            raise InvalidArgument("this session did not run sediment.spark_jobs.register(spark), so a stream read of "
                                  "sediment needs option('startingAsOf', 'latest' | 'earliest' | t): Spark does not "
                                  "tell a data source's schema() whether a stream or a batch asks")
        self.options = options
        self.schema = schema
        self.relation = required(options, "relation")
        self.max_times = int_option(options, "maxtimespertrigger")
        if self.max_times is not None and self.max_times < 1:
            raise InvalidArgument(f"option maxTimesPerTrigger must be >= 1, not {self.max_times}")
        self.split_rows = int_option(options, "split_rows", SPLIT_ROWS) or SPLIT_ROWS
        self.lease_seconds = float(options.get("lease_seconds") or STREAM_LEASE_SECONDS)
        self.until: int | None = None  # availableNow: the sealed frontier when it was asked for
        self.leases: list[tuple[int, int]] = []  # (end time, lease) of planned micro-batches
        with connect(options) as client:
            self.schema_version = client.schema_version(self.relation)  # the columns this query was planned with
            self._start = starting_time(options.get("startingasof") or "latest", client.since(self.relation),
                                        client.sealed(self.relation), self.relation)

    def initialOffset(self) -> dict:  # noqa: N802 - Spark's names from here on
        return {"time": self._start, "snapshot": self._start >= 0}

    def _sealed(self) -> int:
        with connect(self.options) as client:
            return client.sealed(self.relation)

    def getDefaultReadLimit(self) -> Any:
        return ReadMaxFiles(self.max_times) if self.max_times else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: Any) -> dict:
        if start.get("snapshot"):  # the first micro-batch is the snapshot alone
            return {"time": int(start["time"]), "snapshot": False}
        target = self._sealed() if self.until is None else self.until
        max_times = limit.max_files if isinstance(limit, ReadMaxFiles) else None
        end = next_end(int(start["time"]), target, max_times)
        if end == int(start["time"]) and not start.get("snapshot"):
            return start
        return {"time": end, "snapshot": False}

    def reportLatestOffset(self) -> dict:
        return {"time": self._sealed(), "snapshot": False}

    def prepareForTriggerAvailableNow(self) -> None:
        self.until = self._sealed()

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        a, b = int(start["time"]), int(end["time"])
        out: list[InputPartition] = []
        credentials = credentials_of(self.options)
        with connect(self.options) as client:
            if start.get("snapshot") and a >= 0:
                out += self._plan(client, a, None, "snapshot", b, credentials)
            if b > a:
                frm = a if a >= 0 else None  # a relation never sealed when the query started: all of it
                out += self._plan(client, b, frm, "changes", b, credentials)
        return out

    def _plan(self, client: Any, as_of: int, frm: int | None, mode: str, end: int,
              credentials: tuple[tuple[str, str], ...]) -> list[InputPartition]:
        """One leased plan's partitions; a large WAL tail stays on the coordinator and the
        tasks fetch their parts (as batch reads do)."""
        plan, held, cuts = client.plan_read_held(self.relation, as_of, from_t=frm, lease_seconds=self.lease_seconds,
                                                 part_rows=min(self.split_rows, TAIL_SPLIT_ROWS),
                                                 max_parts=MAX_TAIL_PARTS)
        self.leases.append((end, plan.lease))
        version = plan.schema_history["versions"][-1]["version"] if plan.schema_history else 0
        if version != self.schema_version:  # Spark fixes a stream's schema when the query starts
            raise SchemaMismatch(f"relation {self.relation!r} was altered to schema version {version} after this "
                                 f"query started (version {self.schema_version}): restart the query; it goes on "
                                 "from its checkpoint, this micro-batch included, in the new columns")
        return plan_partitions(PlanInfo.of(plan, frm), plan.tail, mode, [], self.split_rows, credentials,
                               held_tail(self.relation, plan.lease, held, cuts))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, ScanPartition):
            yield from read_partition(partition, arrow_schema(self.schema), self.options)

    def commit(self, end: dict) -> None:
        self._release(int(end["time"]))

    def stop(self) -> None:
        self._release(None)

    def _release(self, through: int | None) -> None:
        done = [(t, lease) for t, lease in self.leases if through is None or t <= through]
        if not done:
            return
        self.leases = [x for x in self.leases if x not in done]
        try:
            with connect(self.options) as client:
                for _, lease in done:
                    client.release_read(lease)
        except Exception:  # noqa: BLE001 - a lease not released expires after lease_seconds
            pass


__all__ = ["SedimentStreamReader", "DEFAULT_LEASE_SECONDS"]
